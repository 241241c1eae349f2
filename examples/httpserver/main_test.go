package main

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/workershttp"
)

func TestMain(m *testing.M) {
	// The test binary runs as the command itself for the tests that
	// signal it (see TestSecondSignalQuitsAtOnce).
	if os.Getenv(runMain) == "1" {
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// runMain names the environment variable that makes the test binary run
// main, with the arguments it was given.
const runMain = "WORKERS_HTTPSERVER_RUN_MAIN"

type client struct {
	t    *testing.T
	base string
}

func (c client) do(method, path, user string, into any) int {
	c.t.Helper()
	code, _ := c.doHeader(method, path, user, into)
	return code
}

func (c client) doHeader(method, path, user string, into any) (int, http.Header) {
	c.t.Helper()
	req, err := http.NewRequest(method, c.base+path, nil)
	require.NoError(c.t, err)
	if user != "" {
		req.Header.Set("X-User", user)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	if into != nil {
		require.NoError(c.t, json.NewDecoder(resp.Body).Decode(into))
	}
	return resp.StatusCode, resp.Header
}

func TestAPI(t *testing.T) {
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	srv := httptest.NewServer(newAPI(rt, t.Context()))
	c := client{t, srv.URL}
	defer srv.Close()

	var sub workershttp.SubmissionResponse
	require.Equal(t, http.StatusAccepted, c.do("POST", "/tasks?key=report&steps=1000", "alice", &sub))
	assert.Equal(t, "alice::report", sub.ID)
	var joined workershttp.SubmissionResponse
	require.Equal(t, http.StatusOK, c.do("POST", "/tasks?key=report", "alice", &joined))
	assert.True(t, joined.Joined)

	var snap workershttp.Task
	require.Equal(t, http.StatusOK, c.do("GET", "/tasks/alice::report", "alice", &snap))
	assert.Equal(t, sub.RunID, snap.RunID)
	assert.Equal(t, http.StatusNotFound, c.do("GET", "/tasks/alice::report", "bob", nil), "bob cannot see alice's task")
	assert.Equal(t, http.StatusNotFound, c.do("POST", "/tasks/alice::report/cancel", "bob", nil))
	assert.Equal(t, http.StatusUnauthorized, c.do("GET", "/tasks", "", nil), "no identity, no access")
	assert.Equal(t, http.StatusUnauthorized, c.do("GET", "/tasks", "a::b", nil))
	assert.Equal(t, http.StatusBadRequest, c.do("POST", "/tasks?key=", "alice", nil))
	assert.Equal(t, http.StatusBadRequest, c.do("POST", "/tasks?key=x&steps=0", "alice", nil))

	var list workershttp.Page
	require.Equal(t, http.StatusOK, c.do("GET", "/tasks", "alice", &list))
	require.Len(t, list.Tasks, 1)
	require.Equal(t, http.StatusOK, c.do("GET", "/tasks", "bob", &list))
	assert.Empty(t, list.Tasks)

	require.Equal(t, http.StatusOK, c.do("POST", "/tasks/alice::report/cancel", "alice", nil))
	assert.Equal(t, http.StatusConflict, c.do("POST", "/tasks/alice::report/cancel", "alice", nil))
	require.Equal(t, http.StatusOK, c.do("GET", "/tasks/alice::report", "alice", &snap))
	assert.Equal(t, workers.StatusCancelled, snap.Status)
	assert.Equal(t, "Cancelled by user", snap.Error)
	assert.Equal(t, "alice", snap.CancelledBy)

	require.Equal(t, http.StatusAccepted, c.do("POST", "/tasks?key=seq&steps=1&queue=reports", "alice", &sub))
	require.NoError(t, rt.Shutdown(context.Background()))
	assert.Equal(t, http.StatusServiceUnavailable, c.do("POST", "/tasks?key=late", "alice", nil))
}

// Cancelling serve's context, as SIGINT does, shuts the server down and
// drains the runtime within its bound: serve returns nil although a task
// was in flight, which the shutdown cancelled.
func TestServeShutsDownGracefully(t *testing.T) {
	_, _, shutdown := serveWithATask(t, 5*time.Second)
	http.DefaultClient.CloseIdleConnections()
	require.NoError(t, shutdown())
}

// serveWithATask runs serve on a port of its own, with the given bound,
// and submits a long task to it. shutdown cancels serve's context, as
// SIGINT does, and returns what serve returned, failing t if it does not
// return within 10 s.
func serveWithATask(t *testing.T, bound time.Duration) (c client, sub workershttp.SubmissionResponse, shutdown func() error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- serve(ctx, ln, bound) }()
	c = client{t, "http://" + ln.Addr().String()}
	require.Equal(t, http.StatusAccepted, c.do("POST", "/tasks?key=long&steps=1000", "alice", &sub))
	return c, sub, func() error {
		stop()
		select {
		case err := <-served:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("serve did not return")
			return nil
		}
	}
}

func TestQuotaAnswers429WithRetryAfter(t *testing.T) {
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{
		Limits: workers.Limits{Owner: workers.OwnerLimits{Running: 1, Waiting: 1}},
	})
	srv := httptest.NewServer(newAPI(rt, t.Context()))
	defer srv.Close()
	c := client{t, srv.URL}
	require.Equal(t, http.StatusAccepted, c.do("POST", "/tasks?key=a&steps=1000", "alice", nil))
	require.Equal(t, http.StatusAccepted, c.do("POST", "/tasks?key=b&steps=1000", "alice", nil))
	code, h := c.doHeader("POST", "/tasks?key=c", "alice", nil)
	assert.Equal(t, http.StatusTooManyRequests, code)
	assert.NotEmpty(t, h.Get("Retry-After"))
	assert.Equal(t, http.StatusOK, c.do("POST", "/tasks?key=b", "alice", nil), "a join is never refused")
	assert.Equal(t, http.StatusNotFound, c.do("GET", "/tasks/alice::c", "alice", nil), "the refused task left no record")
	assert.Equal(t, http.StatusAccepted, c.do("POST", "/tasks?key=a&steps=1", "bob", nil), "bob is not held back by alice")
	require.NoError(t, rt.Shutdown(context.Background()))
}

// /login's cookie signs in the user it names, whatever bytes the id
// holds that a cookie's value cannot.
func TestLoginSignsInTheUserItNames(t *testing.T) {
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	defer rt.Shutdown(context.Background())
	api := newAPI(rt, t.Context())
	for _, user := range []string{"alice", "éric", "a;b", "a b"} {
		w := httptest.NewRecorder()
		api.ServeHTTP(w, httptest.NewRequest("GET", "/login?user="+url.QueryEscape(user), nil))
		require.Equal(t, http.StatusSeeOther, w.Code, user)
		cookies := w.Result().Cookies()
		require.Len(t, cookies, 1, user)
		req := httptest.NewRequest("GET", "/tasks", nil)
		req.AddCookie(cookies[0])
		auth, err := authenticate(req)
		require.NoError(t, err, user)
		assert.Equal(t, workers.MustOwner(user), auth, user)
	}
}
