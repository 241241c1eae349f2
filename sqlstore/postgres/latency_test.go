package postgres_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// polled hides the store's Notifier: a runtime over it learns of other
// runtimes' writes by polling only.
type polled struct {
	workers.Store
	workers.Leaser
}

// latencyPoll is the polling interval of the polling variants: the sync
// loop's interval, equal to Wait's fixed poll of a remote task (50ms).
const latencyPoll = 50 * time.Millisecond

// replicaPair returns two runtimes over two stores (two pools, as two
// processes would have) on one set of tables: runner runs the tasks,
// remote cancels or waits for them. With notices false, neither store
// notifies, and runner has a sync loop of latencyPoll.
func replicaPair(b *testing.B, notices bool) (runner, remote *workers.Runtime[workers.Store]) {
	sc := newScratchT(b)
	stores := [2]workers.Store{}
	for i := range stores {
		s, err := postgres.Open(b.Context(), testDSN(b), postgres.WithSchema(sc.schema))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		if err := s.Migrate(b.Context()); err != nil {
			b.Fatal(err)
		}
		stores[i] = s
		if !notices {
			stores[i] = polled{s, s}
		}
	}
	cfg := workers.Config{}
	if !notices {
		cfg.SyncInterval = latencyPoll
	}
	rts := [2]*workers.Runtime[workers.Store]{}
	for i := range rts {
		rts[i] = workers.NewRuntime(stores[i], cfg)
		if err := rts[i].Start(b.Context()); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := rts[i].Shutdown(ctx); err != nil {
				b.Error(err)
			}
		})
	}
	return rts[0], rts[1]
}

// reportLatency reports the p50 and p99 of ds in milliseconds.
func reportLatency(b *testing.B, ds []time.Duration) {
	slices.Sort(ds)
	at := func(q float64) float64 {
		return float64(ds[min(len(ds)-1, int(q*float64(len(ds))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(at(0.50), "p50-ms")
	b.ReportMetric(at(0.99), "p99-ms")
	b.ReportMetric(0, "ns/op") // the loop's time is the latencies', less telling
}

// BenchmarkCrossCancel measures how long a cancel made by one runtime
// takes to cancel the callback another runtime (over its own pool) runs:
// by a notice, or by the runner's sync loop.
func BenchmarkCrossCancel(b *testing.B) {
	for _, notices := range []bool{true, false} {
		b.Run(map[bool]string{true: "notices", false: "polling"}[notices], func(b *testing.B) {
			runner, remote := replicaPair(b, notices)
			alice := workers.MustOwner("alice")
			ctx := b.Context()
			var ds []time.Duration
			i := 0
			for b.Loop() {
				i++
				started, interrupted := make(chan struct{}), make(chan time.Time, 1)
				sub, err := runner.Submit(ctx, "cancel-"+strconv.Itoa(i), func(ctx context.Context, _ *workers.Task) (any, error) {
					close(started)
					<-ctx.Done()
					interrupted <- time.Now()
					return nil, context.Cause(ctx)
				}, alice)
				if err != nil {
					b.Fatal(err)
				}
				<-started
				at := time.Now()
				if err := remote.Cancel(ctx, sub.ID, alice); err != nil {
					b.Fatal(err)
				}
				ds = append(ds, (<-interrupted).Sub(at))
			}
			reportLatency(b, ds)
		})
	}
}

// BenchmarkCrossWait measures how long a Wait in one runtime takes to
// return after the task another runtime runs has ended: woken by a
// notice, or by Wait's poll.
func BenchmarkCrossWait(b *testing.B) {
	for _, notices := range []bool{true, false} {
		b.Run(map[bool]string{true: "notices", false: "polling"}[notices], func(b *testing.B) {
			runner, remote := replicaPair(b, notices)
			alice := workers.MustOwner("alice")
			ctx := b.Context()
			var ds []time.Duration
			i := 0
			for b.Loop() {
				i++
				started, release := make(chan struct{}), make(chan struct{})
				sub, err := runner.Submit(ctx, "wait-"+strconv.Itoa(i), func(ctx context.Context, _ *workers.Task) (any, error) {
					close(started)
					<-release
					return "done", nil
				}, alice)
				if err != nil {
					b.Fatal(err)
				}
				<-started
				waited := make(chan error, 1)
				go func() {
					_, err := remote.Wait(ctx, sub.ID, alice)
					waited <- err
				}()
				// One round trip of the remote runtime's, so that its Wait
				// has most likely read the record and is waiting.
				if _, err := remote.Status(ctx, sub.ID, alice); err != nil {
					b.Fatal(err)
				}
				at := time.Now()
				close(release)
				if err := <-waited; err != nil {
					b.Fatal(err)
				}
				ds = append(ds, time.Since(at))
			}
			reportLatency(b, ds)
		})
	}
}
