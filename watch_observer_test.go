package workers

import (
	"context"
	"iter"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// A Watch of run A, which this runtime runs. An observer is slow to
// take run A's start (it is on the run's goroutine, while the record
// says RUNNING and the stream has shown it). A Cancel made here lands
// run A's CANCELLED and returns: its report of run A's end is held back
// (early) until the observer has heard the start, so that observers
// hear start before end. The owner then re-runs the key here. The
// stream must end with run A's end, which this very runtime reports as
// soon as the observer returns ("the terminal one is always delivered,
// last"), as TestWatchEndsWithTheEndOfARunCancelledHereThoughItsKeyWasReRunFirst
// requires for a Cancel that had not reported yet. It ends with
// ErrNotFound instead: the Watch waits only while runFinishing or
// runCancelling is set, and neither is while an end waits in rt.early.
func TestWatchEndsWithACancelsEndHeldForASlowObserver(t *testing.T) {
	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	obs := ObserverFunc(func(_ context.Context, e Event) {
		if e.Kind == EventStarted && e.TaskID == "alice::job" {
			first := false
			once.Do(func() { first = true })
			if first {
				close(entered)
				<-release
			}
		}
	})
	rt := newRuntime(t, NewMemStore(), Config{Observers: []Observer{obs}})
	a := stubbornGate()
	t.Cleanup(a.open)
	subA, err := rt.Submit(ctx, "job", a.fn, alice)
	require.NoError(t, err)
	var released sync.Once
	t.Cleanup(func() { released.Do(func() { close(release) }) })
	wait(t, entered, "the observer to hear run A's start")

	next, stop := iter.Pull2(rt.Watch(ctx, subA.ID, alice))
	defer stop()
	pullRunning(t, next, subA.RunID)

	require.NoError(t, rt.Cancel(ctx, subA.ID, alice))
	b := newGate()
	t.Cleanup(b.open)
	subB, err := rt.Submit(ctx, "job", b.fn, alice)
	require.NoError(t, err)
	require.False(t, subB.Joined)

	got := pullAsync(next)
	// The observer returns a moment later (or now, if the stream is
	// already waiting as it should): run A's end is then reported.
	letAnswer(got)
	released.Do(func() { close(release) })

	requireCancelledEnd(t, got, subA.RunID, "which this runtime reports once the observer returns")
}
