package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/taskgate/workers"
)

// Held rows and a spike of slow reads at once: the outcome writes of the
// held rows wait on their rows, on half the pool's connections, while the
// reads take their turns for the rest; the lease's renewals still get a
// connection in time, so the replica keeps its lease and its other run.
func TestHeldRowsAndASpikeOfReadsDoNotCostTheReplicaItsLease(t *testing.T) {
	sc := newScratchT(t)
	rt, logs, conns := slowReadRuntime(t, sc)
	var held []pgx.Tx
	stop := func() {}
	defer func() {
		stop()
		for _, tx := range held { // the rows go first: Shutdown then settles every run
			_ = tx.Rollback(context.Background())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := rt.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	}()
	alice := workers.MustOwner("alice")

	done, err := rt.Submit(t.Context(), "done", func(context.Context, *workers.Task) (any, error) { return "ok", nil }, alice)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Wait(t.Context(), done.ID, alice); err != nil {
		t.Fatal(err)
	}
	bystander, release := heldRuns(t, sc, rt, alice, conns, &held)

	readers := 8 * conns
	stop = floodReads(t, rt, readers, done.ID, alice)
	release() // each outcome write waits on its held row

	select {
	case err := <-bystander:
		t.Fatalf("with %d task rows held elsewhere and %d slow reads at once over a pool of %d, the replica's other run was cancelled: %v\n%s",
			conns, readers, conns, err, grepLines(logs.String(), "lease"))
	case <-time.After(3 * time.Second): // three lease lengths
	}
}
