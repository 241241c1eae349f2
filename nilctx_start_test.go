package workers

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A Start made with a nil context (a programmer's error, which panics or
// is refused) must not leave the runtime marked started: Start
// promises that a Start that failed may be called again, and a retry
// with a real context must start what Start starts.
func TestNilContextStartCanBeRetried(t *testing.T) {
	rt := NewRuntime(NewMemStore(), Config{})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := rt.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	func() {
		defer func() { _ = recover() }()
		var nilCtx context.Context
		err := rt.Start(nilCtx) //nolint:staticcheck // SA1012: the nil context is the point
		t.Logf("Start with a nil context returned %v", err)
	}()
	if err := rt.Start(t.Context()); err != nil {
		if errors.Is(err, ErrStarted) {
			t.Fatalf("Start after a Start with a nil context: %v, though nothing was started", err)
		}
		t.Fatalf("Start: %v", err)
	}
}
