// Package sqltest holds what the SQL stores' tests share: the benchmark
// fixture's layout, the benchmarks themselves, and checks the
// conformance suite does not make because they only bite with a real
// database's concurrency.
//
// RunProcesses runs the scenarios that need several OS processes sharing
// one database: concurrent joins and re-runs, a process killed mid-run,
// a cancel served by a process that does not run the task.
package sqltest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// The benchmark fixture: record i of n has the id TaskID(i), owned by
// Owner(i), with run id RunID(i) and one watcher, Watcher(i, n). Every user
// owns TasksPerUser records and watches TasksPerUser others, so a user
// sees 2*TasksPerUser records however large the table. One record in
// RunningEvery is RUNNING; the others are COMPLETED.
const (
	TasksPerUser = 10
	RunningEvery = 100
)

// TaskID returns the id of fixture record i.
func TaskID(i int) string { return Owner(i) + "::k" + strconv.Itoa(i) }

// Owner returns the owner of fixture record i.
func Owner(i int) string { return "u" + strconv.Itoa(i/TasksPerUser) }

// Watcher returns the one watcher of fixture record i of n: the next
// user's id, so that every user watches the previous user's records.
func Watcher(i, n int) string {
	return "u" + strconv.Itoa((i/TasksPerUser+1)%(n/TasksPerUser))
}

// Status returns the status of fixture record i.
func Status(i int) workers.Status {
	if i%RunningEvery == 0 {
		return workers.StatusRunning
	}
	return workers.StatusCompleted
}

// CheckFixture reports whether s holds what the fixture functions say,
// sampling a few records, so that seeding SQL and this layout agree.
func CheckFixture(ctx context.Context, s workers.Store, n int) error {
	for _, i := range []int{0, 1, n / 2, n - 1} {
		r, err := s.GetTask(ctx, TaskID(i))
		if err != nil {
			return fmt.Errorf("fixture record %d: %w", i, err)
		}
		if r.RunID != RunID(i) || r.Status != Status(i) || len(r.Watchers) != 1 || r.Watchers[0] != Watcher(i, n) {
			return fmt.Errorf("fixture record %d is %+v", i, r)
		}
	}
	recs, err := s.ListTasks(ctx, workers.Filter{VisibleTo: Owner(n / 2)})
	if err != nil {
		return err
	}
	if len(recs) != 2*TasksPerUser {
		return fmt.Errorf("fixture user %s sees %d records, want %d", Owner(n/2), len(recs), 2*TasksPerUser)
	}
	return nil
}

// RunID returns the run id of fixture record i.
func RunID(i int) string { return "r" + strconv.Itoa(i) }

// Sizes returns the fixture sizes to benchmark: 10^4 records, and 10^6
// as well when the environment sets WORKERS_BENCH_LARGE=1.
func Sizes() []int {
	if os.Getenv("WORKERS_BENCH_LARGE") == "1" {
		return []int{1e4, 1e6}
	}
	return []int{1e4}
}

// Fixtures builds one seeded store per size, once per test binary, so
// that -count and several benchmarks share the seeding cost.
type Fixtures struct {
	// Seed returns a store holding the n fixture records, and the
	// function that drops and closes it.
	Seed func(ctx context.Context, n int) (workers.Store, func(), error)

	mu     sync.Mutex
	stores map[int]workers.Store // guarded by mu
	drops  []func()              // guarded by mu
}

// Get returns the fixture store of n records, seeding it on first use.
func (f *Fixtures) Get(b *testing.B, n int) workers.Store {
	b.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if s, ok := f.stores[n]; ok {
		return s
	}
	ctx := context.Background()
	s, drop, err := f.Seed(ctx, n)
	if err == nil {
		if err = CheckFixture(ctx, s, n); err != nil {
			drop()
		}
	}
	if err != nil {
		b.Fatalf("seed %d records: %v", n, err)
	}
	if f.stores == nil {
		f.stores = make(map[int]workers.Store)
	}
	f.stores[n] = s
	f.drops = append(f.drops, drop)
	return s
}

// Close drops every fixture. Call it after the tests ran.
func (f *Fixtures) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, drop := range f.drops {
		drop()
	}
	f.stores, f.drops = nil, nil
}

// Main wraps a test binary's testing.M so that Run drops the fixtures
// before goleak looks for leaked goroutines.
type Main struct {
	M        *testing.M
	Fixtures *Fixtures
}

// Run runs the tests, then closes the fixtures.
func (m Main) Run() int {
	defer m.Fixtures.Close()
	return m.M.Run()
}

// picks returns 1024 random fixture indexes below n that keep allows.
func picks(n int, keep func(int) bool) []int {
	r := rand.New(rand.NewPCG(1, 2))
	out := make([]int, 0, 1024)
	for len(out) < cap(out) {
		if i := r.IntN(n); keep(i) {
			out = append(out, i)
		}
	}
	return out
}

func each(b *testing.B, f *Fixtures, body func(b *testing.B, s workers.Store, n int)) {
	for _, n := range Sizes() {
		b.Run("records="+strconv.Itoa(n), func(b *testing.B) {
			body(b, f.Get(b, n), n)
		})
	}
}

// BenchmarkGetTask measures a status read: one primary-key lookup.
func BenchmarkGetTask(b *testing.B, f *Fixtures) {
	each(b, f, func(b *testing.B, s workers.Store, n int) {
		ids := picks(n, func(int) bool { return true })
		ctx := b.Context()
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, err := s.GetTask(ctx, TaskID(ids[i%len(ids)])); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

// BenchmarkListVisibleTo measures listing one user's tasks, which should
// cost the same at any table size.
func BenchmarkListVisibleTo(b *testing.B, f *Fixtures) {
	each(b, f, func(b *testing.B, s workers.Store, n int) {
		users := picks(n, func(int) bool { return true })
		ctx := b.Context()
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			recs, err := s.ListTasks(ctx, workers.Filter{VisibleTo: Owner(users[i%len(users)])})
			if err != nil {
				b.Fatal(err)
			}
			if len(recs) != 2*TasksPerUser {
				b.Fatalf("listed %d records, want %d", len(recs), 2*TasksPerUser)
			}
			i++
		}
	})
}

// BenchmarkListPage measures the second page, newest first, of one
// user's tasks in pages of 5: a keyset read that should cost the same at
// any table size and any history.
func BenchmarkListPage(b *testing.B, f *Fixtures) {
	each(b, f, func(b *testing.B, s workers.Store, n int) {
		users := picks(n, func(int) bool { return true })
		ctx := b.Context()
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			// The owner of record r owns the TasksPerUser records from
			// first; the page starts after its fifth newest.
			r := users[i%len(users)]
			first := r / TasksPerUser * TasksPerUser
			after := Position(first + TasksPerUser - 5)
			recs, err := s.ListTasks(ctx, workers.Filter{VisibleTo: Owner(r), Order: workers.NewestFirst, After: &after, Limit: 5})
			if err != nil {
				b.Fatal(err)
			}
			if len(recs) != 5 {
				b.Fatalf("listed %d records, want 5", len(recs))
			}
			i++
		}
	})
}

// BenchmarkTransitionTask measures a fenced state write: one
// conditional UPDATE.
func BenchmarkTransitionTask(b *testing.B, f *Fixtures) {
	running := []workers.Status{workers.StatusRunning}
	each(b, f, func(b *testing.B, s workers.Store, n int) {
		ids := picks(n, func(i int) bool { return i%RunningEvery == 0 })
		ctx := b.Context()
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			id := ids[i%len(ids)]
			next := workers.State{Status: workers.StatusRunning, Progress: i % 100, Attempt: 1}
			ok, err := s.TransitionTask(ctx, TaskID(id), RunID(id), running, next)
			if err != nil || !ok {
				b.Fatalf("TransitionTask(%q) = %v, %v", TaskID(id), ok, err)
			}
			i++
		}
	})
}

// inserted numbers the records BenchmarkInsertTask adds, across runs.
var inserted atomic.Int64

// BenchmarkInsertTask measures a submission's insert, with the owner and
// one other watcher.
func BenchmarkInsertTask(b *testing.B, f *Fixtures) {
	each(b, f, func(b *testing.B, s workers.Store, n int) {
		ctx := b.Context()
		b.ReportAllocs()
		for b.Loop() {
			k := inserted.Add(1)
			rec := workers.Record{
				ID:       fmt.Sprintf("bench::new%d", k),
				RunID:    fmt.Sprintf("bench-run%d", k),
				Watchers: []string{"bench", "svc"},
				State:    workers.State{Status: workers.StatusPending},
			}
			if err := s.InsertTask(ctx, rec); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// Position returns the listing position of fixture record i: the seeds
// create record i at 2025-01-01 UTC plus i milliseconds.
func Position(i int) workers.Position {
	return workers.Position{CreatedAt: time.Date(2025, time.January, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Millisecond), ID: TaskID(i)}
}
