package bench

import (
	"flag"
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
)

var queued = flag.Int("queued", 1_000_000, "tasks BenchmarkQueued puts in one sequential queue")

// queuedCost fills one sequential queue with n tasks behind a task that
// blocks the queue's worker, measures what the waiting tasks hold, then
// lets them run and waits for the last. It returns the growth of the live
// heap (after a collection) and of the resident set per queued task.
func queuedCost(tb testing.TB, r runner, n int) (heapPerTask, rssPerTask float64) {
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
	for _, k := range ks {
		submit(k)
	}
	rss1 := rssBytes()
	heap1 := liveHeap()
	close(release)
	wg.Wait()
	// The keys are the caller's, alive throughout: they are counted
	// before the submissions and not charged to the queue.
	runtime.KeepAlive(ks)
	return float64(heap1-heap0) / float64(n), float64(rss1-rss0) / float64(n)
}

// liveHeap collects garbage and returns the bytes in use by the heap.
func liveHeap() int64 {
	runtime.GC()
	debug.FreeOSMemory()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

// BenchmarkQueued puts -queued tasks (10^6 unless told) into one
// sequential queue and runs them: the time per op is the whole batch, and
// the metrics say what each waiting task held (heap-B/task: live heap
// after a collection; rss-B/task: resident set growth). For this library
// a queued task includes its MemStore record. Run it with -benchtime=1x.
func BenchmarkQueued(b *testing.B) {
	for _, r := range []runner{pond1, workersSeq} {
		b.Run("impl="+r.name, func(b *testing.B) {
			var heap, rss float64
			for range b.N {
				h, r := queuedCost(b, r, *queued)
				heap += h
				rss += r
			}
			b.ReportMetric(heap/float64(b.N), "heap-B/task")
			b.ReportMetric(rss/float64(b.N), "rss-B/task")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(*queued), "ns/task")
		})
	}
}
