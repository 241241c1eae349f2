package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// An instance whose lease row is deleted (an operator's DELETE, a
// failover to a replica that lacked the lease) may have been taken for
// dead, and its runs recovered, by any replica: at its next renewal,
// which finds no lease to extend, it abandons its runs, as when its
// lease expired. The run's callback is cancelled with ErrAbandoned and
// called once; its record ends FAILED as abandoned, and a submission of
// the key afterwards registers a new run rather than join the old one.
func TestALeaseRowDeletedAbandonsTheRuns(t *testing.T) {
	testDSN(t)
	t.Parallel()
	sc := newScratchT(t)
	rt := workers.NewRuntime(sc.store(t), workers.Config{LeaseInterval: 50 * time.Millisecond, LeaseTTL: 10 * time.Second})
	shutdownAtCleanup(t, rt)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	alice := workers.MustOwner("alice")
	started := make(chan struct{}, 2)
	cause := make(chan error, 2)
	sub, err := rt.Submit(ctx, "report", func(ctx context.Context, _ *workers.Task) (any, error) {
		started <- struct{}{}
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return nil, context.Cause(ctx)
	}, alice)
	if err != nil {
		t.Fatal(err)
	}
	<-started
	sc.exec(t, `DELETE FROM workers_leases`)
	select {
	case c := <-cause:
		if !errors.Is(c, workers.ErrAbandoned) {
			t.Errorf("the run was cancelled with %v, want ErrAbandoned", c)
		}
	case <-ctx.Done():
		t.Fatal("the run of an instance whose lease row was deleted was never abandoned")
	}
	snap, err := rt.Wait(ctx, sub.ID, alice)
	if err != nil || snap.Status != workers.StatusFailed || snap.Cause != workers.CauseAbandoned {
		t.Fatalf("the record: %+v, %v; want FAILED, abandoned", snap, err)
	}
	again, err := rt.Submit(ctx, "report", func(context.Context, *workers.Task) (any, error) { return "again", nil }, alice)
	if err != nil || again.Joined || again.RunID == sub.RunID {
		t.Fatalf("the submission after: %+v, %v; want a new run", again, err)
	}
	if end, err := rt.Wait(ctx, again.ID, alice); err != nil || end.Status != workers.StatusCompleted {
		t.Fatalf("the new run: %+v, %v", end, err)
	}
	if len(started) != 0 {
		t.Error("the abandoned run's callback was called again")
	}
}
