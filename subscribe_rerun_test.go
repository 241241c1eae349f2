package workers

import (
	"context"
	"iter"
	"testing"

	"github.com/stretchr/testify/require"
)

// Subscribe's doc: "The subscription starts when Subscribe is called, not
// when the range begins ... A change made between the two is yielded all
// the same if this runtime made it". Here this runtime ends run X of
// alice's task between the call and the range, and another replica over
// the same store re-runs the key (run Y) before the range begins. The
// stream must yield run X's end, before run Y, though the inbox cannot
// order X's end against Y by their run ids (two instances'). Were the
// key re-run on this runtime instead, takeEndBefore would yield X's end
// first.
func TestSubscribeKeepsAnEndMadeBeforeTheRangeThoughAnotherReplicaReran(t *testing.T) {
	store := NewMemStore()
	events := newEventLog()
	rt1 := newRuntime(t, store, Config{Observers: []Observer{events}})
	rt2 := newRuntime(t, store, Config{})

	x := newGate()
	subX, err := rt1.Submit(ctx, "job", x.fn, alice)
	require.NoError(t, err)
	wait(t, x.started, "run X to start")

	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	seq := rt1.Subscribe(sctx, alice) // the subscription starts here

	x.open()
	events.wait(t, EventFinished, subX.RunID) // published to the subscription's inbox
	y := newGate()
	t.Cleanup(y.open)
	subY, err := rt2.Submit(ctx, "job", y.fn, alice)
	require.NoError(t, err)
	require.False(t, subY.Joined)
	require.Equal(t, subX.ID, subY.ID)
	wait(t, y.started, "run Y to start on the other replica")

	next, stop := iter.Pull2(seq)
	defer stop()
	var seen []Snapshot
	for {
		snap, err, ok := next()
		require.True(t, ok)
		require.NoError(t, err)
		seen = append(seen, snap)
		if snap.ID == subX.ID && snap.RunID == subY.RunID {
			break
		}
	}
	var xEnd bool
	for _, s := range seen {
		if s.RunID == subX.RunID && s.Status == StatusCompleted {
			xEnd = true
		}
	}
	require.True(t, xEnd, "run X's end, made by this runtime after Subscribe was called, was not yielded before run Y: %+v", seen)
}
