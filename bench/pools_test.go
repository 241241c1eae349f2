package bench

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/alitto/pond/v2"
	"github.com/panjf2000/ants/v2"
	"github.com/taskgate/workers"
)

// A runner runs fn once per submit call. open builds it around the one
// function every task of a benchmark runs, so that no runner allocates a
// closure per task on the harness's behalf; keys are the task keys a
// runner that needs them uses, one per submit, built before the clock
// starts.
type runner struct {
	name string
	open func(tb testing.TB, fn func()) (submit func(key string), close func())
}

var alice = workers.MustOwner("alice")

// raw is the floor: a goroutine per task.
var raw = runner{"raw", func(tb testing.TB, fn func()) (func(string), func()) {
	return func(string) { go fn() }, func() {}
}}

// registry is the least a task library that registers its tasks by key
// does, written out by hand as a reference, not a library: it joins an
// id, allocates a record and a run, inserts the record in a map under a
// mutex unless its key is taken, appends it to a list, and hands the run
// to a parked goroutine. It has no authorization, validation, run id,
// context, index by owner, fencing or handle, so it is a floor for
// BenchmarkIdleLatency, not a peer: it shows how much of the wait any
// registering library pays before its own work starts.
var registry = runner{"registry", func(tb testing.TB, fn func()) (func(string), func()) {
	type record struct {
		id, owner string
		created   int64
		status    int
	}
	type run struct {
		rec *record
		fn  func()
	}
	var mu sync.Mutex
	recs := map[string]*record{}
	var list []*record
	work := make(chan *run)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for r := range work {
			r.fn()
		}
	}()
	return func(key string) {
		rec := &record{id: "alice::" + key, owner: "alice", created: time.Now().UnixMicro()}
		mu.Lock()
		if recs[rec.id] != nil {
			mu.Unlock()
			tb.Errorf("key %q taken", key)
			return
		}
		recs[rec.id] = rec
		list = append(list, rec)
		mu.Unlock()
		work <- &run{rec, fn}
	}, func() { close(work); <-done }
}}

// pondPool is pond/v2 with no limit, as its README's first example, and
// Submit, which returns a future.
var pondPool = runner{"pond", func(tb testing.TB, fn func()) (func(string), func()) {
	p := pond.NewPool(0)
	return func(string) { p.Submit(fn) }, p.StopAndWait
}}

// pond1 is pond/v2 with one worker: a sequential queue.
var pond1 = runner{"pond-1worker", func(tb testing.TB, fn func()) (func(string), func()) {
	p := pond.NewPool(1)
	return func(string) { p.Submit(fn) }, p.StopAndWait
}}

// antsPool is ants with its default pool size.
var antsPool = runner{"ants", func(tb testing.TB, fn func()) (func(string), func()) {
	p, err := ants.NewPool(ants.DefaultAntsPoolSize)
	if err != nil {
		tb.Fatal(err)
	}
	return func(string) {
			if err := p.Submit(fn); err != nil {
				tb.Error(err)
			}
		}, func() {
			if err := p.ReleaseTimeout(10 * time.Second); err != nil {
				tb.Error(err)
			}
		}
}}

// workersRuntime opens a Runtime over a fresh MemStore.
func workersRuntime(tb testing.TB, fn func()) (*workers.Runtime[*workers.MemStore], workers.Func, func()) {
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	task := func(context.Context, *workers.Task) (any, error) { fn(); return nil, nil }
	return rt, task, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rt.Shutdown(ctx); err != nil {
			tb.Error(err)
		}
	}
}

// workersAsync is this library's Runtime.Submit on a MemStore.
var workersAsync = runner{"workers", func(tb testing.TB, fn func()) (func(string), func()) {
	rt, task, stop := workersRuntime(tb, fn)
	ctx := context.Background()
	return func(key string) {
		if _, err := rt.Submit(ctx, key, task, alice); err != nil {
			tb.Error(err)
		}
	}, stop
}}

// workersSeq is this library's Runtime.SubmitSequential on one queue.
var workersSeq = runner{"workers-seq", func(tb testing.TB, fn func()) (func(string), func()) {
	rt, task, stop := workersRuntime(tb, fn)
	ctx := context.Background()
	return func(key string) {
		if _, err := rt.SubmitSequential(ctx, "q", key, task, alice); err != nil {
			tb.Error(err)
		}
	}, stop
}}

// chanWorker is the floor of a sequential queue: one goroutine reading
// a buffered channel.
var chanWorker = runner{"chan-1worker", func(tb testing.TB, fn func()) (func(string), func()) {
	ch := make(chan struct{}, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range ch {
			fn()
		}
	}()
	return func(string) { ch <- struct{}{} }, func() { close(ch); <-done }
}}

// keys returns n distinct task keys.
func keys(n int) []string {
	k := make([]string, n)
	for i := range k {
		k[i] = strconv.Itoa(i)
	}
	return k
}

// throughput submits n tasks through r and returns when every one has run.
// The clock covers submission and completion. The metric kept-B/task is
// the heap the tasks left in use once every one ran, after a collection:
// a store's records, for this library.
func throughput(b *testing.B, r runner) {
	var wg sync.WaitGroup
	submit, stop := r.open(b, wg.Done)
	defer stop()
	ks := keys(b.N)
	heap0 := heapInUse()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		wg.Add(1)
		submit(ks[i])
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(heapInUse()-heap0)/float64(b.N), "kept-B/task")
	runtime.KeepAlive(ks) // in heap0: counted neither way
}

// BenchmarkAsync is in-memory submit-to-completion of a trivial task:
// this library's Submit beside a goroutine per task, pond and ants.
func BenchmarkAsync(b *testing.B) {
	for _, r := range []runner{raw, pondPool, antsPool, workersAsync} {
		b.Run("impl="+r.name, func(b *testing.B) { throughput(b, r) })
	}
}

// BenchmarkSequential is a sequential queue: this library's
// SubmitSequential beside pond with one worker and a channel with one
// reader.
func BenchmarkSequential(b *testing.B) {
	for _, r := range []runner{chanWorker, pond1, workersSeq} {
		b.Run("impl="+r.name, func(b *testing.B) { throughput(b, r) })
	}
}

// latencies submits n tasks one at a time, each once the previous one
// ran, and returns how long each waited from its submit call to the start
// of its callback.
func latencies(tb testing.TB, r runner, n int, pause time.Duration) []time.Duration {
	var start time.Time
	lat := make([]time.Duration, 0, n)
	ran := make(chan struct{})
	submit, stop := r.open(tb, func() {
		lat = append(lat, time.Since(start)) // ordered by ran: one task at a time
		ran <- struct{}{}
	})
	defer stop()
	ks := keys(n)
	for i := range n {
		if pause > 0 {
			time.Sleep(pause) // idle between tasks: the point of the measurement
		}
		start = time.Now()
		submit(ks[i])
		<-ran
	}
	return lat
}

// BenchmarkIdleLatency is the wait from an idle submit to the start of
// its callback, as p50 and p99 metrics (ns). Each task is submitted
// after the previous one ran and a sleep of 20 µs, so every pool is idle;
// on a Linux kernel that wakes sleepers to the millisecond, most sleeps
// last about a millisecond, which leaves the caches cold. registry is
// the floor any library that registers its tasks pays (see registry).
func BenchmarkIdleLatency(b *testing.B) {
	for _, r := range []runner{raw, registry, pondPool, antsPool, workersAsync} {
		b.Run("impl="+r.name, func(b *testing.B) {
			b.ReportAllocs()
			lat := latencies(b, r, b.N, 20*time.Microsecond)
			b.ReportMetric(float64(percentile(lat, 50)), "p50-ns")
			b.ReportMetric(float64(percentile(lat, 99)), "p99-ns")
		})
	}
}
