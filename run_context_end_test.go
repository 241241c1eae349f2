package workers

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A callback that hands its context to work that outlives the call
// (a watcher goroutine, a context.AfterFunc, a client stream that is
// released when its context ends) relies on the context ending once the
// run is over, as a net/http handler's request context does when
// ServeHTTP returns. A run's context that is never cancelled after the
// run completes keeps all of that alive for good: one goroutine, or one
// registration, per task ever run.
func TestARunsContextEndsOnceTheRunHasSettled(t *testing.T) {
	rt := memRuntime(t)
	released := make(chan struct{}) // closed when the run's context ends
	stop := make(chan struct{})     // ends the watcher when the test does
	t.Cleanup(func() { close(stop) })
	sub, err := rt.Submit(ctx, "job", func(ctx context.Context, _ *Task) (any, error) {
		go func() {
			select {
			case <-ctx.Done():
				close(released)
			case <-stop:
			}
		}()
		return "done", nil
	}, alice)
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, settled(t, rt, sub.ID).Status)
	select {
	case <-released:
	case <-time.After(5 * time.Second):
		t.Fatal("the run completed and settled, but its context never ended: whatever the callback tied to it is left behind")
	}
}
