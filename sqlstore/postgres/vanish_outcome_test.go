package postgres_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// A record whose run's outcome was lost (a failover to a replica that
// lacked it: the record back at RUNNING after the run ended) names a run
// nobody executes. The instance that ran it finds it not held at its
// next recovery and ends it FAILED as abandoned, which ends a Wait on it
// and a join made through another replica meanwhile; the run's callback
// is not called again, and a submission of the key through the instance
// that ran it registers a new run at once rather than join.
func TestARecordThatLostItsOutcomeIsRecovered(t *testing.T) {
	testDSN(t)
	t.Parallel()
	sc := newScratchT(t)
	rt := workers.NewRuntime(sc.store(t), workers.Config{RecoverInterval: 50 * time.Millisecond})
	shutdownAtCleanup(t, rt)
	peer := workers.NewRuntime(sc.store(t), workers.Config{})
	shutdownAtCleanup(t, peer)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	alice := workers.MustOwner("alice")
	var calls atomic.Int32
	fn := func(context.Context, *workers.Task) (any, error) { calls.Add(1); return "done", nil }
	sub, err := rt.Submit(ctx, "report", fn, alice)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Wait(ctx, sub.ID, alice); err != nil {
		t.Fatal(err)
	}
	sc.exec(t, `UPDATE workers_tasks SET status = 'running', completed_at = NULL, result = NULL, error = '', cause = ''`)
	joined, err := peer.Submit(ctx, "report", fn, alice)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []*workers.Runtime[*postgres.Store]{rt, peer} {
		snap, err := w.Wait(ctx, sub.ID, alice)
		switch {
		case err != nil:
			t.Fatalf("Wait: %v", err)
		case joined.Joined && (snap.Status != workers.StatusFailed || snap.Cause != workers.CauseAbandoned || snap.RunID != sub.RunID):
			t.Fatalf("Wait: %+v; want the run %s FAILED as abandoned", snap, sub.RunID)
		case !joined.Joined && (snap.Status != workers.StatusCompleted || snap.RunID != joined.RunID):
			// The recovery ended the record before the peer's
			// submission, which found it ended and ran the key again:
			// the Waits see that run.
			t.Fatalf("Wait: %+v; want the peer's run %s, registered once the recovery ended %s, COMPLETED", snap, joined.RunID, sub.RunID)
		}
	}
	if joined.Joined && joined.RunID != sub.RunID {
		t.Fatalf("the peer joined run %s, not %s", joined.RunID, sub.RunID)
	}
	again, err := rt.Submit(ctx, "report", fn, alice)
	if err != nil || again.Joined {
		t.Fatalf("a submission after the recovery: %+v, %v", again, err)
	}
	if _, err := rt.Wait(ctx, again.ID, alice); err != nil {
		t.Fatal(err)
	}
	want := int32(2)
	if !joined.Joined {
		want = 3
	}
	if n := calls.Load(); n != want {
		t.Errorf("the callback was called %d times, want %d", n, want)
	}
}
