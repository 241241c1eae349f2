package workershttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/workershttp"
)

// The dashboard's stream (GET /events) shows a retried attempt's progress
// as GET /tasks/{id} does when the attempt starts its work over: it does
// not hold the bar at the first attempt's value for the rest of the run.
func TestAllEventsShowARetrysProgressBelowTheEarlierAttempts(t *testing.T) {
	f := newFixture(t)
	saw80, set, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	defer close(release)
	res, events, _ := openSSE(t, f, "/events", "alice", "")
	require.Equal(t, 200, res.StatusCode)
	_, err := f.rt.Submit(context.Background(), "retried", func(ctx context.Context, tk *workers.Task) (any, error) {
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
	for _, tk, ok := next(t, events); tk.Progress != 80; _, tk, ok = next(t, events) {
		require.True(t, ok)
	}
	close(saw80)
	<-set
	_, body := f.do(t, "GET", "/tasks/alice::retried", "alice", nil)
	require.Contains(t, string(body), `"progress":10,"attempt":2`, "GET shows the second attempt's progress")

	var shown [][2]int // (attempt, progress) of each event after 80
	deadline := time.After(3 * time.Second)
	for {
		select {
		case ev, ok := <-events:
			require.True(t, ok, "the stream ended")
			var tk workershttp.Task
			require.NoError(t, json.Unmarshal([]byte(ev.data), &tk))
			shown = append(shown, [2]int{tk.Attempt, tk.Progress})
			if tk.Attempt == 2 && tk.Progress == 10 {
				return
			}
		case <-deadline:
			assert.Fail(t, "the stream never showed the second attempt's progress, 10, in 3 s", "(attempt, progress) shown after 80: %v", shown)
			return
		}
	}
}
