package bench

import (
	"sync"
	"testing"
	"time"
)

// The smoke tests run every harness body on a few tasks, so that the
// benchmarks cannot rot between the runs that measure; they assert what
// the harness relies on, never a speed.

func TestRunnersRunEveryTask(t *testing.T) {
	for _, r := range []runner{raw, registry, pondPool, antsPool, workersAsync, chanWorker, pond1, workersSeq} {
		t.Run(r.name, func(t *testing.T) {
			var mu sync.Mutex
			ran := 0
			var wg sync.WaitGroup
			submit, stop := r.open(t, func() {
				mu.Lock()
				ran++
				mu.Unlock()
				wg.Done()
			})
			const n = 50
			wg.Add(n)
			for _, k := range keys(n) {
				submit(k)
			}
			wg.Wait()
			stop()
			if ran != n {
				t.Fatalf("ran %d tasks, want %d", ran, n)
			}
		})
	}
}

func TestLatenciesOnePerTask(t *testing.T) {
	lat := latencies(t, workersAsync, 20, 0)
	if len(lat) != 20 {
		t.Fatalf("got %d latencies, want 20", len(lat))
	}
	if p50, p99 := percentile(lat, 50), percentile(lat, 99); p50 <= 0 || p99 < p50 {
		t.Fatalf("p50 %v, p99 %v", p50, p99)
	}
}

func TestQueuedCostCountsTheBacklog(t *testing.T) {
	for _, r := range []runner{pond1, workersSeq} {
		c := queuedCost(t, r, 2000)
		if c.heap <= 0 {
			t.Errorf("%s: %v heap bytes per queued task; the backlog must show", r.name, c.heap)
		}
		if c.fill <= 0 || c.drain <= 0 {
			t.Errorf("%s: fill %v ns, drain %v ns per task; both phases take time", r.name, c.fill, c.drain)
		}
	}
}

func TestPercentile(t *testing.T) {
	d := []time.Duration{5, 1, 4, 2, 3}
	if got := percentile(d, 50); got != 3 {
		t.Errorf("p50 = %v, want 3", got)
	}
	if got := percentile(d, 100); got != 5 {
		t.Errorf("p100 = %v, want 5", got)
	}
	if got := percentile(nil, 50); got != 0 {
		t.Errorf("p50 of nothing = %v, want 0", got)
	}
	if rssBytes() <= 0 {
		t.Error("no resident set size read")
	}
}

func TestDurableSystemsComplete(t *testing.T) {
	systems := []durable{{"workers-sqlite", workersSQLite}, {"river-sqlite", riverSQLite(8, time.Millisecond)}}
	for _, s := range pgSystems() {
		if s.d.name == "workers-seq8" || s.d.name == "river-cooldown1ms-w8" {
			systems = append(systems, s.d)
		}
	}
	for _, d := range systems {
		t.Run(d.name, func(t *testing.T) {
			if d.name != "workers-sqlite" && d.name != "river-sqlite" {
				pgURL(t)
			}
			durableRun(t, d, 20, 4, keys(20))
		})
	}
}
