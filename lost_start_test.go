package workers

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A record set back to PENDING under its running run's own id (a store
// that lost the run's start: a failover, a restored file) is still the
// run's: the run's outcome lands over it, rather than being fenced out
// as if the record had moved on, which left it PENDING for recovery.
func TestAnOutcomeLandsOverTheRunsRecordBackAtPending(t *testing.T) {
	s := NewMemStore()
	rt := newRuntime(t, s, Config{})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	started, release := make(chan struct{}), make(chan struct{})
	sub, err := rt.Submit(ctx, "report", func(context.Context, *Task) (any, error) {
		close(started)
		<-release
		return "done", nil
	}, alice)
	require.NoError(t, err)
	<-started
	rec, err := s.GetTask(ctx, sub.ID)
	require.NoError(t, err)
	rec.State = State{Status: StatusPending}
	require.NoError(t, s.SetTask(ctx, rec))
	close(release)
	snap, err := rt.Wait(ctx, sub.ID, alice)
	require.NoError(t, err, "Wait never saw the run's end")
	require.Equal(t, sub.RunID, snap.RunID)
	require.Equal(t, StatusCompleted, snap.Status)
	require.JSONEq(t, `"done"`, string(snap.Result))
}
