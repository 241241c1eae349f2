package postgres_test

import (
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/taskgate/workers/sqlstore/internal/sqlcore"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// A replica that starts while another migrates (a rolling deploy) waits
// for that migration to end, however long it takes, and then finds the
// tables current: the limits its connections carry for the
// application's statements (a role's or a connection string's
// statement_timeout or lock_timeout) do not cut the wait off, which
// would fail the replica's start (statement_timeout), or give up its
// place behind the migration and leave it sleeping in backoff after the
// migration ended (lock_timeout).
func TestMigrateWaitsForAConcurrentMigrationWhateverTheSessionTimeouts(t *testing.T) {
	t.Parallel()
	for _, setting := range []string{"", "statement_timeout", "lock_timeout"} {
		t.Run("setting="+setting, func(t *testing.T) {
			t.Parallel()
			sc := newScratchT(t)
			ctx := t.Context()
			s := sc.store(t)
			app := "workers-migrate-" + strings.ToLower(rand.Text())
			params := map[string]string{"application_name": app}
			if setting != "" {
				params[setting] = "100ms"
			}
			replica := sc.ownStore(t, params)
			other, err := sc.pool.Begin(ctx) // a concurrent migration's transaction
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = other.Rollback(context.Background()) }()
			if _, err := other.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, sqlcore.MigrationLockKey(postgres.Core(s))); err != nil {
				t.Fatal(err)
			}
			migrated := make(chan error, 1)
			go func() { migrated <- replica.Migrate(ctx) }()
			// One wait for the lock, outlasting a setting's 100 ms.
			waitMigrateWaiting(t, sc, migrated, app, "wait_event = 'advisory'", "a concurrent migration held the lock")
			if err := other.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-migrated; err != nil {
				t.Fatalf("Migrate once the concurrent migration ended: %v", err)
			}
		})
	}
}

// A migration's statements are not cut off by the statement_timeout its
// connections carry for the application's statements: here version 5's
// DROP INDEX, which waits for an older replica's transaction to release
// the tasks table, as it would for any wait or long index build.
func TestMigrateIgnoresTheSessionStatementTimeout(t *testing.T) {
	t.Parallel()
	sc := newScratchT(t)
	ctx := t.Context()
	old := sc.ownStore(t, nil)
	if err := sqlcore.MigrateTo(ctx, postgres.Core(old), 4); err != nil {
		t.Fatal(err)
	}
	holder, err := sc.pool.Begin(ctx) // an older replica's transaction
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(context.Background()) }()
	if _, err := holder.Exec(ctx, `SELECT count(*) FROM "`+sc.schema+`".workers_tasks`); err != nil {
		t.Fatal(err)
	}
	app := "workers-migrate-" + strings.ToLower(rand.Text())
	s := sc.ownStore(t, map[string]string{"statement_timeout": "100ms", "application_name": app})
	migrated := make(chan error, 1)
	go func() { migrated <- s.Migrate(ctx) }()
	// DROP INDEX waits for the table past the 100 ms.
	waitMigrateWaiting(t, sc, migrated, app, "wait_event_type = 'Lock'", "its DROP INDEX waited for the table")
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-migrated; err != nil {
		t.Fatalf("Migrate once the table was free: %v", err)
	}
}

// A migration that deadlocks with an older replica's transaction during
// a rollout is tried again, as one that waited too long for a lock is,
// rather than failing the new replica's start: here version 4 alters
// the watchers table, then waits to index the tasks table, in which the
// transaction inserted a task, and the transaction goes on to insert
// the task's watcher. The database cancels the migration's statement
// to break the cycle (the migration's deadlock_timeout is the shorter).
func TestMigrateTriesAgainAfterADeadlock(t *testing.T) {
	t.Parallel()
	sc := newScratchT(t)
	ctx := t.Context()
	old := sc.ownStore(t, nil)
	if err := sqlcore.MigrateTo(ctx, postgres.Core(old), 3); err != nil {
		t.Fatal(err)
	}
	writer, err := sc.pool.Begin(ctx) // an older replica's insert of a task and its watcher
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = writer.Rollback(context.Background()) }()
	for _, q := range []string{
		`SET LOCAL deadlock_timeout = '1min'`,
		`INSERT INTO "` + sc.schema + `".workers_tasks (id, run_id, status) VALUES ('u::x', 'r', 'pending')`,
	} {
		if _, err := writer.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	app := "workers-migrate-" + strings.ToLower(rand.Text())
	s := sc.ownStore(t, map[string]string{"deadlock_timeout": "500ms", "application_name": app})
	migrated := make(chan error, 1)
	go func() { migrated <- s.Migrate(ctx) }()
	waitFor(t, func() bool { // the migration holds the watchers table and waits for the tasks table
		var n int
		err := sc.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&n)
		return err == nil && n > 0
	})
	// Waits for the migration until the database cancels the migration's
	// statement.
	if _, err := writer.Exec(ctx, `INSERT INTO "`+sc.schema+`".workers_watchers (task_id, user_id) VALUES ('u::x', 'u')`); err != nil {
		t.Fatal(err)
	}
	if err := writer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-migrated; err != nil {
		t.Fatalf("Migrate after a deadlock with a replica's transaction: %v", err)
	}
}

// Migrate's wait for a concurrent migration, which no timeout of the
// session bounds, ends with its context, with the context's error.
func TestMigrateWaitingForAConcurrentMigrationEndsWithItsContext(t *testing.T) {
	t.Parallel()
	sc := newScratchT(t)
	s := sc.store(t)
	other, err := sc.pool.Begin(t.Context()) // a concurrent migration's transaction
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Rollback(context.Background()) }()
	if _, err := other.Exec(t.Context(), `SELECT pg_advisory_xact_lock($1)`, sqlcore.MigrationLockKey(postgres.Core(s))); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = sc.ownStore(t, nil).Migrate(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Migrate behind a concurrent migration, its context ended = %v, want context.DeadlineExceeded", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Migrate returned %v after its context's 200 ms", took)
	}
}

// waitMigrateWaiting waits until a statement of the connections named
// app has waited over 500 ms as waiting (a condition on
// pg_stat_activity) says, failing if the Migrate whose result comes on
// migrated returns first, while what.
func waitMigrateWaiting(t *testing.T, sc scratch, migrated <-chan error, app, waiting, what string) {
	t.Helper()
	waitFor(t, func() bool {
		select {
		case err := <-migrated:
			t.Fatalf("Migrate returned while %s: %v", what, err)
		default:
		}
		var n int
		err := sc.pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
WHERE application_name = $1 AND `+waiting+` AND clock_timestamp() - query_start > interval '500 ms'`, app).Scan(&n)
		return err == nil && n > 0
	})
}
