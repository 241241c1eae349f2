package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/internal/sqlcore"
	"github.com/taskgate/workers/sqlstore/internal/sqltest"
	"github.com/taskgate/workers/sqlstore/sqlite"
	"github.com/taskgate/workers/storetest"
)

var fixtures = &sqltest.Fixtures{Seed: seed}

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(sqltest.Main{M: m, Fixtures: fixtures})
}

// newStore returns a migrated store in a file of its own, closed in
// t's cleanup.
func newStore(t testing.TB, opts ...sqlite.Option) *sqlite.Store {
	t.Helper()
	return openAt(t, filepath.Join(t.TempDir(), "tasks.db"), opts...)
}

// openAt returns a migrated store on path, closed in t's cleanup.
func openAt(t testing.TB, path string, opts ...sqlite.Option) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(t.Context(), path, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) workers.Store { return newStore(t) }, storetest.Durable())
}

func TestRuntimeConformance(t *testing.T) {
	t.Parallel()
	storetest.RunRuntime(t, func(t *testing.T) workers.Store { return newStore(t) }, storetest.Durable())
}

// TestFaults fails every store call on a run's path, before and after it
// lands, over this store (storetest.RunFaults).
func TestFaults(t *testing.T) {
	t.Parallel()
	storetest.RunFaults(t, func(t *testing.T) workers.Store { return newStore(t) })
}

// TestSQLChecks runs the checks the SQL stores add to the suite.
func TestSQLChecks(t *testing.T) {
	t.Parallel()
	sqltest.Run(t, func(t *testing.T) workers.Store { return newStore(t) })
}

func TestRecordsOutliveTheStore(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "tasks.db")
	rec := workers.Record{ID: "alice::report", RunID: "run-1", Watchers: []string{"bob"},
		State: workers.State{Status: workers.StatusCompleted, Result: []byte(`{"rows":3}`),
			CompletedAt: time.Date(2025, 1, 2, 3, 4, 5, 6000, time.UTC)}}
	s, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	err = errors.Join(s.Migrate(t.Context()), s.InsertTask(t.Context(), rec), s.Close())
	if err != nil {
		t.Fatal(err)
	}
	got, err := openAt(t, path).GetTask(t.Context(), rec.ID)
	if err != nil || got.RunID != rec.RunID || string(got.Result) != `{"rows":3}` ||
		!got.CompletedAt.Equal(rec.CompletedAt) || got.CompletedAt.Location() != time.UTC {
		t.Fatalf("after reopening: GetTask = %+v, %v", got, err)
	}
}

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "tasks.db")
	var stores []*sqlite.Store
	for range 4 {
		s, err := sqlite.Open(t.Context(), path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		stores = append(stores, s)
	}
	sqltest.MigrateConcurrently(t, stores)
	db := openRaw(t, path)
	var n, top int
	if err := db.QueryRow(`SELECT count(*), max(version) FROM workers_schema_version`).Scan(&n, &top); err != nil || n != sqltest.MigrationFiles(t) || top < 2 {
		t.Errorf("schema_version holds %d rows up to version %d (%v), want each version once", n, top, err)
	}
}

func TestMigrateRefusesMismatchedTables(t *testing.T) {
	t.Parallel()
	sqltest.MigrateRefusals(t, func(t *testing.T) (*sqlite.Store, func(string) error) {
		path := filepath.Join(t.TempDir(), "tasks.db")
		s, err := sqlite.Open(t.Context(), path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if err := s.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
		db := openRaw(t, path)
		names := strings.NewReplacer("{versions}", "workers_schema_version", "{tasks}", "workers_tasks")
		return s, func(q string) error { _, err := db.Exec(names.Replace(q)); return err }
	}, sqlite.ErrSchemaTooNew, sqlite.ErrSchemaMismatch)
}

// openRaw returns a handle on the database at path, closed in t's cleanup.
func openRaw(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", path+"?_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestTablePrefix(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "tasks.db")
	a, b := openAt(t, path, sqlite.WithTablePrefix("a_")), openAt(t, path, sqlite.WithTablePrefix(""))
	rec := workers.Record{ID: "nightly", RunID: "run-1", State: workers.State{Status: workers.StatusPending}}
	if err := a.InsertTask(t.Context(), rec); err != nil {
		t.Fatal(err)
	}
	if _, err := b.GetTask(t.Context(), rec.ID); !errors.Is(err, workers.ErrNotFound) {
		t.Errorf("a store with another prefix sees the record: %v", err)
	}
	// "A_" would name a's tables: SQLite's names ignore case; and SQLite
	// keeps the names that begin with "sqlite_" for its own.
	for _, p := range []string{`x"; DROP TABLE a_tasks; --`, "1abc", "a-b", strings.Repeat("p", 33), "A_", "sqlite_", "sqlite_x_"} {
		if _, err := sqlite.Open(t.Context(), path, sqlite.WithTablePrefix(p)); !errors.Is(err, workers.ErrInvalidOption) {
			t.Errorf("Open with table prefix %q: %v, want ErrInvalidOption", p, err)
		}
	}
}

func TestOpenRefusesNonFiles(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"", ":memory:", "file:x.db", "x.db?mode=ro"} {
		if s, err := sqlite.Open(t.Context(), path); err == nil {
			s.Close()
			t.Errorf("Open(%q) succeeded", path)
		}
	}
}

// TestQueryPlansUseIndexes checks that a status read, a user's listing
// and the recovery scan are index lookups, never a scan of a table.
func TestQueryPlansUseIndexes(t *testing.T) {
	t.Parallel()
	const n = 10_000
	s, drop, err := seed(t.Context(), n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	db := s.(*seeded).raw
	for _, st := range sqlcore.IndexedStatements(sqlite.Core(s.(*seeded).Store), sqltest.TaskID(n/2), sqltest.Owner(n/2), sqltest.Position(n/2+5)) {
		rows, err := db.QueryContext(t.Context(), "EXPLAIN QUERY PLAN "+st.SQL, st.Args...)
		if err != nil {
			t.Fatalf("%s: %v", st.Name, err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		rows.Close()
		indexed, inPage := false, false
		for _, step := range plan {
			if st.Page > 0 {
				// A page's branches are co-routines that read their index
				// in order and stop after a page: a sort inside one would
				// read the user's whole history. Outside them, a scan of
				// a branch's page (SCAN page) and the sorts of those
				// pages for the UNION handle at most a page each, and a
				// scan of an index in order with a LIMIT is a page's read.
				switch {
				case step == "CO-ROUTINE page":
					inPage = true
					continue
				case step == "SCAN page":
					inPage = false
					continue
				case inPage && strings.HasPrefix(step, "USE TEMP B-TREE FOR ORDER BY"):
					t.Errorf("%s sorts a branch instead of reading it from an index in order\nplan: %q", st.Name, plan)
				case strings.HasPrefix(step, "SCAN t USING INDEX ") || strings.HasPrefix(step, "SCAN t USING COVERING INDEX "):
					indexed = true
					continue
				}
			}
			if strings.HasPrefix(step, "SCAN ") {
				t.Errorf("%s scans a table: %q\nplan: %q", st.Name, step, plan)
			}
			if strings.HasPrefix(step, "SEARCH ") && strings.Contains(step, " USING ") {
				indexed = true
			}
		}
		if !indexed {
			t.Errorf("%s uses no index; plan: %q", st.Name, plan)
		}
		t.Logf("%s: %q", st.Name, plan)
	}
}

func BenchmarkGetTask(b *testing.B)        { sqltest.BenchmarkGetTask(b, fixtures) }
func BenchmarkListVisibleTo(b *testing.B)  { sqltest.BenchmarkListVisibleTo(b, fixtures) }
func BenchmarkListPage(b *testing.B)       { sqltest.BenchmarkListPage(b, fixtures) }
func BenchmarkTransitionTask(b *testing.B) { sqltest.BenchmarkTransitionTask(b, fixtures) }
func BenchmarkInsertTask(b *testing.B)     { sqltest.BenchmarkInsertTask(b, fixtures) }

// seeded is a fixture store with a handle of its own on the same file.
type seeded struct {
	*sqlite.Store
	raw *sql.DB
}

// seed returns a store in a temporary file holding the n records of the
// sqltest fixture, inserted in one statement per table, then analyzed.
func seed(ctx context.Context, n int) (workers.Store, func(), error) {
	dir, err := os.MkdirTemp("", "workers-sqlite-bench-") // outlives any one test

	if err != nil {
		return nil, nil, err
	}
	path := filepath.Join(dir, "bench.db")
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		return nil, nil, err
	}
	raw, err := sql.Open("sqlite", path+"?_busy_timeout=5000")
	drop := func() { s.Close(); raw.Close(); os.RemoveAll(dir) }
	if err == nil {
		err = s.Migrate(ctx)
	}
	if err == nil {
		_, err = raw.ExecContext(ctx, seedSQL, n, sqltest.TasksPerUser, sqltest.RunningEvery)
	}
	if err != nil {
		drop()
		return nil, nil, err
	}
	return &seeded{Store: s, raw: raw}, drop, nil
}

const seedSQL = `
WITH RECURSIVE seq(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM seq WHERE i + 1 < $1)
INSERT INTO workers_tasks
	(id, run_id, queue, owner, created_at, status, progress, attempt, result, error, started_at, completed_at)
SELECT 'u' || (i / $2) || '::k' || i, 'r' || i, '', 'u' || (i / $2), 1735689600000000 + i * 1000,
	CASE WHEN i % $3 = 0 THEN 'running' ELSE 'completed' END,
	CASE WHEN i % $3 = 0 THEN 50 ELSE 100 END, 1,
	CASE WHEN i % $3 = 0 THEN NULL ELSE '{"ok":true}' END, '',
	1735689600000000 + i * 1000,
	CASE WHEN i % $3 = 0 THEN NULL ELSE 1735689600000000 + i * 1000 + 500 END
FROM seq;

WITH RECURSIVE seq(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM seq WHERE i + 1 < $1)
INSERT INTO workers_watchers (task_id, user_id, created_at)
SELECT 'u' || (i / $2) || '::k' || i, 'u' || ((i / $2 + 1) % ($1 / $2)), 1735689600000000 + i * 1000 FROM seq;

ANALYZE;
`

// unmigrated returns a store over a new database file with no tables.
func unmigrated(t *testing.T) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "old.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestUpgradeFromFirstSchema migrates tables filled by the first release
// forward: causes are derived from the old messages, and listings page
// through the old rows.
func TestUpgradeFromFirstSchema(t *testing.T) {
	t.Parallel()
	s := unmigrated(t)
	sqltest.CheckUpgradeFromFirstSchema(t, sqlite.Core(s), s)
}

// TestListPagesOverDisagreeingWatcherRows: a page never repeats a task
// whose watcher rows hold another created_at than the task (NULL, or a
// later time), newest or oldest first.
func TestListPagesOverDisagreeingWatcherRows(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	sqltest.CheckDisagreeingWatcherRows(t, sqlite.Core(s), s)
}

// TestListPagesOverOlderReplicaWatchers: watchers that a replica of a
// release before version 4 adds, without a created_at, before the
// tables are migrated past version 6 and after, are listed in
// their place, newest and oldest first.
func TestListPagesOverOlderReplicaWatchers(t *testing.T) {
	t.Parallel()
	s := unmigrated(t)
	sqltest.CheckOlderReplicaWatchers(t, sqlite.Core(s), s, 6)
}

// A nil Option sets nothing, as the runtime's options do.
func TestOpenSkipsANilOption(t *testing.T) {
	t.Parallel()
	s, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "nil.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}

// A negative busy timeout is refused as an invalid option.
func TestOpenRefusesANegativeBusyTimeout(t *testing.T) {
	t.Parallel()
	if _, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "tasks.db"), sqlite.WithBusyTimeout(-time.Second)); !errors.Is(err, workers.ErrInvalidOption) {
		t.Errorf("Open with a negative busy timeout: %v, want ErrInvalidOption", err)
	}
}

// A busy timeout past what SQLite counts (2^31-1 ms: "as long as it
// takes") waits for another process's lock all the same, where it used
// to be read as no wait at all, failing the write with SQLITE_BUSY at
// once (one under a millisecond: TestBusyMillis).
func TestABusyTimeoutPastWhatSQLiteCountsStillWaits(t *testing.T) {
	for _, d := range []time.Duration{30 * 24 * time.Hour, time.Duration(math.MaxInt64)} {
		t.Run(d.String(), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "tasks.db")
			s := openAt(t, path, sqlite.WithBusyTimeout(d))
			conn, err := openRaw(t, path).Conn(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := conn.ExecContext(t.Context(), "BEGIN IMMEDIATE"); err != nil { // another process's write
				t.Fatal(err)
			}
			release := time.AfterFunc(100*time.Millisecond, func() { _, _ = conn.ExecContext(context.Background(), "ROLLBACK") })
			defer release.Stop()
			rec := workers.Record{ID: "x", RunID: "r1", CreatedAt: time.Now(), State: workers.State{Status: workers.StatusPending}}
			if err := s.InsertTask(t.Context(), rec); err != nil {
				t.Fatalf("WithBusyTimeout(%v): InsertTask while another connection writes: %v", d, err)
			}
		})
	}
}

// A record with more watchers than SQLite takes parameters in one
// statement (32,766) is held, its watchers in order: they go in several
// statements of one transaction.
func TestARecordWithMoreWatchersThanAStatementTakes(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	rec := workers.Record{ID: "many", RunID: "r1", CreatedAt: time.Now(), State: workers.State{Status: workers.StatusPending}}
	for i := range 32_800 {
		rec.Watchers = append(rec.Watchers, "u"+strconv.Itoa(i))
	}
	if err := s.InsertTask(ctx, rec); err != nil {
		t.Fatalf("InsertTask with %d watchers: %v", len(rec.Watchers), err)
	}
	got, err := s.GetTask(ctx, "many")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Watchers, rec.Watchers) {
		t.Fatalf("GetTask: %d watchers, want the %d inserted, in order", len(got.Watchers), len(rec.Watchers))
	}
}
