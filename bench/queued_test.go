package bench

import (
	"flag"
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
	"time"
)

var queued = flag.Int("queued", 1_000_000, "tasks BenchmarkQueued puts in one sequential queue")

// queueCost is what queuedCost measured, per queued task.
type queueCost struct {
	heap, rss   float64 // bytes: live heap growth after a collection, resident set growth
	fill, drain float64 // nanoseconds: submitting, and running once released
}

// queuedCost fills one sequential queue with n tasks behind a task that
// blocks the queue's worker, measures what the waiting tasks hold, then
// lets them run and waits for the last. The collections that measure the
// heap fall between the two timed phases.
func queuedCost(tb testing.TB, r runner, n int) queueCost {
	var wg sync.WaitGroup
	release := make(chan struct{})
	var once sync.Once
	submit, stop := r.open(tb, func() {
		once.Do(func() { <-release }) // the first task blocks the queue
		wg.Done()
	})
	defer stop()
	ks := keys(n + 1)
	heap0, rss0 := liveHeap(), rssBytes()
	wg.Add(n + 1)
	start := time.Now()
	for _, k := range ks {
		submit(k)
	}
	fill := time.Since(start)
	rss1 := rssBytes()
	heap1 := liveHeap()
	start = time.Now()
	close(release)
	wg.Wait()
	drain := time.Since(start)
	// The keys are the caller's, alive throughout: they are counted
	// before the submissions and not charged to the queue.
	runtime.KeepAlive(ks)
	per := func(x float64) float64 { return x / float64(n) }
	return queueCost{
		heap: per(float64(heap1 - heap0)), rss: per(float64(rss1 - rss0)),
		fill: per(float64(fill.Nanoseconds())), drain: per(float64(drain.Nanoseconds())),
	}
}

// liveHeap collects garbage, returns the memory it freed to the system,
// and returns the bytes in use by the heap.
func liveHeap() int64 {
	debug.FreeOSMemory()
	return heapInUse()
}

// heapInUse collects garbage and returns the bytes in use by the heap.
// Unlike liveHeap it leaves the freed memory to the process, so that a
// benchmark measured after it starts with the pages it had.
func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

// BenchmarkQueued puts -queued tasks (10^6 unless told) into one
// sequential queue and runs them: the time per op is the whole batch, and
// the metrics say what each waiting task held (heap-B/task: live heap
// after a collection; rss-B/task: resident set growth) and how long the
// two phases took (fill-ns/task: the submissions; drain-ns/task: the runs,
// once released). For this library a queued task includes its MemStore
// record. Run it with -benchtime=1x.
func BenchmarkQueued(b *testing.B) {
	for _, r := range []runner{pond1, workersSeq} {
		b.Run("impl="+r.name, func(b *testing.B) {
			var sum queueCost
			for range b.N {
				c := queuedCost(b, r, *queued)
				sum.heap += c.heap
				sum.rss += c.rss
				sum.fill += c.fill
				sum.drain += c.drain
			}
			n := float64(b.N)
			b.ReportMetric(sum.heap/n, "heap-B/task")
			b.ReportMetric(sum.rss/n, "rss-B/task")
			b.ReportMetric(sum.fill/n, "fill-ns/task")
			b.ReportMetric(sum.drain/n, "drain-ns/task")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(*queued), "ns/task")
		})
	}
}
