package workers

import (
	"context"
	"iter"
	"testing"

	"github.com/stretchr/testify/require"
)

// heldEnd is a MemStore whose next COMPLETED write, once armed, lands and
// then holds its answer until release: the run's goroutine is between its
// end write and its report of that end, as any run briefly is.
type heldEnd struct {
	*MemStore
	armed   chan struct{} // closed to arm
	landed  chan struct{} // closed once the held write has landed
	release chan struct{} // closed to let it answer
}

func (s *heldEnd) TransitionTask(ctx context.Context, id, runID string, from []Status, next State) (bool, error) {
	ok, err := s.MemStore.TransitionTask(ctx, id, runID, from, next)
	select {
	case <-s.armed:
		if next.Status == StatusCompleted {
			select {
			case <-s.landed:
			default:
				close(s.landed)
				<-s.release
			}
		}
	default:
	}
	return ok, err
}

// One runtime runs both runs: run A's end lands, and its owner re-runs the
// key here before run A's goroutine reports that end. The Watch that
// showed run A RUNNING still ends with run A's end: the re-run's report
// makes it read the store, which holds run B; run A, finishing here,
// reports its end before it settles, and that late report of an earlier
// run is kept for the stream.
func TestWatchDeliversTheEndOfThisRuntimesRunReportedAfterItsRerun(t *testing.T) {
	s := &heldEnd{MemStore: NewMemStore(), armed: make(chan struct{}), landed: make(chan struct{}), release: make(chan struct{})}
	rt := newRuntime(t, s, Config{})
	a := newGate()
	subA, err := rt.Submit(ctx, "job", a.fn, alice)
	require.NoError(t, err)
	wait(t, a.started, "run A to start")
	tkA := a.task.Load()

	next, stop := iter.Pull2(rt.Watch(ctx, subA.ID, alice))
	defer stop()
	pullRunning(t, next, subA.RunID)

	close(s.armed)
	a.open() // run A returns; its COMPLETED write lands and is held
	wait(t, s.landed, "run A's end to land")

	b := newGate()
	t.Cleanup(b.open)
	subB, err := rt.Submit(ctx, "job", b.fn, alice)
	require.NoError(t, err)
	require.NotEqual(t, subA.RunID, subB.RunID)
	wait(t, b.started, "run B to start")

	close(s.release) // run A's goroutine reports its end, and settles
	eventually(t, tkA.isSettled, "run A to settle")

	snap, err, ok := next()
	require.True(t, ok, "the stream ended with nothing after run A's RUNNING")
	require.NoError(t, err, "the Watch of run A, ended COMPLETED by this very runtime, ended without its end")
	require.Equal(t, subA.RunID, snap.RunID)
	require.Equal(t, StatusCompleted, snap.Status)
}
