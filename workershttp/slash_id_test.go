package workershttp_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/workershttp"
)

// A task whose id is a single slash (the global key "/", which the
// runtime accepts) is reachable at the Location WriteSubmission gives it,
// as the dot ids are: its status, its cancel and its events routes all
// answer for it. ServeMux takes an escaped "%2F" that is a whole segment
// for a trailing slash, so such a path matches no {id} route.
func TestASlashIDIsReachableOverItsRoutes(t *testing.T) {
	f := newFixture(t)
	release := make(chan struct{})
	defer close(release)
	sub, err := f.rt.Submit(context.Background(), "/", blocker(release), alice, workers.WithScope(workers.ScopeGlobal))
	require.NoError(t, err)
	require.Equal(t, "/", sub.ID)

	w := httptest.NewRecorder()
	workershttp.WriteSubmission(w, "", sub, nil)
	loc := w.Header().Get("Location")

	res, body := f.do(t, "GET", loc, "alice", nil)
	assert.Equal(t, 200, res.StatusCode, "GET %s: %s", loc, body)
	var tk workershttp.Task
	if res.StatusCode == 200 {
		require.NoError(t, json.Unmarshal(body, &tk))
		assert.Equal(t, "/", tk.ID)
	}

	res, body = f.do(t, "POST", loc+"/cancel", "alice", nil)
	if !assert.Equal(t, 200, res.StatusCode, "POST %s/cancel: %s", loc, body) {
		return // the deferred release ends the run
	}
	snap := waitEnd(t, f.rt, sub.ID)
	assert.Equal(t, workers.StatusCancelled, snap.Status, "the cancel route cancelled the task")
}
