package postgres_test

import (
	"context"
	"iter"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// A Watch on one replica of a run another replica executes shows that
// run's end, or ends with an error, when the run ends and its key is
// re-run before the watching replica reads the end. It must never go
// from run A's RUNNING straight to run B: Watch's doc promises "ending
// after the terminal one", and Subscribe says Gone in the same case.
func TestWatchAcrossProcessesNeverSkipsARunsEnd(t *testing.T) {
	testDSN(t)
	t.Parallel()
	rt1, rt2 := twoRuntimes(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	alice := workers.MustOwner("alice")
	held := func(started, release chan struct{}) workers.Func {
		return func(ctx context.Context, _ *workers.Task) (any, error) {
			close(started)
			select {
			case <-release:
				return "done", nil
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		}
	}
	startedA, releaseA := make(chan struct{}), make(chan struct{})
	subA, err := rt2.Submit(ctx, "report", held(startedA, releaseA), alice)
	if err != nil {
		t.Fatal(err)
	}
	<-startedA
	next, stop := iter.Pull2(rt1.Watch(ctx, subA.ID, alice))
	defer stop()
	first, err, ok := next()
	if !ok || err != nil || first.RunID != subA.RunID || first.Status != workers.StatusRunning {
		t.Fatalf("first snapshot %+v, %v, %v", first, err, ok)
	}
	// The consumer holds its first snapshot while run A ends and alice
	// submits the report again on the same replica.
	close(releaseA)
	if end, err := rt2.Wait(ctx, subA.ID, alice); err != nil || end.RunID != subA.RunID {
		t.Fatalf("run A's end: %+v, %v", end, err)
	}
	startedB, releaseB := make(chan struct{}), make(chan struct{})
	defer close(releaseB)
	subB, err := rt2.Submit(ctx, "report", held(startedB, releaseB), alice)
	if err != nil {
		t.Fatal(err)
	}
	<-startedB
	snap, err, ok := next()
	switch {
	case !ok:
		t.Fatal("the stream ended with nothing after run A's RUNNING")
	case err != nil:
		return // ended without A's end, and without showing run B
	case snap.RunID != subA.RunID:
		t.Fatalf("after run A's (%s) RUNNING the Watch yielded run %s (%s), never run A's end (run B is %s)", subA.RunID, snap.RunID, snap.Status, subB.RunID)
	case !snap.Status.Terminal():
		t.Fatalf("run A's next snapshot %s, want its end", snap.Status)
	}
}
