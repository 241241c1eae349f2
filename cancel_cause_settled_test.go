package workers

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// A Cancel whose write lands while the run is executing, and whose run
// then settles before the Cancel cancels it (its callback returned, its
// own end fenced out), leaves the Cancel's cause as the run's
// CancelCause, as the record says: the run's context, which ends once
// the run has settled, is left to the Cancel to end.
func TestACancelThatRacedTheRunsEndIsItsCancelCause(t *testing.T) {
	s := &afterCancelStore{Store: NewMemStore()}
	rt := newRuntime(t, s, Config{})
	g := stubbornGate()
	sub, err := rt.Submit(ctx, "job", g.fn, alice)
	require.NoError(t, err)
	var once sync.Once
	open := func() { once.Do(g.open) }
	t.Cleanup(open)
	wait(t, g.started, "the run to start")
	tk := g.task.Load()

	hook := func() {
		// The CANCELLED has landed; the Cancel has not cancelled the run.
		open()
		wait(t, g.ran, "the callback's return")
		eventually(t, tk.isSettled, "the run to settle")
	}
	s.after.Store(&hook)
	require.NoError(t, rt.Cancel(context.WithValue(ctx, callerTag{}, true), sub.ID, alice))
	snap, err := rt.Wait(ctx, sub.ID, alice)
	require.NoError(t, err)
	require.Equal(t, StatusCancelled, snap.Status)
	require.ErrorIs(t, tk.CancelCause(), ErrCancelled, "the run's CancelCause")
	require.Error(t, tk.ctx.Err(), "the run's context ended")
}
