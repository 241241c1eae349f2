package workers

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An observer's ctx is "the run's context when this runtime holds the run
// (it carries the submission's values ...), and is cancelled when the run
// is". A run that completed was never cancelled, but since the run's
// context ends as the run settles, an event about the run reported after
// that (here a join, which its submitter reports once the task's lock is
// free, and the run may have completed meanwhile) hands its observers a
// cancelled ctx: an observer that writes an audit row under ctx fails.
func TestObserverCtxOfAJoinReportedAfterTheRunCompletedIsNotCancelled(t *testing.T) {
	release := make(chan struct{})
	joinedErr := make(chan error, 1)
	var rt *Runtime[*MemStore]
	rt = newRuntime(t, NewMemStore(), Config{Observers: []Observer{ObserverFunc(func(ctx context.Context, e Event) {
		if e.Kind != EventJoined || e.Task == nil {
			return
		}
		// The run completes, and settles, while the join is being
		// reported.
		close(release)
		deadline := time.Now().Add(10 * time.Second)
		for !e.Task.isSettled() && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		joinedErr <- context.Cause(ctx)
	})}})
	first, err := rt.Submit(ctx, "k", func(context.Context, *Task) (any, error) { <-release; return "ok", nil }, alice)
	require.NoError(t, err)
	second, err := rt.Submit(ctx, "k", func(context.Context, *Task) (any, error) { return nil, nil }, alice)
	require.NoError(t, err)
	require.True(t, second.Joined)
	snap, err := rt.Wait(ctx, first.ID, alice)
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, snap.Status, "the run was never cancelled")
	require.NoError(t, <-joinedErr, "the observer's ctx of the join ended, though the run was never cancelled")
}
