package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// A Cancel of a running task whose record vanished behind the
// runtime's back, with no notice of it (a failover to a replica that
// never had the row), returns ErrNotFound, and cancels the run now with
// ErrDeleted, as the sync loop would at its next pass (an hour away
// here): the callback is told at once, and a Wait on the run ends.
func TestCancelOfARunningTaskWhoseRecordIsDeleted(t *testing.T) {
	testDSN(t)
	t.Parallel()
	sc := newScratchT(t)
	store := sc.store(t)
	rt := workers.NewRuntime(store, workers.Config{SyncInterval: time.Hour})
	shutdownAtCleanup(t, rt)
	// The listener is up before the run registers: its first connection's
	// resync, which reads every run's record, does not find the delete.
	waitFor(t, func() bool { return listeners(t, sc, store) == 1 })
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	alice := workers.MustOwner("alice")
	sub, _, cause := startBlocked(t, rt, "report", alice) // released only by its context
	sc.vanish(t, `true`)
	if err := rt.Cancel(ctx, sub.ID, workers.MustOwner("mallory")); !errors.Is(err, workers.ErrNotFound) {
		t.Errorf("Cancel by a stranger: %v, want ErrNotFound", err)
	}
	select {
	case c := <-cause:
		t.Fatalf("a stranger's Cancel cancelled the run (%v)", c)
	default: // the root package's test pins this without a race
	}
	if err := rt.Cancel(ctx, sub.ID, alice); !errors.Is(err, workers.ErrNotFound) {
		t.Errorf("Cancel: %v, want ErrNotFound", err)
	}
	select {
	case c := <-cause:
		if !errors.Is(c, workers.ErrDeleted) {
			t.Errorf("the run was cancelled with %v, want ErrDeleted", c)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the callback runs on past a Cancel that found its record deleted")
	}
	if _, err := rt.Wait(ctx, sub.ID, alice); !errors.Is(err, workers.ErrNotFound) {
		t.Errorf("Wait: %v, want ErrNotFound", err)
	}
}
