package workers

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// One caller polling Status never sees a task go back: once it was shown
// RUNNING at 80%, a later Status shows it RUNNING at 80% or more, or
// ended. Here the run ends between the later Status's read of the record
// and its look for the run's handle: the snapshot then falls back to the
// progress stored at registration, 0.
func TestStatusNeverShowsProgressGoingBackAsTheRunEnds(t *testing.T) {
	s := &hookStore{Store: NewMemStore()}
	var rt *Runtime[*hookStore]
	var sub Submission
	var armed atomic.Bool
	started, release := make(chan struct{}), make(chan struct{})
	// Armed, the next Status's read finds the record RUNNING; the run then
	// returns and settles before the snapshot is made.
	s.onGet = func(_ context.Context, rec Record) {
		if rec.ID != sub.ID || rec.Status != StatusRunning || !armed.CompareAndSwap(true, false) {
			return
		}
		close(release)
		eventually(t, func() bool { return rt.handle(sub.ID, sub.RunID) == nil }, "the run to settle")
	}
	rt = newRuntime(t, s, Config{})
	var err error
	sub, err = rt.Submit(ctx, "report", func(_ context.Context, tk *Task) (any, error) {
		tk.SetProgress(80)
		close(started)
		<-release
		return "done", nil
	}, alice)
	require.NoError(t, err)
	wait(t, started, "the run to start")

	first, err := rt.Status(ctx, sub.ID, alice)
	require.NoError(t, err)
	require.Equal(t, StatusRunning, first.Status)
	require.Equal(t, 80, first.Progress)

	armed.Store(true)
	second, err := rt.Status(ctx, sub.ID, alice)
	require.NoError(t, err)
	if !second.Status.Terminal() {
		assert.GreaterOrEqual(t, second.Progress, first.Progress,
			"a later Status shows the run %s at %d%%, behind the %d%% the caller already saw", second.Status, second.Progress, first.Progress)
	}
	settled(t, rt, sub.ID)
}
