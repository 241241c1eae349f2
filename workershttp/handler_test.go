package workershttp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/workershttp"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	alice = workers.MustOwner("alice")
	bob   = workers.MustOwner("bob")
)

// authByHeader authenticates with an X-User header: a test's identity.
func authByHeader(r *http.Request) (workers.TaskAuthority, error) {
	switch u := r.Header.Get("X-User"); u {
	case "":
		return nil, errors.New("no user")
	case "admin":
		return workers.System, nil
	default:
		return workers.NewOwner(u)
	}
}

type fixture struct {
	rt  *workers.Runtime[*workers.MemStore]
	srv *httptest.Server
}

func newFixture(t *testing.T, opts ...workershttp.Option) *fixture {
	t.Helper()
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	srv := start(t, rt, httptest.NewUnstartedServer(workershttp.Handler(rt, authByHeader, append([]workershttp.Option{workershttp.WithHeartbeat(20 * time.Millisecond)}, opts...)...)))
	return &fixture{rt: rt, srv: srv}
}

// start starts srv, which serves rt, unless it was started already (as
// StartTLS does), and when t ends closes it and shuts rt down.
func start[S workers.Store](t *testing.T, rt *workers.Runtime[S], srv *httptest.Server) *httptest.Server {
	t.Helper()
	if srv.URL == "" {
		srv.Start()
	}
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, rt.Shutdown(ctx))
	})
	return srv
}

func (f *fixture) do(t *testing.T, method, path, user string, body io.Reader) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+path, body)
	require.NoError(t, err)
	if user != "" {
		req.Header.Set("X-User", user)
	}
	res, err := f.srv.Client().Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res, b
}

// blocker is a callback that runs until released or cancelled.
func blocker(release <-chan struct{}) workers.Func {
	return func(ctx context.Context, t *workers.Task) (any, error) {
		t.SetProgress(10)
		select {
		case <-release:
			return map[string]int{"n": 1}, nil
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// waitEnd waits for the task id to end. Its bound only keeps a test
// from hanging: a run that ends with a result of many megabytes, encoded
// under the race detector on a loaded machine, may take seconds.
func waitEnd(t *testing.T, rt *workers.Runtime[*workers.MemStore], id string) workers.Snapshot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := rt.Wait(ctx, id, workers.System)
	require.NoError(t, err)
	return s
}

func TestStatusRoute(t *testing.T) {
	f := newFixture(t)
	sub, err := f.rt.Submit(context.Background(), "job", func(context.Context, *workers.Task) (any, error) { return 7, nil }, alice)
	require.NoError(t, err)
	waitEnd(t, f.rt, sub.ID)
	path := "/tasks/" + url.PathEscape(sub.ID)

	res, body := f.do(t, "GET", path, "alice", nil)
	require.Equal(t, 200, res.StatusCode, string(body))
	var m map[string]any
	require.NoError(t, json.Unmarshal(body, &m))
	assert.Equal(t, sub.ID, m["id"])
	assert.Equal(t, sub.RunID, m["run_id"])
	assert.Equal(t, "completed", m["status"])
	assert.EqualValues(t, 7, m["result"])
	assert.Contains(t, m, "completed_at")
	assert.Contains(t, m, "watcher_count")
	assert.NotContains(t, m, "cancelled_by", "unset fields are left out")

	// A foreign owner's answer is the missing task's answer.
	res, foreign := f.do(t, "GET", path, "bob", nil)
	assert.Equal(t, 404, res.StatusCode)
	res, missing := f.do(t, "GET", "/tasks/"+url.PathEscape("bob::nothing"), "bob", nil)
	assert.Equal(t, 404, res.StatusCode)
	assert.Equal(t, string(missing), string(foreign), "404 indistinguishable from missing")

	res, _ = f.do(t, "GET", path, "", nil)
	assert.Equal(t, 401, res.StatusCode, "unauthenticated")

	// An id with a slash or a space travels escaped in one path segment.
	odd, err := f.rt.Submit(context.Background(), "reports/2026 Q1", func(context.Context, *workers.Task) (any, error) { return nil, nil }, alice)
	require.NoError(t, err)
	res, body = f.do(t, "GET", "/tasks/"+url.PathEscape(odd.ID), "alice", nil)
	require.Equal(t, 200, res.StatusCode, string(body))
	assert.Contains(t, string(body), `"id":"alice::reports/2026 Q1"`)
}

func TestUnsetTimesAreOmitted(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	f := newFixture(t)
	// A pending task on a queue behind a running one has no start time.
	_, err := f.rt.SubmitSequential(context.Background(), "q", "first", blocker(release), alice)
	require.NoError(t, err)
	sub, err := f.rt.SubmitSequential(context.Background(), "q", "second", blocker(release), alice)
	require.NoError(t, err)
	_, body := f.do(t, "GET", "/tasks/"+url.PathEscape(sub.ID), "alice", nil)
	assert.Contains(t, string(body), `"created_at"`)
	assert.NotContains(t, string(body), "started_at")
	assert.NotContains(t, string(body), "0001-01-01")
}

func TestListRoute(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	var ids []string
	for i := range 5 {
		sub, err := f.rt.Submit(ctx, fmt.Sprint("job", i), func(context.Context, *workers.Task) (any, error) { return nil, nil }, alice)
		require.NoError(t, err)
		waitEnd(t, f.rt, sub.ID)
		ids = append(ids, sub.ID)
	}
	_, err := f.rt.Submit(ctx, "bobs", func(context.Context, *workers.Task) (any, error) { return nil, nil }, bob)
	require.NoError(t, err)

	var got []string
	cursor := ""
	for page := 0; ; page++ {
		require.Less(t, page, 5)
		res, body := f.do(t, "GET", "/tasks?limit=2&status=completed&cursor="+url.QueryEscape(cursor), "alice", nil)
		require.Equal(t, 200, res.StatusCode, string(body))
		var p workershttp.Page
		require.NoError(t, json.Unmarshal(body, &p))
		for _, tk := range p.Tasks {
			got = append(got, tk.ID)
		}
		if p.Next == "" {
			break
		}
		cursor = p.Next
	}
	want := []string{ids[4], ids[3], ids[2], ids[1], ids[0]}
	assert.Equal(t, want, got, "newest first, every task once, none of bob's")

	res, _ := f.do(t, "GET", "/tasks?cursor=!!!", "alice", nil)
	assert.Equal(t, 400, res.StatusCode, "malformed cursor")
	res, _ = f.do(t, "GET", "/tasks?cursor=bm90LWpzb24", "alice", nil)
	assert.Equal(t, 400, res.StatusCode, "malformed cursor")
	res, _ = f.do(t, "GET", "/tasks?status=bogus", "alice", nil)
	assert.Equal(t, 400, res.StatusCode)
	res, _ = f.do(t, "GET", "/tasks?limit=0", "alice", nil)
	assert.Equal(t, 400, res.StatusCode)
	res, _ = f.do(t, "GET", "/tasks", "", nil)
	assert.Equal(t, 401, res.StatusCode)
}

// A status filter given as repeated parameters chooses every status it
// names, as the comma-separated form does; none is silently dropped.
func TestListRouteRepeatedStatus(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	f := newFixture(t)
	ctx := context.Background()
	done, err := f.rt.Submit(ctx, "done", func(context.Context, *workers.Task) (any, error) { return nil, nil }, alice)
	require.NoError(t, err)
	waitEnd(t, f.rt, done.ID)
	running, err := f.rt.Submit(ctx, "running", blocker(release), alice)
	require.NoError(t, err)
	for _, query := range []string{"status=completed,running", "status=completed&status=running", "status=completed,pending&status=running"} {
		res, body := f.do(t, "GET", "/tasks?"+query, "alice", nil)
		require.Equal(t, 200, res.StatusCode, string(body))
		var p workershttp.Page
		require.NoError(t, json.Unmarshal(body, &p))
		var got []string
		for _, tk := range p.Tasks {
			got = append(got, tk.ID)
		}
		assert.ElementsMatch(t, []string{done.ID, running.ID}, got, query)
	}
	res, _ := f.do(t, "GET", "/tasks?status=completed&status=bogus", "alice", nil)
	assert.Equal(t, 400, res.StatusCode, "an unknown status in a repeated parameter")
}

func TestCancelRoute(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	f := newFixture(t)
	sub, err := f.rt.Submit(context.Background(), "shared", blocker(release), alice, workers.WithScope(workers.ScopeGlobal), workers.WithWatchers(bob))
	require.NoError(t, err)
	path := "/tasks/" + url.PathEscape(sub.ID) + "/cancel"

	res, _ := f.do(t, "POST", path, "mallory", nil)
	assert.Equal(t, 404, res.StatusCode, "a non-watcher cannot cancel, nor learn the task exists")

	res, body := f.do(t, "POST", path, "bob", strings.NewReader(`{"reason":"wrong\ninput"}`))
	require.Equal(t, 200, res.StatusCode, string(body))
	var tk workershttp.Task
	require.NoError(t, json.Unmarshal(body, &tk))
	assert.Equal(t, workers.StatusCancelled, tk.Status)
	assert.Equal(t, "bob", tk.CancelledBy)
	assert.Equal(t, "wrong input", tk.CancelReason)

	res, _ = f.do(t, "POST", path, "alice", nil)
	assert.Equal(t, 409, res.StatusCode, "finished")

	res, _ = f.do(t, "POST", path, "alice", strings.NewReader(`{`))
	assert.Equal(t, 400, res.StatusCode)

	// A cross-site POST is refused before it reaches the runtime.
	req, err := http.NewRequest("POST", f.srv.URL+path, nil)
	require.NoError(t, err)
	req.Header.Set("X-User", "alice")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	res, err = f.srv.Client().Do(req)
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, http.StatusForbidden, res.StatusCode)
}

// sseEvent is one parsed Server-Sent Event.
type sseEvent struct{ id, event, data string }

// readSSE parses a Server-Sent Events body per the WHATWG rules this
// package relies on: fields up to a blank line, comments ignored.
func readSSE(r io.Reader, events chan<- sseEvent, comments chan<- string) error {
	sc := bufio.NewScanner(r)
	var ev sseEvent
	var data []string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if len(data) > 0 {
				ev.data = strings.Join(data, "\n")
				events <- ev
			}
			ev, data = sseEvent{}, nil
		case strings.HasPrefix(line, ":"):
			select {
			case comments <- line:
			default:
			}
		default:
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "id":
				ev.id = value
			case "event":
				ev.event = value
			case "data":
				data = append(data, value)
			}
		}
	}
	return sc.Err()
}

// eventsRequest is a request of an event route as user, resuming after
// lastID unless it is empty.
func eventsRequest(t *testing.T, f *fixture, method, path, user, lastID string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+path, nil)
	require.NoError(t, err)
	req.Header.Set("X-User", user)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	return req
}

func openSSE(t *testing.T, f *fixture, path, user, lastID string) (*http.Response, chan sseEvent, chan string) {
	t.Helper()
	res, err := f.srv.Client().Do(eventsRequest(t, f, "GET", path, user, lastID))
	require.NoError(t, err)
	events, comments := make(chan sseEvent, 100), make(chan string, 1)
	if res.StatusCode == 200 {
		go func() {
			defer close(events)
			readSSE(res.Body, events, comments)
		}()
	} else {
		close(events)
	}
	t.Cleanup(func() { res.Body.Close() })
	return res, events, comments
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	require.NoError(t, err)
	return n
}

func next(t *testing.T, events <-chan sseEvent) (sseEvent, workershttp.Task, bool) {
	t.Helper()
	select {
	case ev, ok := <-events:
		if !ok {
			return ev, workershttp.Task{}, false
		}
		var tk workershttp.Task
		require.NoError(t, json.Unmarshal([]byte(ev.data), &tk))
		return ev, tk, true
	case <-time.After(10 * time.Second):
		t.Fatal("no event")
		return sseEvent{}, workershttp.Task{}, false
	}
}

// WithHeartbeat(0) turns heartbeats off; the stream itself works as ever.
func TestEventsWithoutHeartbeats(t *testing.T) {
	f := newFixture(t, workershttp.WithHeartbeat(0))
	release := make(chan struct{})
	sub, err := f.rt.Submit(context.Background(), "job", func(context.Context, *workers.Task) (any, error) {
		<-release
		return "ok", nil
	}, alice)
	require.NoError(t, err)
	res, events, comments := openSSE(t, f, "/tasks/"+url.PathEscape(sub.ID)+"/events", "alice", "")
	require.Equal(t, 200, res.StatusCode)
	_, tk, ok := next(t, events)
	require.True(t, ok, "the stream sends the current snapshot")
	assert.Equal(t, sub.ID, tk.ID)
	close(release)
	for !tk.Status.Terminal() {
		_, tk, ok = next(t, events)
		require.True(t, ok, "the stream ends after the terminal snapshot")
	}
	assert.Equal(t, workers.StatusCompleted, tk.Status)
	assert.Empty(t, comments, "no heartbeat was sent")
}

func TestEventsRoute(t *testing.T) {
	f := newFixture(t)
	step := make(chan int)
	sub, err := f.rt.Submit(context.Background(), "job", func(ctx context.Context, tk *workers.Task) (any, error) {
		for p := range step {
			tk.SetProgress(p)
		}
		return "ok", nil
	}, alice)
	require.NoError(t, err)
	path := "/tasks/" + url.PathEscape(sub.ID) + "/events"

	res, _ := f.do(t, "GET", path, "bob", nil)
	assert.Equal(t, 404, res.StatusCode, "a foreign task's stream is missing")

	res, events, comments := openSSE(t, f, path, "alice", "")
	require.Equal(t, 200, res.StatusCode)
	assert.Equal(t, "text/event-stream", res.Header.Get("Content-Type"))
	assert.Equal(t, "no-store, no-transform", res.Header.Get("Cache-Control"))
	assert.Equal(t, "no", res.Header.Get("X-Accel-Buffering"))
	ev, tk, _ := next(t, events)
	assert.Equal(t, "task", ev.event)
	assert.Equal(t, sub.ID, tk.ID)
	var lastID string
	for _, p := range []int{30, 60} {
		step <- p
		for tk.Progress < p {
			ev, tk, _ = next(t, events)
			lastID = ev.id
		}
		assert.Equal(t, p, tk.Progress)
	}
	select {
	case c := <-comments:
		assert.Equal(t, ": heartbeat", c)
	case <-time.After(10 * time.Second):
		t.Fatal("no heartbeat")
	}

	// Reconnection resumes with the current snapshot.
	res.Body.Close()
	res2, events2, _ := openSSE(t, f, path, "alice", lastID)
	require.Equal(t, 200, res2.StatusCode)
	ev2, tk2, _ := next(t, events2)
	assert.Equal(t, 60, tk2.Progress, "resumes with the current snapshot")
	run, n, _ := strings.Cut(lastID, "/")
	assert.Equal(t, run+"/"+strconv.Itoa(atoi(t, n)+1), ev2.id, "the resumed stream's ids go on from the last one's")
	close(step)
	var end sseEvent
	for {
		ev, tk, ok := next(t, events2)
		if !ok {
			break
		}
		end = ev
		if tk.Status.Terminal() {
			assert.Equal(t, workers.StatusCompleted, tk.Status)
		}
	}
	assert.Equal(t, sub.RunID+"/end", end.id, "the stream ends with the terminal event")

	// A client that had the end is told to stop reconnecting.
	res3, _, _ := openSSE(t, f, path, "alice", end.id)
	assert.Equal(t, http.StatusNoContent, res3.StatusCode)
}

func TestAllEventsRouteShowsOnlyCallersTasks(t *testing.T) {
	f := newFixture(t)
	res, events, _ := openSSE(t, f, "/events", "alice", "")
	require.Equal(t, 200, res.StatusCode)
	ctx := context.Background()
	nop := func(context.Context, *workers.Task) (any, error) { return nil, nil }
	// The subscription starts before the headers: what follows them shows.
	_, err := f.rt.Submit(ctx, "b", nop, bob)
	require.NoError(t, err)
	sub, err := f.rt.Submit(ctx, "a", nop, alice)
	require.NoError(t, err)
	for {
		_, tk, ok := next(t, events)
		require.True(t, ok)
		require.Equal(t, sub.ID, tk.ID, "only alice's tasks")
		if tk.Status.Terminal() {
			break
		}
	}
}

func TestDashboardIsOptIn(t *testing.T) {
	f := newFixture(t)
	res, _ := f.do(t, "GET", "/", "alice", nil)
	assert.Equal(t, 404, res.StatusCode)
	g := newFixture(t, workershttp.WithDashboard())
	res, body := g.do(t, "GET", "/", "alice", nil)
	assert.Equal(t, 200, res.StatusCode)
	assert.Contains(t, string(body), "EventSource")
	assert.Contains(t, res.Header.Get("Content-Type"), "text/html")
}

// The dashboard's Cancel buttons act for whoever the browser signs in:
// no other site may frame the page and lay its own page over them.
func TestDashboardRefusesToBeFramedByOtherSites(t *testing.T) {
	f := newFixture(t, workershttp.WithDashboard())
	res, _ := f.do(t, "GET", "/", "alice", nil)
	require.Equal(t, 200, res.StatusCode)
	assert.Contains(t, res.Header.Get("Content-Security-Policy"), "frame-ancestors 'self'")
	assert.Equal(t, "SAMEORIGIN", res.Header.Get("X-Frame-Options"), "for browsers without frame-ancestors")
}

// A task id that is a dot segment (a global key "." or "..") is escaped
// whole in the Location, which names the task and not the list route or
// its parent.
func TestASubmissionsLocationOfADotIDNamesTheTask(t *testing.T) {
	f := newFixture(t)
	for _, key := range []string{".", ".."} {
		sub, err := f.rt.Submit(context.Background(), key, func(context.Context, *workers.Task) (any, error) { return nil, nil }, alice, workers.WithScope(workers.ScopeGlobal))
		require.NoError(t, err)
		require.Equal(t, key, sub.ID)
		waitEnd(t, f.rt, sub.ID)

		w := httptest.NewRecorder()
		workershttp.WriteSubmission(w, "", sub, nil)
		loc := w.Header().Get("Location")
		res, body := f.do(t, "GET", loc, "alice", nil)
		require.Equal(t, 200, res.StatusCode, "GET Location %q: %s", loc, body)
		var tk workershttp.Task
		require.NoError(t, json.Unmarshal(body, &tk))
		assert.Equal(t, key, tk.ID, "GET Location %q", loc)
	}
}

func TestWriteSubmission(t *testing.T) {
	w := httptest.NewRecorder()
	workershttp.WriteSubmission(w, "/api", workers.Submission{ID: "alice::x", RunID: "r1"}, nil)
	assert.Equal(t, 202, w.Code)
	assert.Equal(t, "/api/tasks/alice::x", w.Header().Get("Location"))
	assert.JSONEq(t, `{"id":"alice::x","run_id":"r1","joined":false}`, w.Body.String())

	w = httptest.NewRecorder()
	workershttp.WriteSubmission(w, "", workers.Submission{ID: "alice::x", RunID: "r1", Joined: true}, nil)
	assert.Equal(t, 200, w.Code)

	w = httptest.NewRecorder()
	workershttp.WriteSubmission(w, "", workers.Submission{}, fmt.Errorf("wrapped: %w", workers.ErrClosed))
	assert.Equal(t, 503, w.Code)
}

func TestRequestsNoRouteTakesAreAnsweredInJSON(t *testing.T) {
	f := newFixture(t)
	for _, c := range []struct {
		method, path string
		status       int
		code, allow  string
	}{
		{"GET", "/nothing/here", 404, "not_found", ""},
		{"DELETE", "/tasks/k", 405, "method_not_allowed", "GET, HEAD"},
		{"GET", "/tasks/k/cancel", 405, "method_not_allowed", "POST"},
	} {
		res, body := f.do(t, c.method, c.path, "alice", nil)
		assert.Equal(t, c.status, res.StatusCode, "%s %s", c.method, c.path)
		assert.Equal(t, "application/json", res.Header.Get("Content-Type"), "%s %s", c.method, c.path)
		assert.Equal(t, c.allow, res.Header.Get("Allow"), "%s %s", c.method, c.path)
		var e struct {
			Error struct{ Code, Message string }
		}
		require.NoError(t, json.Unmarshal(body, &e), "%s %s: %s", c.method, c.path, body)
		assert.Equal(t, c.code, e.Error.Code, "%s %s", c.method, c.path)
	}
	// The routes themselves are untouched, path values included.
	res, body := f.do(t, "GET", "/tasks/"+url.PathEscape("alice::nothing"), "alice", nil)
	assert.Equal(t, 404, res.StatusCode)
	assert.Contains(t, string(body), `"task not found"`)

	// A path not in its clean form is still redirected to it, by the mux,
	// whether or not a route takes the clean one.
	client := f.srv.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	for path, clean := range map[string]string{"/nothing//here": "/nothing/here", "/tasks//k": "/tasks/k"} {
		res, err := client.Get(f.srv.URL + path)
		require.NoError(t, err)
		res.Body.Close()
		assert.Contains(t, []int{301, 307, 308}, res.StatusCode, path)
		assert.Equal(t, clean, res.Header.Get("Location"), path)
	}
}

// A nil Option sets nothing, as the runtime's options do.
func TestHandlerSkipsANilOption(t *testing.T) {
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	t.Cleanup(func() { rt.Shutdown(context.Background()) })
	h := workershttp.Handler(rt, func(*http.Request) (workers.TaskAuthority, error) { return workers.System, nil }, nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/tasks", nil))
	if rec.Code != http.StatusOK {
		t.Errorf("GET /tasks: %d %s", rec.Code, rec.Body)
	}
}

// Every malformed input of the caller's is answered 400 with one
// machine-readable code, whichever check refused it: the handler's own
// (a status filter, a limit, a cancel body, an event stream's body),
// the runtime's (a cursor), or an application's route's that wraps
// ErrBadRequest.
func TestMalformedInputIsOneCode(t *testing.T) {
	f := newFixture(t)
	sub, err := f.rt.Submit(context.Background(), "done", func(context.Context, *workers.Task) (any, error) { return nil, nil }, alice)
	require.NoError(t, err)
	waitEnd(t, f.rt, sub.ID)
	code := func(body []byte) string {
		var e struct {
			Error struct{ Code string } `json:"error"`
		}
		require.NoError(t, json.Unmarshal(body, &e), string(body))
		return e.Error.Code
	}
	for _, c := range []struct {
		name, method, path string
		body               string
	}{
		{"a cursor that is not base64", "GET", "/tasks?cursor=!!!", ""},
		{"a cursor that is not a position", "GET", "/tasks?cursor=bm90LWpzb24", ""},
		{"an unknown status", "GET", "/tasks?status=bogus", ""},
		{"a limit out of range", "GET", "/tasks?limit=0", ""},
		{"a limit that is no number", "GET", "/tasks?limit=ten", ""},
		{"a cancel body that is no JSON", "POST", "/tasks/" + url.PathEscape(sub.ID) + "/cancel", "{"},
		{"an event stream's request with a body", "GET", "/events", "x"},
	} {
		var body io.Reader
		if c.body != "" {
			body = strings.NewReader(c.body)
		}
		res, b := f.do(t, c.method, c.path, "alice", body)
		assert.Equal(t, 400, res.StatusCode, "%s: %s", c.name, b)
		assert.Equal(t, "invalid_input", code(b), c.name)
	}
	for _, err := range []error{
		fmt.Errorf("%w: steps must be 1 to 1000", workershttp.ErrBadRequest),
		workers.ErrInvalidCursor,
		workers.ErrInvalidKey,
		invalidOwner(),
		workers.ErrInvalidOption,
	} {
		w := httptest.NewRecorder()
		workershttp.WriteError(w, err)
		assert.Equal(t, 400, w.Code, "%v", err)
		assert.Equal(t, "invalid_input", code(w.Body.Bytes()), "%v", err)
	}
}
