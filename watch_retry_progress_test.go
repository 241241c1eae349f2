package workers_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
)

// A retried attempt that starts its work over reports its progress from
// the start again. Status shows that progress live; a Watch that showed
// the first attempt must show it too, not hold the first attempt's higher
// value for the rest of the run.
func TestWatchShowsARetrysProgressBelowTheEarlierAttempts(t *testing.T) {
	ctx := context.Background()
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	defer rt.Shutdown(ctx)
	alice := workers.MustOwner("alice")
	saw80, set, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	sub, err := rt.Submit(ctx, "retried", func(ctx context.Context, tk *workers.Task) (any, error) {
		if tk.Attempt() == 1 {
			tk.SetProgress(80)
			<-saw80
			return nil, errors.New("transient")
		}
		tk.SetProgress(10) // the second attempt starts over
		close(set)
		<-release
		return "ok", nil
	}, alice, workers.WithRetry(workers.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond}))
	require.NoError(t, err)

	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var shown []workers.Snapshot
	status := -1
	for s, err := range rt.Watch(wctx, sub.ID, alice) {
		if err != nil {
			break // the deadline: the stream never showed the second attempt's progress
		}
		shown = append(shown, s)
		if s.Attempt == 1 && s.Progress == 80 && status == -1 {
			status = 0
			close(saw80)
			<-set
			snap, err := rt.Status(ctx, sub.ID, alice)
			require.NoError(t, err)
			status = snap.Progress
		}
		if s.Attempt == 2 && s.Progress == 10 {
			break
		}
	}
	close(release)
	require.Equal(t, 10, status, "Status shows the second attempt's progress")
	last := shown[len(shown)-1]
	assert.Equal(t, 10, last.Progress, "Watch's last snapshot (attempt %d) while Status says 10; shown: %+v", last.Attempt, progressOf(shown))
}

func progressOf(snaps []workers.Snapshot) [][2]int {
	var out [][2]int
	for _, s := range snaps {
		out = append(out, [2]int{s.Attempt, s.Progress})
	}
	return out
}
