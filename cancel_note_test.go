package workers

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cancelTag marks the context of the Cancel under test, so that the store
// fails only its calls.
type cancelTag struct{}

// undecidedCancelStore is a MemStore (seen without its capabilities) whose
// TransitionTask to CANCELLED made under cancelTag waits for release and
// then fails without landing, and whose GetTask under cancelTag fails
// once that write has failed: Cancel cannot tell whether its write landed.
type undecidedCancelStore struct {
	Store
	reached chan struct{} // closed when the cancel's write reaches the store
	release chan struct{} // closed to let that write fail
	failed  atomic.Bool
}

var errFlaky = errors.New("store: connection reset")

func (s *undecidedCancelStore) TransitionTask(ctx context.Context, id, runID string, from []Status, next State) (bool, error) {
	if ctx.Value(cancelTag{}) != nil && next.Status == StatusCancelled {
		close(s.reached)
		<-s.release
		s.failed.Store(true)
		return false, errFlaky
	}
	return s.Store.TransitionTask(ctx, id, runID, from, next)
}

func (s *undecidedCancelStore) GetTask(ctx context.Context, id string) (Record, error) {
	if ctx.Value(cancelTag{}) != nil && s.failed.Load() {
		return Record{}, errFlaky
	}
	return s.Store.GetTask(ctx, id)
}

// A Cancel that cannot tell whether its write landed notes who cancelled
// and why in Runtime.cancels, for the run's own end write; the note goes
// when the run settles, even when the run settled while the Cancel's
// write was in flight (its callback returned meanwhile), before the note
// was kept: the runtime does not keep the settled *Task (its result, its
// closure, its context's values) for as long as it lives.
func TestACancelNoteOfARunThatSettledMeanwhileIsDropped(t *testing.T) {
	s := &undecidedCancelStore{Store: NewMemStore(), reached: make(chan struct{}), release: make(chan struct{})}
	rt := newRuntime(t, s, Config{})
	g := newGate()
	sub, err := rt.Submit(ctx, "k", g.fn, alice)
	require.NoError(t, err)
	wait(t, g.started, "callback")
	tk := g.task.Load()

	cancelled := make(chan error, 1)
	go func() {
		cancelled <- rt.Cancel(context.WithValue(ctx, cancelTag{}, true), sub.ID, alice, WithReason("no longer needed"))
	}()
	wait(t, s.reached, "the cancel's write")
	g.open() // the callback returns; the run ends SUCCEEDED and settles
	eventually(t, tk.isSettled, "the run to settle")
	close(s.release)
	require.Error(t, <-cancelled, "the write and the read both failed")

	rec, err := s.Store.GetTask(ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, rec.Status)
	_, kept := rt.cancels.Load(tk)
	assert.False(t, kept, "a settled run's cancel note is kept by the runtime for good")
}

// hangAfterTake is a MemStore whose lease renewals after the first (the
// take) hang until their context ends.
type hangAfterTake struct {
	*MemStore
	renewals atomic.Int32
}

func (s *hangAfterTake) RenewLease(ctx context.Context, instance string, ttl time.Duration) (bool, error) {
	if s.renewals.Add(1) > 1 {
		<-ctx.Done()
		return false, ctx.Err()
	}
	return s.MemStore.RenewLease(ctx, instance, ttl)
}

// A renewal begun past the lease's end (a submission's, which took the
// lease's turn before the loop woke at that end) finds the lease lost
// before it begins: the runs are abandoned then, not once that renewal,
// which may take an interval, gives up.
func TestARenewalBegunPastTheLeasesEndLosesTheLeaseFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &hangAfterTake{MemStore: NewMemStore()}
		rt := NewRuntime(s, Config{Logger: slog.New(slog.DiscardHandler), LeaseInterval: time.Second, LeaseTTL: 3 * time.Second})
		var lost atomic.Bool
		rt.hooks.Store(&hooks{leaseLost: func() { lost.Store(true) }})
		require.NoError(t, rt.Start(ctx))
		ls := &rt.lease
		require.NoError(t, ls.take(ctx, nil)) // the loop cannot lose the lease meanwhile
		time.Sleep(3*time.Second + time.Millisecond)
		done := make(chan error, 1)
		go func() { done <- rt.renew(ctx, s, time.Time{}) }()
		synctest.Wait()
		assert.True(t, lost.Load(), "the lease, past its end, is lost before the renewal's answer")
		require.Error(t, <-done)
		ls.give()
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_ = rt.Shutdown(sctx)
	})
}
