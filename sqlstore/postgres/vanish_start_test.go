package postgres_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// A running task whose record went back to PENDING under its own run id
// (a failover to a replica that lacked the write of its start) is still
// that run's: its outcome lands over it, and is what Wait returns,
// instead of being fenced out as if the record had moved on, which left
// the record PENDING until recovery ended it FAILED as abandoned. So does
// a retry's write.
func TestAnOutcomeLandsOverItsRunsLostStart(t *testing.T) {
	testDSN(t)
	t.Parallel()
	for _, name := range []string{"outcome", "retry"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			sc := newScratchT(t)
			rt := workers.NewRuntime(sc.store(t), workers.Config{
				SyncInterval: 20 * time.Millisecond, RecoverInterval: 20 * time.Millisecond,
			})
			shutdownAtCleanup(t, rt)
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			alice := workers.MustOwner("alice")
			started, release := make(chan struct{}), make(chan struct{})
			var calls atomic.Int32
			sub, err := rt.Submit(ctx, "report", func(ctx context.Context, _ *workers.Task) (any, error) {
				if calls.Add(1) == 1 {
					close(started)
					<-release
					if name == "retry" {
						return nil, context.DeadlineExceeded // an error worth a retry
					}
				}
				return "done", nil
			}, alice, workers.WithRetry(workers.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond}))
			if err != nil {
				t.Fatal(err)
			}
			<-started
			sc.exec(t, `UPDATE workers_tasks SET status = 'pending', started_at = NULL, attempt = 0`)
			close(release)
			snap, err := rt.Wait(ctx, sub.ID, alice)
			if err != nil {
				t.Fatal(err)
			}
			if snap.RunID != sub.RunID || snap.Status != workers.StatusCompleted || string(snap.Result) != `"done"` {
				t.Fatalf("the run ended %s (%s: %s) with %s, want its own outcome, COMPLETED with \"done\"", snap.Status, snap.Cause, snap.Error, snap.Result)
			}
			if want := map[string]int{"outcome": 1, "retry": 2}[name]; int(calls.Load()) != want || snap.Attempt != want {
				t.Errorf("the callback was called %d times, the record says attempt %d; want %d", calls.Load(), snap.Attempt, want)
			}
		})
	}
}
