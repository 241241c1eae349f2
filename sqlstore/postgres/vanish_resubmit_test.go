package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// A submission of a key whose record vanished while its run executes
// here (a failover to a replica that never had the row: no notice
// announces it, and the sync loop has not read it yet) registers a new run, never joining the old one, and cancels
// the old run at once with ErrSuperseded: the two callbacks do not run
// on side by side until the next sync.
func TestASubmissionAfterADeleteSupersedesTheRunStillExecuting(t *testing.T) {
	testDSN(t)
	t.Parallel()
	sc := newScratchT(t)
	rt := workers.NewRuntime(sc.store(t), workers.Config{SyncInterval: time.Hour})
	shutdownAtCleanup(t, rt)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	alice := workers.MustOwner("alice")
	old, _, cause := startBlocked(t, rt, "report", alice) // released only by its context
	sc.vanish(t, `true`)
	sub, err := rt.Submit(ctx, "report", func(context.Context, *workers.Task) (any, error) { return "new", nil }, alice)
	if err != nil {
		t.Fatal(err)
	}
	if sub.Joined || sub.RunID == old.RunID {
		t.Fatalf("the submission %+v joined the run %s whose record was deleted", sub, old.RunID)
	}
	select {
	case c := <-cause:
		if !errors.Is(c, workers.ErrSuperseded) {
			t.Errorf("the old run was cancelled with %v, want ErrSuperseded", c)
		}
	case <-ctx.Done():
		t.Fatal("the old run was never cancelled")
	}
	snap, err := rt.Wait(ctx, sub.ID, alice)
	if err != nil || snap.RunID != sub.RunID || snap.Status != workers.StatusCompleted || string(snap.Result) != `"new"` {
		t.Fatalf("the new run: %+v, %v", snap, err)
	}
}
