package workers

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A Cancel that cannot tell its outcome, of a run Shutdown had cancelled
// already (ErrShutdown, a cause that stays), still leaves the run's record
// CANCELLED, by whom and why, as its write would have had it landed,
// however the callback then returns: the caller, told only that Cancel
// failed, cannot know which it was.
func TestAnUndecidedCancelOfARunShutdownCancelledEndsItCancelled(t *testing.T) {
	s := &undecidedCancelStore{Store: NewMemStore(), reached: make(chan struct{}), release: make(chan struct{})}
	close(s.release) // the cancel's write fails at once
	rt := newRuntime(t, s, Config{ShutdownGrace: -1})
	g := stubbornGate()
	sub, err := rt.Submit(ctx, "k", g.fn, alice)
	require.NoError(t, err)
	wait(t, g.started, "callback")
	tk := g.task.Load()

	shut := make(chan error, 1)
	go func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shut <- rt.Shutdown(c)
	}()
	eventually(t, func() bool { return errors.Is(context.Cause(tk.ctx), ErrShutdown) }, "Shutdown to cancel the run")

	err = rt.Cancel(context.WithValue(ctx, cancelTag{}, true), sub.ID, alice, WithReason("no longer needed"))
	require.Error(t, err, "the write and the read both failed")
	require.False(t, errors.Is(err, ErrFinished))

	g.open() // the callback returns what it has
	require.NoError(t, <-shut)

	rec, err := s.Store.GetTask(ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, StatusCancelled, rec.Status,
		"a Cancel that could not tell its outcome left the run's record %s (it would be CANCELLED had its write landed)", rec.Status)
	require.Equal(t, "alice", rec.CancelledBy)
	require.Equal(t, "no longer needed", rec.CancelReason)
}
