package workers

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// panicOnAbandon is a store whose next write of an abandoned end, once
// armed, panics (a bug in a store, or in a driver under it).
type panicOnAbandon struct {
	Store
	armed atomic.Bool
}

func (s *panicOnAbandon) TransitionTask(ctx context.Context, id, runID string, from []Status, next State) (bool, error) {
	if next.Cause == CauseAbandoned && s.armed.CompareAndSwap(true, false) {
		panic("store bug")
	}
	return s.Store.TransitionTask(ctx, id, runID, from, next)
}

// A manual recovery (RecoverZombies, called from an HTTP handler whose
// server recovers panics) of a run abandoned here and still executing
// holds runCancelling on the run while it writes the end. A store panic
// in that write must not leave the hold behind: once the run has settled,
// Runtime.cancelling holds no entry for it and the run's flag is clear
// (claimCancel, which holds the same flag, drops it in a defer).
func TestARecoveryWhoseStorePanicsDropsItsHoldOnTheRun(t *testing.T) {
	s := &panicOnAbandon{Store: NewMemStore()}
	rt := newRuntime(t, s, Config{})
	g := stubbornGate()
	sub, err := rt.Submit(ctx, "stubborn", g.fn, alice)
	require.NoError(t, err)
	wait(t, g.started, "the run to start")
	tk := g.task.Load()
	rt.abandonRuns() // as a lost lease does: the run ignores its context

	s.armed.Store(true)
	func() {
		defer func() { _ = recover() }() // as net/http recovers a handler's panic
		_, _ = rt.RecoverZombies(ctx)
	}()
	require.False(t, s.armed.Load(), "the recovery's write was made")

	g.open()
	settled(t, rt, sub.ID)
	eventually(t, tk.isSettled, "the run to settle")

	rt.cancellingMu.Lock()
	n := rt.cancelling[tk]
	rt.cancellingMu.Unlock()
	require.Zero(t, n, "Runtime.cancelling still holds the settled run: the recovery's hold leaked")
	require.False(t, tk.has(runCancelling), "the settled run is still marked runCancelling")
}
