package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/internal/sqlcore"
	"github.com/taskgate/workers/sqlstore/internal/sqltest"
	"github.com/taskgate/workers/sqlstore/postgres"
	"github.com/taskgate/workers/storetest"
)

// dsnEnv names the variable holding the test database's address.
const dsnEnv = "WORKERS_TEST_POSTGRES"

var fixtures = &sqltest.Fixtures{Seed: seed}

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(sqltest.Main{M: m, Fixtures: fixtures})
}

// testDSN returns the test database's address, or skips tb.
func testDSN(tb testing.TB) string {
	tb.Helper()
	dsn := os.Getenv(dsnEnv)
	if dsn == "" {
		tb.Skipf("PostgreSQL tests need %s, e.g. %s=postgres://postgres@127.0.0.1:5432/test?sslmode=disable", dsnEnv, dsnEnv)
	}
	return dsn
}

// scratch is a pool with a schema of its own, in which tests create
// stores.
type scratch struct {
	pool   *pgxpool.Pool
	schema string
}

// newScratch connects to dsn and creates a schema with a random name.
// drop removes the schema and closes the pool.
func newScratch(ctx context.Context, dsn string) (sc scratch, drop func(), err error) {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return scratch{}, nil, err
	}
	schema := "workers_test_" + strings.ToLower(rand.Text())
	if _, err := pool.Exec(ctx, `CREATE SCHEMA "`+schema+`"`); err != nil {
		pool.Close()
		return scratch{}, nil, err
	}
	drop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, `DROP SCHEMA "`+schema+`" CASCADE`)
		pool.Close()
	}
	return scratch{pool, schema}, drop, nil
}

// newScratchT is newScratch for a test, undone in its cleanup.
func newScratchT(t testing.TB) scratch {
	t.Helper()
	sc, drop, err := newScratch(t.Context(), testDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	return sc
}

// store returns a migrated store in sc's schema, closed in t's cleanup.
func (sc scratch) store(t testing.TB, opts ...postgres.Option) *postgres.Store {
	t.Helper()
	s, err := postgres.New(sc.pool, append([]postgres.Option{postgres.WithSchema(sc.schema)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s
}

// testConfig returns the test database's pool configuration, for a test
// to change before storeOver.
func testConfig(t *testing.T) *pgxpool.Config {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// storeOver returns a store with opts over a pool made from cfg; both
// are closed in t's cleanup.
func storeOver(t *testing.T, cfg *pgxpool.Config, opts ...postgres.Option) *postgres.Store {
	t.Helper()
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := postgres.New(pool, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// ownStore returns a store in sc's schema over a pool of its own, as
// another process would have, whose connections carry the application
// name app if it is not empty; both are closed in t's cleanup. It does
// not migrate.
func (sc scratch) ownStore(t testing.TB, params map[string]string) *postgres.Store {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	maps.Copy(cfg.ConnConfig.RuntimeParams, params)
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := postgres.New(pool, postgres.WithSchema(sc.schema))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// namedStore returns a migrated ownStore whose connections carry the
// application name it returns (name and a random suffix), so that a test
// can find and end them.
func (sc scratch) namedStore(t testing.TB, name string) (*postgres.Store, string) {
	t.Helper()
	app := name + "-" + strings.ToLower(rand.Text())
	s := sc.ownStore(t, map[string]string{"application_name": app})
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s, app
}

// newStore returns a migrated store in a schema of its own.
func newStore(t testing.TB) *postgres.Store {
	t.Helper()
	return newScratchT(t).store(t)
}

func TestConformance(t *testing.T) {
	testDSN(t)
	t.Parallel()
	storetest.Run(t, func(t *testing.T) workers.Store { return newStore(t) }, storetest.Durable())
}

func TestRuntimeConformance(t *testing.T) {
	testDSN(t)
	t.Parallel()
	storetest.RunRuntime(t, func(t *testing.T) workers.Store { return newStore(t) }, storetest.Durable())
}

// TestFaults fails every store call on a run's path, before and after it
// lands, over this store (storetest.RunFaults).
func TestFaults(t *testing.T) {
	testDSN(t)
	t.Parallel()
	storetest.RunFaults(t, func(t *testing.T) workers.Store { return newStore(t) })
}

// TestSQLChecks runs the checks the SQL stores add to the suite.
func TestSQLChecks(t *testing.T) {
	testDSN(t)
	t.Parallel()
	sqltest.Run(t, func(t *testing.T) workers.Store { return newStore(t) })
}

func TestOpen(t *testing.T) {
	t.Parallel()
	sc := newScratchT(t)
	s, err := postgres.Open(t.Context(), testDSN(t), postgres.WithSchema(sc.schema))
	if err != nil {
		t.Fatal(err)
	}
	rec := workers.Record{ID: "alice::report", RunID: "run-1", State: workers.State{Status: workers.StatusPending}}
	if err := errors.Join(s.Migrate(t.Context()), s.InsertTask(t.Context(), rec)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Pool().Ping(t.Context()); err == nil {
		t.Error("the pool Open created is still open after Close")
	}
	if _, err := sc.store(t).GetTask(t.Context(), rec.ID); err != nil {
		t.Errorf("the record did not outlive its store: %v", err)
	}
	if _, err := postgres.Open(t.Context(), "postgres://127.0.0.1:1/none?connect_timeout=1"); err == nil {
		t.Error("Open succeeded without a server")
	}
}

// Processes migrating at once apply each version once, whatever
// isolation their database or role makes the default: a migration's
// transaction reads what a peer committed while it waited for the lock.
func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	t.Parallel()
	for _, isolation := range []string{"", "repeatable read", "serializable"} {
		t.Run("default isolation="+isolation, func(t *testing.T) {
			t.Parallel()
			sc := newScratchT(t)
			var params map[string]string
			if isolation != "" {
				params = map[string]string{"default_transaction_isolation": isolation}
			}
			var stores []*postgres.Store
			for range 4 {
				stores = append(stores, sc.ownStore(t, params)) // a pool each, as separate processes would have
			}
			sqltest.MigrateConcurrently(t, stores)
			var n, top int
			err := sc.pool.QueryRow(t.Context(), `SELECT count(*), max(version) FROM "`+sc.schema+`".workers_schema_version`).Scan(&n, &top)
			if err != nil || n != sqltest.MigrationFiles(t) || top < 2 {
				t.Errorf("schema_version holds %d rows up to version %d (%v), want each version once", n, top, err)
			}
		})
	}
}

// A rolling deploy's Migrate that needs a lock on the tables which a
// long transaction of an older replica holds (here 0005's DROP INDEX,
// which wants the tasks table's exclusive lock) does not stall that
// replica's other statements, which would queue behind it: it waits a
// second at most, lets them go, and tries again until the lock is free.
func TestMigrateWaitingForATableLockLetsTheOthersGo(t *testing.T) {
	t.Parallel()
	sc := newScratchT(t)
	ctx := t.Context()
	old := sc.ownStore(t, nil)
	if err := sqlcore.MigrateTo(ctx, postgres.Core(old), 4); err != nil {
		t.Fatal(err)
	}
	rec := workers.Record{ID: "u::x", RunID: "r", CreatedAt: time.Now(), State: workers.State{Status: workers.StatusPending}}
	if err := old.InsertTask(ctx, rec); err != nil {
		t.Fatal(err)
	}
	holder, err := sc.pool.Begin(ctx) // an older replica's long transaction
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(context.Background()) }()
	if _, err := holder.Exec(ctx, `SELECT 1 FROM "`+sc.schema+`".workers_tasks WHERE id = 'u::x' FOR SHARE`); err != nil {
		t.Fatal(err)
	}
	migrated := make(chan error, 1)
	go func() { migrated <- sc.ownStore(t, nil).Migrate(ctx) }()
	waitFor(t, func() bool { // Migrate waits for the table's lock
		var n int
		err := sc.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND position('DROP INDEX' in query) > 0`).Scan(&n)
		return err == nil && n > 0
	})
	for range 3 {
		read, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := old.GetTask(read, rec.ID)
		cancel()
		if err != nil {
			t.Fatalf("a read of the older replica, which the long transaction does not block, failed behind the waiting Migrate: %v", err)
		}
	}
	_ = holder.Rollback(ctx)
	if err := <-migrated; err != nil {
		t.Fatalf("Migrate once the lock was free: %v", err)
	}
}

func TestMigrateRefusesMismatchedTables(t *testing.T) {
	t.Parallel()
	sqltest.MigrateRefusals(t, func(t *testing.T) (*postgres.Store, func(string) error) {
		sc := newScratchT(t)
		s := sc.store(t)
		names := strings.NewReplacer("{versions}", `"`+sc.schema+`".workers_schema_version`, "{tasks}", `"`+sc.schema+`".workers_tasks`)
		return s, func(q string) error { _, err := sc.pool.Exec(t.Context(), names.Replace(q)); return err }
	}, postgres.ErrSchemaTooNew, postgres.ErrSchemaMismatch)
}

// Migrate records, beside each version, the oldest version whose code
// can use the tables it leaves: 5 for version 6, which only adds a
// function, for version 7, which only bounds its lock waits, for
// version 8, which only fills in what that code writes itself, for
// version 9, which keeps the notices of that code's statements, and for
// version 10, which only adds the notices of deletes; and each other
// version's own. It records it on a version
// table from before the column, and raises a record looser than its
// own, but never lowers one, so that the releases of a rollout never
// undo each other's records.
func TestMigrateRecordsWhatOlderCodeCanUse(t *testing.T) {
	t.Parallel()
	sc := newScratchT(t)
	s := sc.store(t)
	versions := `"` + sc.schema + `".workers_schema_version`
	exec := func(q string) {
		t.Helper()
		if _, err := sc.pool.Exec(t.Context(), q); err != nil {
			t.Fatal(err)
		}
	}
	check := func(when string, want map[int]int) {
		t.Helper()
		if err := s.Migrate(t.Context()); err != nil {
			t.Fatalf("%s: Migrate: %v", when, err)
		}
		rows, err := sc.pool.Query(t.Context(), `SELECT version, compatible_from FROM `+versions)
		if err != nil {
			t.Fatal(err)
		}
		got := map[int]int{}
		for rows.Next() {
			var v int
			var from *int
			if err := rows.Scan(&v, &from); err != nil {
				t.Fatal(err)
			}
			got[v] = -1 // NULL
			if from != nil {
				got[v] = *from
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(got, want) {
			t.Errorf("%s: versions compatible from %v, want %v", when, got, want)
		}
	}
	own := map[int]int{}
	for v := range sqltest.MigrationFiles(t) {
		own[v+1] = v + 1
	}
	own[6], own[7], own[8], own[9], own[10] = 5, 5, 5, 5, 5
	check("a new database", own)
	exec(`ALTER TABLE ` + versions + ` DROP COLUMN compatible_from`)
	check("a version table without the column", own)
	exec(`UPDATE ` + versions + ` SET compatible_from = 4 WHERE version = 6`)
	check("a looser record", own)
	exec(`UPDATE ` + versions + ` SET compatible_from = 6 WHERE version = 6`)
	stricter := maps.Clone(own)
	stricter[6] = 6
	check("a stricter record", stricter)
}

// A refusal names the version the database is at and the version that
// needs newer code.
func TestMigrateNamesTheVersionThatNeedsNewerCode(t *testing.T) {
	t.Parallel()
	sc := newScratchT(t)
	s := sc.store(t)
	_, err := sc.pool.Exec(t.Context(), `INSERT INTO "`+sc.schema+`".workers_schema_version (version, name, checksum, compatible_from)
VALUES (9998, 'changes_a_column', '', 9998), (9999, 'adds_an_index', '', 1)`)
	if err != nil {
		t.Fatal(err)
	}
	err = s.Migrate(t.Context())
	if !errors.Is(err, postgres.ErrSchemaTooNew) || !strings.Contains(err.Error(), "at version 9999, and its version 9998 (changes_a_column) needs code that knows version 9998") {
		t.Errorf("Migrate = %v, want ErrSchemaTooNew naming versions 9999 and 9998", err)
	}
}

// A renewal that replaced an expired lease reports so, even when the
// prune of the other expired leases that follows it fails: here it waits
// on a row another transaction holds until the renewal's context ends.
// Reported as a failure, the runtime would have missed that its lease
// had lapsed, since its next renewal extends a live one.
func TestRenewalAfterALapseIsReportedWhenThePruneFails(t *testing.T) {
	t.Parallel()
	sc := newScratchT(t)
	s := sc.store(t)
	ctx := t.Context()
	leases := `"` + sc.schema + `".workers_leases`
	if _, err := sc.pool.Exec(ctx, `INSERT INTO `+leases+` (instance, expires_at, extended)
VALUES ('me', now() - interval '1 second', false), ('other', now() - interval '1 second', false)`); err != nil {
		t.Fatal(err)
	}
	tx, err := sc.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM `+leases+` WHERE instance = 'other' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	extended, err := s.RenewLease(rctx, "me", 10*time.Second)
	if extended || err != nil {
		t.Fatalf("renewal after the lapse = %v, %v; want false, nil", extended, err)
	}
	live, err := s.LiveInstances(ctx)
	if err != nil || !slices.Equal(live, []string{"me"}) {
		t.Errorf("live instances = %v, %v; want [me]", live, err)
	}
}

func TestNames(t *testing.T) {
	t.Parallel()
	sc := newScratchT(t)
	a, b := sc.store(t, postgres.WithTablePrefix("a_")), sc.store(t, postgres.WithTablePrefix(""))
	rec := workers.Record{ID: "nightly", RunID: "run-1", State: workers.State{Status: workers.StatusPending}}
	if err := a.InsertTask(t.Context(), rec); err != nil {
		t.Fatal(err)
	}
	if _, err := b.GetTask(t.Context(), rec.ID); !errors.Is(err, workers.ErrNotFound) {
		t.Errorf("a store with another prefix sees the record: %v", err)
	}
	for _, opt := range []postgres.Option{
		postgres.WithSchema(`public"; DROP SCHEMA public; --`),
		postgres.WithSchema("a.b"),
		postgres.WithSchema(strings.Repeat("s", 64)),
		postgres.WithTablePrefix("1abc"),
		postgres.WithTablePrefix(strings.Repeat("p", 33)),
	} {
		if s, err := postgres.New(sc.pool, opt); !errors.Is(err, workers.ErrInvalidOption) {
			if err == nil {
				s.Close()
			}
			t.Errorf("New with an invalid name: %v, want ErrInvalidOption", err)
		}
	}
}

// TestQueryPlansUseIndexes checks, after seeding and analyzing 10^4
// records, that a status read, a user's listing and the recovery scan
// are index lookups, never a sequential scan of either table.
func TestQueryPlansUseIndexes(t *testing.T) {
	testDSN(t)
	t.Parallel()
	const n = 10_000
	s, drop, err := seed(t.Context(), n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	ps := s.(*postgres.Store)
	for _, st := range sqlcore.IndexedStatements(postgres.Core(ps), sqltest.TaskID(n/2), sqltest.Owner(n/2), sqltest.Position(n/2+5)) {
		var plan []byte
		if err := ps.Pool().QueryRow(t.Context(), "EXPLAIN (FORMAT JSON) "+st.SQL, st.Args...).Scan(&plan); err != nil {
			t.Fatalf("%s: %v", st.Name, err)
		}
		var tree []struct{ Plan planNode }
		if err := json.Unmarshal(plan, &tree); err != nil || len(tree) != 1 {
			t.Fatalf("%s: decode plan: %v", st.Name, err)
		}
		var steps []string
		indexed := false
		tree[0].Plan.walk(func(p *planNode) {
			steps = append(steps, p.NodeType+" "+p.Relation+" "+p.Index)
			switch p.NodeType {
			case "Seq Scan":
				t.Errorf("%s: sequential scan of %s", st.Name, p.Relation)
			case "Index Scan", "Index Only Scan", "Bitmap Index Scan":
				indexed = true
			}
		})
		if !indexed {
			t.Errorf("%s uses no index", st.Name)
		}
		t.Logf("%s: %q", st.Name, steps)
		if st.Page > 0 {
			pageReadsOnlyAPage(t, ps, st)
		}
	}
}

// pageReadsOnlyAPage runs a page's query under EXPLAIN ANALYZE and checks
// that no index read handled more rows than a page, and no step more than
// a page per branch: each branch read its page from an index and
// stopped, although the user sees 2*TasksPerUser records.
func pageReadsOnlyAPage(t *testing.T, ps *postgres.Store, st sqlcore.Statement) {
	t.Helper()
	var plan []byte
	if err := ps.Pool().QueryRow(t.Context(), "EXPLAIN (ANALYZE, FORMAT JSON) "+st.SQL, st.Args...).Scan(&plan); err != nil {
		t.Fatalf("%s: %v", st.Name, err)
	}
	var tree []struct{ Plan planNode }
	if err := json.Unmarshal(plan, &tree); err != nil || len(tree) != 1 {
		t.Fatalf("%s: decode plan: %v", st.Name, err)
	}
	// Each branch of the union (a Subquery Scan) reads at most a page.
	branches := 1
	tree[0].Plan.walk(func(p *planNode) {
		if p.NodeType == "Subquery Scan" {
			branches++
		}
	})
	bound := float64(st.Page * branches)
	tree[0].Plan.walk(func(p *planNode) {
		if p.ActualRows > bound || (p.Index != "" && p.ActualRows > float64(st.Page)) {
			t.Errorf("%s: %s %s %s handled %v rows, more than a page of %d per branch", st.Name, p.NodeType, p.Relation, p.Index, p.ActualRows, st.Page)
		}
	})
}

// planNode is a node of EXPLAIN (FORMAT JSON).
type planNode struct {
	NodeType string `json:"Node Type"`
	Relation string `json:"Relation Name"`
	Index    string `json:"Index Name"`
	// ActualRows is rows per loop, under EXPLAIN ANALYZE.
	ActualRows float64    `json:"Actual Rows"`
	Plans      []planNode `json:"Plans"`
}

func (p *planNode) walk(f func(*planNode)) {
	f(p)
	for i := range p.Plans {
		p.Plans[i].walk(f)
	}
}

func BenchmarkGetTask(b *testing.B)        { sqltest.BenchmarkGetTask(b, fixtures) }
func BenchmarkListVisibleTo(b *testing.B)  { sqltest.BenchmarkListVisibleTo(b, fixtures) }
func BenchmarkListPage(b *testing.B)       { sqltest.BenchmarkListPage(b, fixtures) }
func BenchmarkTransitionTask(b *testing.B) { sqltest.BenchmarkTransitionTask(b, fixtures) }
func BenchmarkInsertTask(b *testing.B)     { sqltest.BenchmarkInsertTask(b, fixtures) }

// BenchmarkRoundTrip is the floor under every figure above: one SELECT 1
// through the pool.
func BenchmarkRoundTrip(b *testing.B) {
	s := newStore(b)
	b.ReportAllocs()
	for b.Loop() {
		var one int
		if err := s.Pool().QueryRow(b.Context(), "SELECT 1").Scan(&one); err != nil {
			b.Fatal(err)
		}
	}
}

// seed returns a store in a schema of its own holding the n records of
// the sqltest fixture, inserted with one INSERT ... SELECT
// generate_series per table, then analyzed.
func seed(ctx context.Context, n int) (workers.Store, func(), error) {
	dsn := os.Getenv(dsnEnv)
	if dsn == "" {
		return nil, nil, fmt.Errorf("%s is not set", dsnEnv)
	}
	sc, dropSchema, err := newScratch(ctx, dsn)
	if err != nil {
		return nil, nil, err
	}
	s, err := postgres.New(sc.pool, postgres.WithSchema(sc.schema))
	if err != nil {
		dropSchema()
		return nil, nil, err
	}
	drop := func() { s.Close(); dropSchema() }
	if err := s.Migrate(ctx); err != nil {
		drop()
		return nil, nil, err
	}
	for _, q := range seedSQL {
		q = strings.ReplaceAll(q, "{schema}", `"`+sc.schema+`"`)
		if _, err := sc.pool.Exec(ctx, q, n, sqltest.TasksPerUser, sqltest.RunningEvery); err != nil {
			err = fmt.Errorf("seed: %w", err)
			drop()
			return nil, nil, err
		}
	}
	for _, table := range []string{"workers_tasks", "workers_watchers"} {
		if _, err := sc.pool.Exec(ctx, `ANALYZE "`+sc.schema+`".`+table); err != nil {
			drop()
			return nil, nil, err
		}
	}
	return s, drop, nil
}

var seedSQL = []string{`
INSERT INTO {schema}.workers_tasks
	(id, run_id, queue, owner, created_at, status, progress, attempt, result, error, started_at, completed_at)
SELECT 'u' || (i / $2::int) || '::k' || i, 'r' || i, '', 'u' || (i / $2::int),
	timestamptz '2025-01-01 00:00:00Z' + i * interval '1 millisecond',
	CASE WHEN i % $3::int = 0 THEN 'running' ELSE 'completed' END,
	CASE WHEN i % $3::int = 0 THEN 50 ELSE 100 END, 1,
	CASE WHEN i % $3::int = 0 THEN NULL ELSE '{"ok":true}'::jsonb END, '',
	timestamptz '2025-01-01 00:00:00Z' + i * interval '1 millisecond',
	CASE WHEN i % $3::int = 0 THEN NULL ELSE timestamptz '2025-01-01 00:00:01Z' + i * interval '1 millisecond' END
FROM generate_series(0, $1::int - 1) AS i`, `
INSERT INTO {schema}.workers_watchers (task_id, user_id, created_at)
SELECT 'u' || (i / $2::int) || '::k' || i, 'u' || ((i / $2::int + 1) % ($1::int / $2::int)),
	timestamptz '2025-01-01 00:00:00Z' + i * interval '1 millisecond'
FROM generate_series(0, $1::int - 1) AS i
WHERE $3::int > 0 -- every statement takes the same three arguments`,
}

// unmigrated returns a store over a new scratch schema with no tables.
func unmigrated(t *testing.T) *postgres.Store {
	t.Helper()
	sc := newScratchT(t)
	s, err := postgres.New(sc.pool, postgres.WithSchema(sc.schema))
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
	sqltest.CheckUpgradeFromFirstSchema(t, postgres.Core(s), s)
}

// TestListPagesOverDisagreeingWatcherRows: a page never repeats a task
// whose watcher rows hold another created_at than the task (NULL, or a
// later time), newest or oldest first.
func TestListPagesOverDisagreeingWatcherRows(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	sqltest.CheckDisagreeingWatcherRows(t, postgres.Core(s), s)
}

// TestListPagesOverOlderReplicaWatchers: watchers that a replica of a
// release before version 4 adds, without a created_at, before the
// tables are migrated past version 7 and after, are listed in
// their place, newest and oldest first.
func TestListPagesOverOlderReplicaWatchers(t *testing.T) {
	t.Parallel()
	s := unmigrated(t)
	sqltest.CheckOlderReplicaWatchers(t, postgres.Core(s), s, 7)
}

// A result is kept byte for byte, \u0000 escapes included (the column is
// json, not jsonb), and a value the database refuses is reported as
// workers.ErrInvalidData, which the runtime treats as permanent.
func TestResultBytesAndDataErrors(t *testing.T) {
	t.Parallel()
	s := newScratchT(t).store(t)
	at := time.Now().UTC().Truncate(time.Microsecond)
	result := json.RawMessage(`{"s": "a\u0000b",  "n":1}`)
	rec := workers.Record{ID: "alice::nul", RunID: "inst.1", CreatedAt: at,
		State: workers.State{Status: workers.StatusCompleted, Attempt: 1, Result: result, StartedAt: at, CompletedAt: at, Cause: workers.CauseCompleted}}
	if err := s.InsertTask(t.Context(), rec); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetTask(t.Context(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Result) != string(result) {
		t.Errorf("result read back as %s, want %s byte for byte", got.Result, result)
	}

	// The runtime validates the user ids it writes; the database refuses
	// a NUL byte in text whoever sends it (SQLSTATE 22021).
	if _, err := s.AddWatcher(t.Context(), rec.ID, rec.RunID, "bo\x00b"); !errors.Is(err, workers.ErrInvalidData) {
		t.Errorf("AddWatcher with text the database refuses = %v, want ErrInvalidData", err)
	}
}

// A nil Option sets nothing, as the runtime's options do. New does not
// touch the database, so this needs none.
func TestNewSkipsANilOption(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(t.Context(), "postgres://nobody@127.0.0.1:1/none?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := postgres.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}
