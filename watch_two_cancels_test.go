package workers

import (
	"context"
	"errors"
	"iter"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type secondCancel struct{}

// twoCancelsStore is afterCancelStore that also holds the write of a
// Cancel whose ctx carries secondCancel at its start, until released.
type twoCancelsStore struct {
	afterCancelStore
	reachedB chan struct{}
	releaseB chan struct{}
}

func (s *twoCancelsStore) TransitionTask(ctx context.Context, id, runID string, from []Status, next State) (bool, error) {
	if ctx.Value(secondCancel{}) != nil {
		close(s.reachedB)
		<-s.releaseB
	}
	return s.afterCancelStore.TransitionTask(ctx, id, runID, from, next)
}

// As TestWatchEndsWithTheEndOfARunCancelledHereThoughItsKeyWasReRunFirst,
// with a second Cancel of run A (a double click) made at the same time:
// it read run A RUNNING, and its write is fenced out by the first's. Its
// claimCancel clears runCancelling as it returns, while the first Cancel,
// whose write landed, has still to report run A's end: the Watch must
// still end with that end, not with ErrNotFound.
func TestWatchEndsWithTheCancelsEndThoughASecondCancelRaced(t *testing.T) {
	s := &twoCancelsStore{afterCancelStore: afterCancelStore{Store: NewMemStore()}, reachedB: make(chan struct{}), releaseB: make(chan struct{})}
	rt := newRuntime(t, s, Config{})
	a := stubbornGate()
	subA, err := rt.Submit(ctx, "job", a.fn, alice)
	require.NoError(t, err)
	t.Cleanup(a.open)
	wait(t, a.started, "run A to start")

	next, stop := iter.Pull2(rt.Watch(ctx, subA.ID, alice))
	defer stop()
	pullRunning(t, next, subA.RunID)

	// Cancel B reads run A RUNNING, marks it runCancelling and is held
	// before its write.
	cancelB := make(chan error, 1)
	go func() { cancelB <- rt.Cancel(context.WithValue(ctx, secondCancel{}, true), subA.ID, alice) }()
	wait(t, s.reachedB, "the second Cancel to reach its write")

	var got chan pulled
	b := newGate()
	t.Cleanup(b.open)
	hook := func() {
		// Run A's CANCELLED (Cancel A's) has landed; Cancel A has not
		// reported it yet. The key is re-run here.
		subB, err := rt.Submit(ctx, "job", b.fn, alice)
		require.NoError(t, err)
		require.False(t, subB.Joined)
		got = pullAsync(next)
		// Cancel B's write is fenced out; it returns.
		close(s.releaseB)
		select {
		case err := <-cancelB:
			require.True(t, errors.Is(err, ErrFinished), "Cancel B: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("Cancel B did not return")
		}
		letAnswer(got)
	}
	s.after.Store(&hook)
	require.NoError(t, rt.Cancel(context.WithValue(ctx, callerTag{}, true), subA.ID, alice))

	requireCancelledEnd(t, got, subA.RunID, "which this runtime reported right after")
}
