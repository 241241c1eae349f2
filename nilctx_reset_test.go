package workers

import (
	"context"
	"testing"
	"time"
)

// A Reset made with a nil context must not lose the queue items it took:
// they must still be recorded CANCELLED (or stay queued), and Shutdown
// must then settle everything.
func TestNilContextResetLosesNoQueueItem(t *testing.T) {
	rt := NewRuntime(NewMemStore(), Config{})
	ctx := t.Context()
	started, release := make(chan struct{}), make(chan struct{})
	block := func(context.Context, *Task) (any, error) { close(started); <-release; return nil, nil }
	nop := func(context.Context, *Task) (any, error) { return nil, nil }
	if _, err := rt.SubmitSequential(ctx, "q", "first", block, alice); err != nil {
		t.Fatal(err)
	}
	<-started
	second, err := rt.SubmitSequential(ctx, "q", "second", nop, alice)
	if err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() { _ = recover() }()
		var nilCtx context.Context
		err := rt.Reset(nilCtx) //nolint:staticcheck // SA1012: the nil context is the point
		t.Logf("Reset with a nil context returned %v", err)
	}()
	close(release)
	sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := rt.Shutdown(sctx); err != nil {
		t.Errorf("Shutdown after a Reset with a nil context: %v", err)
	}
	snap, err := rt.Status(ctx, second.ID, alice)
	if err != nil {
		t.Fatal(err)
	}
	if !snap.Status.Terminal() {
		t.Errorf("the queue item Reset took is %s after Shutdown", snap.Status)
	}
}
