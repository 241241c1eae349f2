package workers

import (
	"context"
	"iter"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// afterCancelStore is a store without notices (the path of a store that
// polls) that calls after once a Cancel's write (its ctx carries
// callerTag) has landed, before Cancel goes on to report it.
type afterCancelStore struct {
	Store
	after atomic.Pointer[func()]
}

func (s *afterCancelStore) TransitionTask(ctx context.Context, id, runID string, from []Status, next State) (bool, error) {
	ok, err := s.Store.TransitionTask(ctx, id, runID, from, next)
	if ok && next.Status == StatusCancelled && ctx.Value(callerTag{}) != nil {
		if f := s.after.Swap(nil); f != nil {
			(*f)()
		}
	}
	return ok, err
}

// A Watch of run A, which this runtime runs: a Cancel made here lands
// run A's CANCELLED, and before the Cancel reports it, the owner re-runs
// the key here (a finished key is re-run). The stream, handed run B's
// report first, must still end with run A's end, which this very
// runtime reports a moment later ("the terminal one is always
// delivered, last"); the ErrNotFound exception of the docs is for a run
// ended and re-run by another process, whose end this runtime never
// sees.
func TestWatchEndsWithTheEndOfARunCancelledHereThoughItsKeyWasReRunFirst(t *testing.T) {
	s := &afterCancelStore{Store: NewMemStore()}
	rt := newRuntime(t, s, Config{})
	a := stubbornGate() // run A's callback ignores its context
	subA, err := rt.Submit(ctx, "job", a.fn, alice)
	require.NoError(t, err)
	t.Cleanup(a.open)
	wait(t, a.started, "run A to start")

	next, stop := iter.Pull2(rt.Watch(ctx, subA.ID, alice))
	defer stop()
	pullRunning(t, next, subA.RunID)

	var got chan pulled
	b := newGate()
	t.Cleanup(b.open)
	hook := func() {
		// Run A's CANCELLED has landed; Cancel has not reported it yet.
		subB, err := rt.Submit(ctx, "job", b.fn, alice)
		require.NoError(t, err)
		require.False(t, subB.Joined)
		got = pullAsync(next)
		// The stream has run B's report already. Let it act on it: an
		// answer before the Cancel reports run A's end ends the wait
		// early; a correct stream keeps waiting for that end.
		letAnswer(got)
	}
	s.after.Store(&hook)
	require.NoError(t, rt.Cancel(context.WithValue(ctx, callerTag{}, true), subA.ID, alice))

	requireCancelledEnd(t, got, subA.RunID, "which this runtime reported right after")
}

// pulled is one answer of a stream pulled with iter.Pull2.
type pulled struct {
	snap Snapshot
	err  error
	ok   bool
}

// pullAsync pulls next once, on a goroutine of its own, and sends its
// answer on the channel it returns.
func pullAsync(next func() (Snapshot, error, bool)) chan pulled {
	got := make(chan pulled, 1)
	go func() {
		snap, err, ok := next()
		got <- pulled{snap, err, ok}
	}()
	return got
}

// letAnswer gives a stream pulled by pullAsync half a second to answer
// early, as a wrong stream would, and puts the answer back for
// requireCancelledEnd; a correct stream is still waiting then.
func letAnswer(got chan pulled) {
	select {
	case r := <-got:
		got <- r
	case <-time.After(500 * time.Millisecond):
	}
}

// requireCancelledEnd requires the stream's answer on got to be the
// CANCELLED end of run runID; why says whose end it is.
func requireCancelledEnd(t *testing.T, got chan pulled, runID, why string) {
	t.Helper()
	var r pulled
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the Watch yielded nothing after the run's RUNNING")
	}
	require.True(t, r.ok)
	require.NoError(t, r.err, "the Watch ended without the run's end, "+why)
	require.Equal(t, runID, r.snap.RunID)
	require.Equal(t, StatusCancelled, r.snap.Status)
}
