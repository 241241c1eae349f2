package workers

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// landedCancelStore lets a Cancel's write land, then holds its answer
// until release is closed; while failGet is set, reads other than the
// Cancel's fail as a database outage would fail them.
type landedCancelStore struct {
	Store
	landed, release chan struct{}
	failGet         atomic.Bool
}

func (s *landedCancelStore) TransitionTask(ctx context.Context, id, runID string, from []Status, next State) (bool, error) {
	ok, err := s.Store.TransitionTask(ctx, id, runID, from, next)
	if next.Status == StatusCancelled && ctx.Value(callerTag{}) != nil {
		close(s.landed)
		<-s.release
	}
	return ok, err
}

func (s *landedCancelStore) GetTask(ctx context.Context, id string) (Record, error) {
	if s.failGet.Load() && ctx.Value(callerTag{}) == nil {
		return Record{}, errors.New("connection reset by peer")
	}
	return s.Store.GetTask(ctx, id)
}

// A Cancel that landed while the run was still executing cancelled the
// run: its record says CANCELLED, the Cancel returns nil, and the run's
// own outcome was fenced out. Its CancelCause says so, though the run
// settled first, its context ended as a settled run's, and the store
// could not answer the run's read of the Cancel's end.
func TestALandedCancelsCauseSurvivesTheRunSettlingFirst(t *testing.T) {
	s := &landedCancelStore{Store: NewMemStore(), landed: make(chan struct{}), release: make(chan struct{})}
	rt := newRuntime(t, s, Config{})
	sub, g, cancelled := cancelledStubbornRun(t, rt)
	tk := &g.task
	wait(t, s.landed, "the Cancel's write to land")
	s.failGet.Store(true) // the run's read-back of its fenced outcome fails
	g.open()
	eventually(t, tk.Load().isSettled, "the run to settle")
	s.failGet.Store(false)
	close(s.release)
	require.NoError(t, <-cancelled, "the Cancel landed")

	snap, err := rt.Status(ctx, sub.ID, alice)
	require.NoError(t, err)
	require.Equal(t, StatusCancelled, snap.Status, "the record")
	require.ErrorIs(t, tk.Load().CancelCause(), ErrCancelled, "the CancelCause of a run whose record says it was cancelled")
}
