package workers

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// blockCancelStore holds a Cancel's write (a context carrying callerTag)
// before it reaches the store, until release is closed.
type blockCancelStore struct {
	Store
	entered chan struct{}
	release chan struct{}
}

func (s *blockCancelStore) TransitionTask(ctx context.Context, id, runID string, from []Status, next State) (bool, error) {
	if next.Status == StatusCancelled && ctx.Value(callerTag{}) != nil {
		close(s.entered)
		<-s.release
	}
	return s.Store.TransitionTask(ctx, id, runID, from, next)
}

// A run that succeeds while a Cancel's write is still on its way to the
// store has ended, its outcome recorded: its context must end then ("Once
// the run has ended, its outcome recorded, ctx is cancelled"), not when
// the slow Cancel comes back, which may be after Shutdown returned.
func TestARunsContextEndsOnSettleThoughACancelIsWriting(t *testing.T) {
	s := &blockCancelStore{Store: NewMemStore(), entered: make(chan struct{}), release: make(chan struct{})}
	rt := newRuntime(t, s, Config{})
	sub, g, cancelled := cancelledStubbornRun(t, rt)
	c := g.task.Load().ctx
	wait(t, s.entered, "the Cancel's write")
	defer func() {
		close(s.release)
		<-cancelled
	}()
	g.open()
	snap, err := rt.Wait(ctx, sub.ID, alice)
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, snap.Status)
	select {
	case <-c.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("the settled run's context is still live while a Cancel's write is pending")
	}
}

// lostCancelStore holds a Cancel's write until release is closed, then
// answers it with a transient error without making it (the run's own end
// landed first: the write would have been fenced out anyway), and fails
// the Cancel's read-back, so that the Cancel cannot tell.
type lostCancelStore struct {
	Store
	entered, release chan struct{}
	failGet          atomic.Bool
}

func (s *lostCancelStore) TransitionTask(ctx context.Context, id, runID string, from []Status, next State) (bool, error) {
	if next.Status == StatusCancelled && ctx.Value(callerTag{}) != nil {
		close(s.entered)
		<-s.release
		s.failGet.Store(true)
		return false, errors.New("connection reset by peer")
	}
	return s.Store.TransitionTask(ctx, id, runID, from, next)
}

func (s *lostCancelStore) GetTask(ctx context.Context, id string) (Record, error) {
	if s.failGet.Load() && ctx.Value(callerTag{}) != nil {
		return Record{}, errors.New("connection reset by peer")
	}
	return s.Store.GetTask(ctx, id)
}

// A run that completed on its own, its COMPLETED record landed, before a
// Cancel whose outcome the Cancel could not learn: the run was never
// cancelled, and its CancelCause stays nil (context.Cause of its ended
// context is errRunEnded).
func TestACompletedRunsCancelCauseIsNotALostCancels(t *testing.T) {
	s := &lostCancelStore{Store: NewMemStore(), entered: make(chan struct{}), release: make(chan struct{})}
	rt := newRuntime(t, s, Config{})
	sub, g, cancelled := cancelledStubbornRun(t, rt)
	tk := &g.task
	wait(t, s.entered, "the Cancel's write")
	g.open()
	snap, err := rt.Wait(ctx, sub.ID, alice)
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, snap.Status)
	eventually(t, tk.Load().isSettled, "the run to settle")
	close(s.release)
	require.Error(t, <-cancelled)
	s.failGet.Store(false)
	snap, err = rt.Status(ctx, sub.ID, alice)
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, snap.Status, "the record")
	require.NoError(t, tk.Load().CancelCause(), "the CancelCause of a run that completed, never cancelled")
}

// cancelledStubbornRun starts a run on rt whose callback ignores its
// context until its gate opens, and a Cancel of it tagged as the
// caller's (see callerTag) on a goroutine of its own, whose answer comes
// on cancelled.
func cancelledStubbornRun[S Store](t *testing.T, rt *Runtime[S]) (sub Submission, g *gate, cancelled <-chan error) {
	t.Helper()
	g = stubbornGate()
	sub, err := rt.Submit(ctx, "job", g.fn, alice)
	require.NoError(t, err)
	wait(t, g.started, "the run to start")
	answer := make(chan error, 1)
	go func() { answer <- rt.Cancel(context.WithValue(ctx, callerTag{}, true), sub.ID, alice) }()
	return sub, g, answer
}
