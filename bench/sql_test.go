package bench

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/riverdriver/riversqlite"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/postgres"
	"github.com/taskgate/workers/sqlstore/sqlite"
	_ "modernc.org/sqlite"
)

// A durable system under test: open readies it in a fresh schema or file
// around fn, submit enqueues one task (from up to c goroutines at once,
// worker is the submitting goroutine's index), and completed counts the
// tasks whose terminal record is durable.
type durable struct {
	name string
	open func(tb testing.TB, fn func()) (submit func(worker int, key string) error, completed func(context.Context) (int, error), close func())
}

// pgURL returns the test database, or skips.
func pgURL(tb testing.TB) string {
	u := os.Getenv("WORKERS_TEST_POSTGRES")
	if u == "" {
		tb.Skip("WORKERS_TEST_POSTGRES is unset: PostgreSQL benchmarks skipped")
	}
	return u
}

var schemaSeq atomic.Int64

// pgSchema creates a schema of its own for one benchmark and drops it at
// cleanup.
func pgSchema(tb testing.TB, pool *pgxpool.Pool) string {
	name := fmt.Sprintf("bench_%d_%d", os.Getpid(), schemaSeq.Add(1))
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA "+name+" CASCADE"); err != nil {
			tb.Error(err)
		}
	})
	return name
}

func pgAdmin(tb testing.TB) *pgxpool.Pool {
	pool, err := pgxpool.New(context.Background(), pgURL(tb))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

func countPG(pool *pgxpool.Pool, query string) func(context.Context) (int, error) {
	return func(ctx context.Context) (n int, err error) {
		err = pool.QueryRow(ctx, query).Scan(&n)
		return n, err
	}
}

// pgStore opens a migrated store in a fresh schema, and returns it with
// the admin pool and the schema's name; the caller closes the store.
func pgStore(tb testing.TB) (*pgxpool.Pool, string, *postgres.Store) {
	admin := pgAdmin(tb)
	schema := pgSchema(tb, admin)
	ctx := context.Background()
	s, err := postgres.Open(ctx, pgURL(tb), postgres.WithSchema(schema))
	if err != nil {
		tb.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		s.Close()
		tb.Fatal(err)
	}
	return admin, schema, s
}

// workersPG is this library's Runtime on PostgreSQL; queues > 0 submits
// with SubmitSequential, worker w into queue w % queues.
func workersPG(queues int) func(tb testing.TB, fn func()) (func(int, string) error, func(context.Context) (int, error), func()) {
	return func(tb testing.TB, fn func()) (func(int, string) error, func(context.Context) (int, error), func()) {
		admin, schema, s := pgStore(tb)
		ctx := context.Background()
		rt, task := workersOver(tb, s, fn)
		submit := func(w int, key string) error {
			if queues > 0 {
				_, err := rt.SubmitSequential(ctx, "q"+strconv.Itoa(w%queues), key, task, alice)
				return err
			}
			_, err := rt.Submit(ctx, key, task, alice)
			return err
		}
		return submit, countPG(admin, "SELECT count(*) FROM "+schema+".workers_tasks WHERE status = 'completed'"), func() {
			shutdown(tb, rt)
			s.Close()
		}
	}
}

func workersOver[S workers.Store](tb testing.TB, s S, fn func()) (*workers.Runtime[S], workers.Func) {
	rt := workers.NewRuntime(s, workers.Config{})
	if err := rt.Start(context.Background()); err != nil {
		tb.Fatal(err)
	}
	return rt, func(context.Context, *workers.Task) (any, error) { fn(); return nil, nil }
}

func shutdown[S workers.Store](tb testing.TB, rt *workers.Runtime[S]) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := rt.Shutdown(ctx); err != nil {
		tb.Error(err)
	}
}

// noopArgs is River's trivial job.
type noopArgs struct{}

func (noopArgs) Kind() string { return "noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
	fn func()
}

func (w *noopWorker) Work(context.Context, *river.Job[noopArgs]) error { w.fn(); return nil }

// riverConfig is River's client configuration for a benchmark: its
// defaults with the given worker count, or tuned for throughput as its
// docs allow (a fetch cooldown of 1 ms).
func riverConfig(fn func(), maxWorkers int, cooldown time.Duration, schema string) *river.Config {
	ws := river.NewWorkers()
	river.AddWorker(ws, &noopWorker{fn: fn})
	return &river.Config{
		Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: maxWorkers}},
		Workers:       ws,
		FetchCooldown: cooldown,
		Schema:        schema,
		Logger:        quietLogger,
	}
}

// riverPG is River (riverpgxv5) on PostgreSQL, migrated with rivermigrate.
func riverPG(maxWorkers int, cooldown time.Duration) func(tb testing.TB, fn func()) (func(int, string) error, func(context.Context) (int, error), func()) {
	return func(tb testing.TB, fn func()) (func(int, string) error, func(context.Context) (int, error), func()) {
		admin := pgAdmin(tb)
		schema := pgSchema(tb, admin)
		ctx := context.Background()
		pool, err := pgxpool.New(ctx, pgURL(tb))
		if err != nil {
			tb.Fatal(err)
		}
		driver := riverpgxv5.New(pool)
		m, err := rivermigrate.New(driver, &rivermigrate.Config{Schema: schema, Logger: quietLogger})
		if err != nil {
			tb.Fatal(err)
		}
		if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
			tb.Fatal(err)
		}
		client, err := river.NewClient(driver, riverConfig(fn, maxWorkers, cooldown, schema))
		if err != nil {
			tb.Fatal(err)
		}
		if err := client.Start(ctx); err != nil {
			tb.Fatal(err)
		}
		submit := func(int, string) error {
			_, err := client.Insert(ctx, noopArgs{}, nil)
			return err
		}
		return submit, countPG(admin, "SELECT count(*) FROM "+schema+".river_job WHERE state = 'completed'"), func() {
			stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := client.Stop(stopCtx); err != nil {
				tb.Error(err)
			}
			pool.Close()
		}
	}
}

func countSQL(db *sql.DB, query string) func(context.Context) (int, error) {
	return func(ctx context.Context) (n int, err error) {
		err = db.QueryRowContext(ctx, query).Scan(&n)
		return n, err
	}
}

// workersSQLite is this library's Runtime.Submit on SQLite.
func workersSQLite(tb testing.TB, fn func()) (func(int, string) error, func(context.Context) (int, error), func()) {
	path := filepath.Join(tb.TempDir(), "w.db")
	ctx := context.Background()
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		tb.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		tb.Fatal(err)
	}
	reader, err := sql.Open("sqlite", path)
	if err != nil {
		tb.Fatal(err)
	}
	rt, task := workersOver(tb, s, fn)
	submit := func(_ int, key string) error {
		_, err := rt.Submit(ctx, key, task, alice)
		return err
	}
	return submit, countSQL(reader, "SELECT count(*) FROM workers_tasks WHERE status = 'completed'"), func() {
		shutdown(tb, rt)
		s.Close()
		reader.Close()
	}
}

// riverSQLite is River's riversqlite driver, on one connection as its
// docs advise.
func riverSQLite(maxWorkers int, cooldown time.Duration) func(tb testing.TB, fn func()) (func(int, string) error, func(context.Context) (int, error), func()) {
	return func(tb testing.TB, fn func()) (func(int, string) error, func(context.Context) (int, error), func()) {
		path := filepath.Join(tb.TempDir(), "r.db")
		ctx := context.Background()
		db, err := sql.Open("sqlite", path+"?_pragma=journal_mode(wal)&_pragma=busy_timeout(5000)")
		if err != nil {
			tb.Fatal(err)
		}
		db.SetMaxOpenConns(1)
		driver := riversqlite.New(db)
		m, err := rivermigrate.New(driver, &rivermigrate.Config{Logger: quietLogger})
		if err != nil {
			tb.Fatal(err)
		}
		if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
			tb.Fatal(err)
		}
		client, err := river.NewClient(driver, riverConfig(fn, maxWorkers, cooldown, ""))
		if err != nil {
			tb.Fatal(err)
		}
		if err := client.Start(ctx); err != nil {
			tb.Fatal(err)
		}
		submit := func(int, string) error {
			_, err := client.Insert(ctx, noopArgs{}, nil)
			return err
		}
		return submit, countSQL(db, "SELECT count(*) FROM river_job WHERE state = 'completed'"), func() {
			stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := client.Stop(stopCtx); err != nil {
				tb.Error(err)
			}
			db.Close()
		}
	}
}

// durableRun submits n tasks from c goroutines and returns when every one
// has a durable terminal record, polling the count every millisecond.
func durableRun(tb testing.TB, d durable, n, c int, ks []string) time.Duration {
	var ran sync.WaitGroup
	submit, completed, stop := d.open(tb, ran.Done)
	defer stop()
	ran.Add(n)
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := range c {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				if err := submit(w, ks[i]); err != nil {
					tb.Error(err)
					ran.Done()
				}
			}
		})
	}
	wg.Wait()
	ran.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		got, err := completed(ctx)
		if err != nil {
			tb.Fatal(err)
		}
		if got >= n {
			return time.Since(start)
		}
		time.Sleep(time.Millisecond) // polling the database, the same for every system
	}
}

func benchDurable(b *testing.B, d durable, c int) {
	ks := keys(b.N)
	b.ResetTimer()
	elapsed := durableRun(b, d, b.N, c, ks)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "tasks/s")
}

// pgSystems are the PostgreSQL comparisons: name, system, submitters.
func pgSystems() []struct {
	d durable
	c int
} {
	return []struct {
		d durable
		c int
	}{
		{durable{"workers-submit", workersPG(0)}, 1},
		{durable{"workers-submit", workersPG(0)}, 4},
		{durable{"workers-submit", workersPG(0)}, 16},
		{durable{"workers-seq8", workersPG(8)}, 8},
		{durable{"river-defaults-w8", riverPG(8, 0)}, 16},
		{durable{"river-cooldown1ms-w8", riverPG(8, time.Millisecond)}, 16},
		{durable{"river-cooldown1ms-w100", riverPG(100, time.Millisecond)}, 16},
	}
}

// BenchmarkPostgres is tasks submitted and run to a durable terminal
// record on PostgreSQL: this library beside River. Skipped unless
// WORKERS_TEST_POSTGRES is set. Run it with a fixed count, such as
// -benchtime=2000x.
func BenchmarkPostgres(b *testing.B) {
	pgURL(b)
	for _, s := range pgSystems() {
		b.Run(fmt.Sprintf("impl=%s/submitters=%d", s.d.name, s.c), func(b *testing.B) { benchDurable(b, s.d, s.c) })
	}
}

// BenchmarkSQLite is the same on SQLite: this library beside River's
// riversqlite driver.
func BenchmarkSQLite(b *testing.B) {
	for _, s := range []struct {
		d durable
		c int
	}{
		{durable{"workers-submit", workersSQLite}, 4},
		{durable{"river-defaults-w8", riverSQLite(8, 0)}, 4},
		{durable{"river-cooldown1ms-w8", riverSQLite(8, time.Millisecond)}, 4},
	} {
		b.Run(fmt.Sprintf("impl=%s/submitters=%d", s.d.name, s.c), func(b *testing.B) { benchDurable(b, s.d, s.c) })
	}
}

// BenchmarkPostgresLatency is the wait from Submit to the callback's
// start on PostgreSQL under a steady load of half this library's peak:
// the peak is measured first (4,000 tasks from 16 submitters), then
// warmup+b.N tasks are submitted by 16 submitters at half that rate,
// evenly paced. Metrics: the peak, the paced rate, and p50 and p99 from
// each submit call to its callback's start (ns) over the last b.N tasks,
// once the load is steady. The first warmup tasks run on a store just
// opened, whose pool opens a connection for each of the first
// concurrent calls: their longest wait is reported apart, as
// warmup-max-ns. Run it with a fixed count, such as -benchtime=4000x.
//
// The database's own commit latency under that load is measured in the
// same run, as raw-p50-ns and raw-p99-ns: the same paced load of the
// simplest durable write, each call inserting one row of a text key
// into a table of its own, in a transaction of its own, on the same
// database through a pool of the same size. A task's start waits for
// one durable write too, which group commit shares among the starts of
// the same moment.
func BenchmarkPostgresLatency(b *testing.B) {
	const warmup = 256 // 16 per submitter: about 0.1 s of the paced load
	pgURL(b)
	peak := float64(4000) / durableRun(b, durable{"workers-submit", workersPG(0)}, 4000, 16, keys(4000)).Seconds()
	all := pacedLatencies(b, warmup+b.N, 16, peak/2)
	lat := all[warmup:]
	raw := rawCommitLatencies(b, warmup+b.N, 16, peak/2)[warmup:]
	b.ReportMetric(peak, "peak-tasks/s")
	b.ReportMetric(peak/2, "paced-tasks/s")
	b.ReportMetric(float64(percentile(lat, 50)), "p50-ns")
	b.ReportMetric(float64(percentile(lat, 99)), "p99-ns")
	b.ReportMetric(float64(slices.Max(all[:warmup])), "warmup-max-ns")
	b.ReportMetric(float64(percentile(raw, 50)), "raw-p50-ns")
	b.ReportMetric(float64(percentile(raw, 99)), "raw-p99-ns")
}

// pacedLatencies submits n tasks from c submitters at rate tasks/s in
// all and returns each task's wait from its Submit call to its
// callback's start.
func pacedLatencies(tb testing.TB, n, c int, rate float64) []time.Duration {
	var ran sync.WaitGroup
	_, _, s := pgStore(tb)
	defer s.Close()
	ctx := context.Background()
	rt, _ := workersOver(tb, s, ran.Done)
	defer shutdown(tb, rt)
	lat := make([]time.Duration, n)
	ks := keys(n)
	ran.Add(n)
	pace(n, c, rate, func(i int) {
		at := time.Now()
		_, err := rt.Submit(ctx, ks[i], func(context.Context, *workers.Task) (any, error) {
			lat[i] = time.Since(at)
			ran.Done()
			return nil, nil
		}, alice)
		if err != nil {
			tb.Error(err)
			ran.Done()
		}
	})
	ran.Wait()
	return lat
}

// rawCommitLatencies makes n single-row inserts, each its own
// transaction, from c goroutines at rate inserts/s in all, and returns
// how long each took.
func rawCommitLatencies(tb testing.TB, n, c int, rate float64) []time.Duration {
	admin := pgAdmin(tb)
	table := pgSchema(tb, admin) + ".raw_commits"
	ctx := context.Background()
	if _, err := admin.Exec(ctx, "CREATE TABLE "+table+" (id text PRIMARY KEY, at timestamptz NOT NULL)"); err != nil {
		tb.Fatal(err)
	}
	insert := "INSERT INTO " + table + " (id, at) VALUES ($1, now())"
	lat := make([]time.Duration, n)
	ks := keys(n)
	pace(n, c, rate, func(i int) {
		at := time.Now()
		if _, err := admin.Exec(ctx, insert, ks[i]); err != nil {
			tb.Error(err)
		}
		lat[i] = time.Since(at)
	})
	return lat
}

// pace makes n calls of do, do(0) to do(n-1), from c goroutines at rate
// calls/s in all, each goroutine keeping its own even schedule, and
// returns once every call has returned.
func pace(n, c int, rate float64, do func(i int)) {
	interval := time.Duration(float64(c) / rate * float64(time.Second))
	start := time.Now()
	var wg sync.WaitGroup
	for w := range c {
		wg.Go(func() {
			for i, tick := w, 0; i < n; i, tick = i+c, tick+1 {
				// The load's schedule: this goroutine's next slot.
				time.Sleep(time.Until(start.Add(time.Duration(tick)*interval + time.Duration(w)*interval/time.Duration(c))))
				do(i)
			}
		})
	}
	wg.Wait()
}

var progressTasks = flag.Int("progress-tasks", 3000, "running tasks whose progress BenchmarkPostgresProgress changes at once")

// BenchmarkPostgresProgress is how long the progress of many running
// tasks, changed at once, takes to reach PostgreSQL, where other
// replicas read it: each iteration sets a new value in every task (of
// -progress-tasks) and waits until every record holds it, with
// Config.ProgressInterval at 100 ms (the default is a second) and the
// sync loop out of the way.
func BenchmarkPostgresProgress(b *testing.B) {
	admin, schema, s := pgStore(b)
	defer s.Close()
	ctx := context.Background()
	rt := workers.NewRuntime(s, workers.Config{ProgressInterval: 100 * time.Millisecond, SyncInterval: time.Hour})
	if err := rt.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer shutdown(b, rt)
	n := *progressTasks
	steps := make([]chan int, n)
	for i := range steps {
		steps[i] = make(chan int, 1)
		ch := steps[i]
		if _, err := rt.Submit(ctx, "p"+strconv.Itoa(i), func(_ context.Context, tk *workers.Task) (any, error) {
			for p := range ch {
				tk.SetProgress(p)
			}
			return nil, nil
		}, alice); err != nil {
			b.Fatal(err)
		}
	}
	defer func() {
		for _, ch := range steps {
			close(ch)
		}
	}()
	stored := "SELECT count(*) FROM " + schema + ".workers_tasks WHERE status = 'running' AND progress = $1"
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		p := i%99 + 1
		for _, ch := range steps {
			ch <- p
		}
		for deadline := time.Now().Add(time.Minute); ; {
			var got int
			if err := admin.QueryRow(ctx, stored, p).Scan(&got); err != nil {
				b.Fatal(err)
			}
			if got == n {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("after a minute, %d of %d records hold progress %d", got, n, p)
			}
			time.Sleep(5 * time.Millisecond) // polling the database, with a deadline
		}
	}
}
