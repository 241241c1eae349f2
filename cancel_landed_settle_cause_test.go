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
// own outcome was fenced out. Its CancelCause must say so, as it did
// before c192902 (the run's settle left the context to the Cancel while
// it held the run). Now the run settles first, its context ends with
// errRunEnded, and the Cancel's cancel comes too late: CancelCause is
// nil for a run whose record says it was cancelled.
func TestALandedCancelsCauseSurvivesTheRunSettlingFirst(t *testing.T) {
	s := &landedCancelStore{Store: NewMemStore(), landed: make(chan struct{}), release: make(chan struct{})}
	rt := newRuntime(t, s, Config{})
	started, finish := make(chan struct{}), make(chan struct{})
	var tk atomic.Pointer[Task]
	sub, err := rt.Submit(ctx, "job", func(_ context.Context, task *Task) (any, error) {
		tk.Store(task)
		close(started)
		<-finish // ignores its context
		return "ok", nil
	}, alice)
	require.NoError(t, err)
	wait(t, started, "the run to start")

	cancelled := make(chan error, 1)
	go func() { cancelled <- rt.Cancel(context.WithValue(ctx, callerTag{}, true), sub.ID, alice) }()
	wait(t, s.landed, "the Cancel's write to land")
	s.failGet.Store(true) // the run's read-back of its fenced outcome fails
	close(finish)
	eventually(t, tk.Load().isSettled, "the run to settle")
	s.failGet.Store(false)
	close(s.release)
	require.NoError(t, <-cancelled, "the Cancel landed")

	snap, err := rt.Status(ctx, sub.ID, alice)
	require.NoError(t, err)
	require.Equal(t, StatusCancelled, snap.Status, "the record")
	require.ErrorIs(t, tk.Load().CancelCause(), ErrCancelled, "the CancelCause of a run whose record says it was cancelled")
}
