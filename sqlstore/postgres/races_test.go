package postgres_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// waitLockWaiters waits until at least n statements on sc's schema wait
// for a lock.
func waitLockWaiters(t *testing.T, sc scratch, n int) {
	t.Helper()
	waitFor(t, func() bool {
		var c int
		err := sc.pool.QueryRow(t.Context(),
			`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`, sc.schema).Scan(&c)
		return err == nil && c >= n
	})
}

// holdWatcherRow locks the watcher rows of task id in a transaction of
// its own, which a ReplaceTask of id then waits for after it updated
// the task's row, holding that row's lock, as any replace in flight does
// for a round trip or two. Commit or roll back the transaction to let
// the replace go on.
func holdWatcherRow(t *testing.T, sc scratch, id string) pgx.Tx {
	t.Helper()
	tx, err := sc.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(t.Context(), `SELECT 1 FROM "`+sc.schema+`".workers_watchers WHERE task_id = $1 FOR UPDATE`, id); err != nil {
		t.Fatal(err)
	}
	return tx
}

// A cleanup that waits for the row of a finished task that is being
// re-run (ReplaceTask) deletes nothing once the re-run commits: the
// database checks the row again as it now is, a new PENDING run.
func TestCleanupSparesAReRunThatCommitsWhileItWaits(t *testing.T) {
	t.Parallel()
	sc := newScratchT(t)
	s := sc.store(t)
	ctx := t.Context()
	old := time.Now().Add(-48 * time.Hour).UTC()
	rec := workers.Record{ID: "u::report", RunID: "inst1-1", Watchers: []string{"u"}, CreatedAt: old,
		State: workers.State{Status: workers.StatusCompleted, Attempt: 1, StartedAt: old, CompletedAt: old, Cause: workers.CauseCompleted}}
	if err := s.InsertTask(ctx, rec); err != nil {
		t.Fatal(err)
	}
	blocker := holdWatcherRow(t, sc, rec.ID)
	next := workers.Record{ID: rec.ID, RunID: "inst2-1", Watchers: []string{"u"}, CreatedAt: time.Now().UTC(),
		State: workers.State{Status: workers.StatusPending}}
	replaced := make(chan error, 1)
	go func() { replaced <- s.ReplaceTask(ctx, next, rec.RunID) }()
	waitLockWaiters(t, sc, 1)
	type result struct {
		n   int
		err error
	}
	deleted := make(chan result, 1)
	go func() {
		n, err := s.DeleteFinished(ctx, time.Now().Add(-time.Hour))
		deleted <- result{n, err}
	}()
	waitLockWaiters(t, sc, 2) // the cleanup waits on the task's row
	if err := blocker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-replaced; err != nil {
		t.Fatalf("ReplaceTask: %v", err)
	}
	if r := <-deleted; r.err != nil || r.n != 0 {
		t.Errorf("DeleteFinished = %d, %v; want 0, nil: the record it found finished was re-run", r.n, r.err)
	}
	got, err := s.GetTask(ctx, rec.ID)
	if err != nil || got.RunID != next.RunID || got.Status != workers.StatusPending {
		t.Fatalf("GetTask = %+v, %v; want the re-run's PENDING record", got, err)
	}
}

// A write of a group-commit batch that waits for its row while a
// ReplaceTask of that row commits is fenced off by the new run id; the
// batch's other writes land.
func TestGroupCommitFencesOffARowReplacedWhileItWaits(t *testing.T) {
	t.Parallel()
	sc := newScratchT(t)
	s := sc.ownStore(t, nil)
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	insertPending(t, s, "a-1", "u::z", "u::x", "u::y")
	from := []workers.Status{workers.StatusPending}
	running := workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: time.Now()}
	unboundLockWaits(t, sc) // the batch in flight waits for the test, however long it takes
	g := gateOn(t, sc, s, "u::z", "a-1")
	var wg sync.WaitGroup
	var okX, okY bool
	var errX, errY error
	g.queue(&wg, func() { okX, errX = s.TransitionTask(ctx, "u::x", "a-1", from, running) })
	g.queue(&wg, func() { okY, errY = s.TransitionTask(ctx, "u::y", "a-1", from, running) })
	blocker := holdWatcherRow(t, sc, "u::x")
	replaced := make(chan error, 1)
	go func() {
		replaced <- s.ReplaceTask(ctx, workers.Record{ID: "u::x", RunID: "b-1", Watchers: []string{"u"}, CreatedAt: time.Now(), State: workers.State{Status: workers.StatusPending}}, "a-1")
	}()
	waitLockWaiters(t, sc, 2) // the first write and the replace
	if err := g.release(); err != nil {
		t.Fatal(err)
	}
	waitLockWaiters(t, sc, 2) // the replace, and the batch on x's row
	if err := blocker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-replaced; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if okX || errX != nil || !okY || errY != nil {
		t.Fatalf("the batch's writes: x %v, %v (want false, nil: fenced off); y %v, %v (want true, nil)", okX, errX, okY, errY)
	}
	rec, err := s.GetTask(ctx, "u::x")
	if err != nil || rec.RunID != "b-1" || rec.Status != workers.StatusPending {
		t.Fatalf("GetTask = %+v, %v; want the replacing run's PENDING record", rec, err)
	}
}

// Listen connects as the pool does, with its BeforeConnect and
// AfterConnect hooks, where a service keeps credentials that change (a
// cloud IAM token, a secret store's password): a pool whose hook makes
// its connections work makes the listener's work too.
func TestListenConnectsThroughThePoolsHooks(t *testing.T) {
	t.Parallel()
	sc := newScratchT(t)
	sc.store(t) // the tables, migrated
	cfg := testConfig(t)
	good := cfg.ConnConfig.Database
	cfg.ConnConfig.Database = "no_such_database" // what only the hook corrects
	cfg.BeforeConnect = func(_ context.Context, c *pgx.ConnConfig) error {
		c.Database = good
		return nil
	}
	var listeners atomic.Int32
	cfg.AfterConnect = func(_ context.Context, c *pgx.Conn) error {
		if c.Config().RuntimeParams["application_name"] == "workers listener" {
			listeners.Add(1)
		}
		return nil
	}
	s := storeOver(t, cfg, postgres.WithSchema(sc.schema))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var resynced bool
	err := s.Listen(ctx, func(c workers.Change) {
		resynced = c.Resync
		cancel()
	})
	if !errors.Is(err, context.Canceled) || !resynced {
		t.Fatalf("Listen = %v, resynced %v; want it to listen (a Resync), then context.Canceled", err, resynced)
	}
	if n := listeners.Load(); n != 1 {
		t.Errorf("AfterConnect ran for %d listener connections, want 1", n)
	}
}
