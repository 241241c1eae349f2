package workers

import (
	"context"
	"iter"
	"testing"

	"github.com/stretchr/testify/require"
)

// A Watch of this runtime's run A, over a store without notices (a bare
// Store shared by replicas): another replica cancels run A, which this
// runtime does not hear of, and the owner re-runs the key here. Run A's
// own end is fenced out (the record is run B's by then), so it never
// reaches this runtime's streams; the stream, handed run B's report,
// does not go on with run B as if it were run A's sequel: it reads the
// store and ends with run A's end, or ErrNotFound.
func TestWatchNeverGoesOnToThisRuntimesRerunWithoutTheShownRunsEnd(t *testing.T) {
	store := &bareStore{NewMemStore()}
	rt1 := newRuntime(t, store, Config{})
	rt2 := newRuntime(t, store, Config{})
	started, release := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(release) })
	subA, err := rt1.Submit(ctx, "job", func(ctx context.Context, _ *Task) (any, error) {
		close(started)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil, nil
	}, alice)
	require.NoError(t, err)
	wait(t, started, "run A to start")

	next, stop := iter.Pull2(rt1.Watch(ctx, subA.ID, alice))
	defer stop()
	pullRunning(t, next, subA.RunID)

	// While the consumer holds its first snapshot: another replica
	// cancels run A, and the owner re-runs the key here.
	require.NoError(t, rt2.Cancel(ctx, subA.ID, alice))
	b := newGate()
	t.Cleanup(b.open)
	subB, err := rt1.Submit(ctx, "job", b.fn, alice)
	require.NoError(t, err)
	require.NotEqual(t, subA.RunID, subB.RunID)
	require.False(t, subB.Joined)
	wait(t, b.started, "run B to start")

	snap, err, ok := next()
	require.True(t, ok, "the stream ended with nothing after run A's RUNNING")
	if err != nil {
		require.ErrorIs(t, err, ErrNotFound)
		return
	}
	require.Equal(t, subA.RunID, snap.RunID,
		"after run A's RUNNING the Watch yielded run B (%s, %s) without run A's end", snap.RunID, snap.Status)
	require.Equal(t, StatusCancelled, snap.Status)
}
