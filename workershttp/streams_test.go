package workershttp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/workershttp"
)

func get(t *testing.T, url string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	require.NoError(t, err)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body) // a stream that never ends is cut by ctx
	return res, b
}

// An identity the runtime refuses (a zero Owner from an authenticate
// that did not check its own result) is 401 on every route, /events
// included, and not an empty event stream that an EventSource would
// reconnect to forever.
func TestAllEventsRefusesAnIdentityTheRuntimeRefuses(t *testing.T) {
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	zero := func(*http.Request) (workers.TaskAuthority, error) { return workers.Owner{}, nil }
	srv := start(t, rt, httptest.NewUnstartedServer(workershttp.Handler(rt, zero, workershttp.WithHeartbeat(0))))

	res, body := get(t, srv.URL+"/tasks", nil)
	require.Equal(t, http.StatusUnauthorized, res.StatusCode, string(body))
	res, body = get(t, srv.URL+"/tasks/alice::x/events", nil)
	require.Equal(t, http.StatusUnauthorized, res.StatusCode, string(body))

	res, body = get(t, srv.URL+"/events", nil)
	assert.Equal(t, http.StatusUnauthorized, res.StatusCode,
		"/events answers %d %q (Content-Type %q) for a refused identity", res.StatusCode, body, res.Header.Get("Content-Type"))
}

// failingStore fails ListTasks, as a database that is down does.
type failingStore struct{ *workers.MemStore }

func (failingStore) ListTasks(context.Context, workers.Filter) ([]workers.Record, error) {
	return nil, errors.New("pq: connection refused to 10.0.0.5")
}

// A store failure at the start of GET /events is answered 500, and
// logged, as on the list route.
func TestAllEventsAnswersAndLogsAStoreFailure(t *testing.T) {
	rt := workers.NewRuntime(failingStore{workers.NewMemStore()}, workers.Config{})
	var mu sync.Mutex
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))
	srv := start(t, rt, httptest.NewUnstartedServer(workershttp.Handler(rt, authByHeader, workershttp.WithLogger(logger), workershttp.WithHeartbeat(0))))

	res, body := get(t, srv.URL+"/tasks", map[string]string{"X-User": "alice"})
	require.Equal(t, 500, res.StatusCode, string(body))
	mu.Lock()
	require.Contains(t, logs.String(), "connection refused", "the list route logs its 5xx")
	logs.Reset()
	mu.Unlock()

	res, body = get(t, srv.URL+"/events", map[string]string{"X-User": "alice"})
	assert.Equal(t, 500, res.StatusCode, "/events answers %d %q on a store failure", res.StatusCode, body)
	mu.Lock()
	defer mu.Unlock()
	assert.Contains(t, logs.String(), "connection refused", "the /events failure is logged")
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// http.Server.Shutdown waits for every connection to go idle, which an
// open event stream never does by itself: with WithStreamContext, and its
// cancel registered with RegisterOnShutdown, the streams end as the
// server shuts down.
func TestEventStreamsEndWithTheStreamContext(t *testing.T) {
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	streams, endStreams := context.WithCancel(context.Background())
	defer endStreams()
	srv := httptest.NewUnstartedServer(workershttp.Handler(rt, authByHeader, workershttp.WithHeartbeat(0), workershttp.WithStreamContext(streams)))
	srv.Config.RegisterOnShutdown(endStreams)
	start(t, rt, srv)
	req, err := http.NewRequest("GET", srv.URL+"/events", nil)
	require.NoError(t, err)
	req.Header.Set("X-User", "alice")
	res, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, 200, res.StatusCode) // the stream is open

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	assert.NoError(t, srv.Config.Shutdown(ctx), "the open event stream ended as the server shut down")
}

// A cancel body over the 4 KiB bound is 413, not a 400 that blames the
// JSON.
func TestCancelBodyTooLargeIs413(t *testing.T) {
	f := newFixture(t)
	release := make(chan struct{})
	defer close(release)
	sub, err := f.rt.Submit(context.Background(), "job", blocker(release), alice)
	require.NoError(t, err)
	body := `{"reason":"` + strings.Repeat("x", 5000) + `"}`
	res, b := f.do(t, "POST", "/tasks/"+sub.ID+"/cancel", "alice", strings.NewReader(body))
	assert.Equal(t, http.StatusRequestEntityTooLarge, res.StatusCode, string(b))
}

// The dashboard opens its event stream first and lists the tasks once it
// is open, on every (re)connection. That order relies on this: the stream
// has subscribed by the time its headers arrive, so a task that ends
// after they did, and before the list is read, is in the stream.
func TestEventsStreamHoldsAnEndBetweenItsOpenAndAList(t *testing.T) {
	f := newFixture(t, workershttp.WithDashboard())
	release := make(chan struct{})
	sub, err := f.rt.Submit(context.Background(), "x", blocker(release), alice)
	require.NoError(t, err)

	res, events, _ := openSSE(t, f, "/events", "alice", "")
	require.Equal(t, 200, res.StatusCode)
	close(release)
	waitEnd(t, f.rt, sub.ID)
	res, body := f.do(t, "GET", "/tasks?limit=100", "alice", nil)
	require.Equal(t, 200, res.StatusCode)
	var p workershttp.Page
	require.NoError(t, json.Unmarshal(body, &p))

	seen := map[string]workers.Status{}
	for {
		_, tk, ok := next(t, events)
		require.True(t, ok)
		seen[tk.ID] = tk.Status
		if tk.ID == sub.ID && tk.Status.Terminal() {
			break
		}
	}
	assert.Equal(t, workers.StatusCompleted, seen[sub.ID])
}

// HEAD is served by the GET patterns. On an event route it answers the
// stream's headers and ends: net/http discards a HEAD body, so a stream
// would never find its client gone, and the next request on that
// keep-alive connection would never be served.
func TestHeadOnAnEventRouteHoldsNoConnection(t *testing.T) {
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	headDone := make(chan struct{})
	h := workershttp.Handler(rt, authByHeader, workershttp.WithHeartbeat(20*time.Millisecond))
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "HEAD" {
			defer close(headDone)
		}
		h.ServeHTTP(w, r)
	}))
	base, cancelBase := context.WithCancel(context.Background())
	srv.Config.BaseContext = func(net.Listener) context.Context { return base }
	start(t, rt, srv)
	t.Cleanup(cancelBase) // before the server closes: a HEAD that streamed would hold it
	tr := &http.Transport{MaxConnsPerHost: 1}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}

	req, err := http.NewRequest("HEAD", srv.URL+"/events", nil)
	require.NoError(t, err)
	req.Header.Set("X-User", "alice")
	res, err := client.Do(req)
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, 200, res.StatusCode)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err = http.NewRequestWithContext(ctx, "GET", srv.URL+"/tasks", nil)
	require.NoError(t, err)
	req.Header.Set("X-User", "alice")
	res, err = client.Do(req)
	if assert.NoError(t, err, "the request after a HEAD on /events, on the same connection") {
		res.Body.Close()
	}
	tr.CloseIdleConnections() // the client is gone

	select {
	case <-headDone:
	case <-time.After(2 * time.Second):
		t.Error("the HEAD /events handler still runs after its client closed the connection")
	}
}

// A client that stops reading, its connection open, is cut off once a
// write of its stream has waited WithWriteTimeout: the handler does not
// stay blocked in the write for good.
func TestEventStreamCutsOffAClientThatStopsReading(t *testing.T) {
	rt, id := bigEndedTask(t)
	h := workershttp.Handler(rt, authByHeader, workershttp.WithHeartbeat(0), workershttp.WithWriteTimeout(200*time.Millisecond))
	ended := make(chan struct{})
	srv := start(t, rt, httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(ended)
		h.ServeHTTP(w, r)
	})))
	askWithoutReading(t, srv, id)
	select {
	case <-ended:
	case <-time.After(time.Minute): // the encoding of the result may take seconds under -race
		t.Fatal("the stream's handler is still writing to a client that reads nothing")
	}
}

// bigEndedTask returns a runtime and the id of a task of it that ended
// with a result of 12 MB, more than the loopback's buffers hold for a
// client that reads nothing.
func bigEndedTask(t *testing.T) (*workers.Runtime[*workers.MemStore], string) {
	t.Helper()
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	big := strings.Repeat("x", 12<<20)
	sub, err := rt.Submit(context.Background(), "big", func(context.Context, *workers.Task) (any, error) { return big, nil }, alice)
	require.NoError(t, err)
	waitEnd(t, rt, sub.ID)
	return rt, sub.ID
}

// askWithoutReading asks srv for the events of the task id as alice, on
// a connection that reads nothing and is closed when the test ends.
func askWithoutReading(t *testing.T, srv *httptest.Server, id string) {
	t.Helper()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	_, err = fmt.Fprintf(conn, "GET /tasks/%s/events HTTP/1.1\r\nHost: test\r\nX-User: alice\r\n\r\n", id)
	require.NoError(t, err)
}

// noFlush is a middleware's ResponseWriter that hides Flush.
type noFlush struct{ http.ResponseWriter }

// Behind a middleware whose writer cannot flush, no event would reach
// the client: both event routes answer 500, which an EventSource does not
// reconnect to, rather than the headers of a stream that ends empty, and
// the log says why.
func TestEventStreamBehindAWriterThatCannotFlushIsAServerErrorAndLogged(t *testing.T) {
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	var mu sync.Mutex
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))
	h := workershttp.Handler(rt, authByHeader, workershttp.WithLogger(logger), workershttp.WithHeartbeat(10*time.Millisecond))
	srv := start(t, rt, httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(noFlush{w}, r)
	})))
	release := make(chan struct{})
	defer close(release)
	sub, err := rt.Submit(context.Background(), "job", blocker(release), alice)
	require.NoError(t, err)
	f := &fixture{srv: srv}
	for _, path := range []string{"/events", "/tasks/" + url.PathEscape(sub.ID) + "/events"} {
		for _, method := range []string{"GET", "HEAD"} {
			res, body := f.do(t, method, path, "alice", nil)
			assert.Equal(t, http.StatusInternalServerError, res.StatusCode, "%s %s: Content-Type %q, body %q", method, path, res.Header.Get("Content-Type"), body)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, 4, strings.Count(logs.String(), "cannot flush"), logs.String())
}

// GET /events is refused with the status of what refuses the
// subscription, not answered with an empty stream that an EventSource
// would reconnect to forever: a runtime shut down is 503, one built with
// a Config it cannot run with is the server's fault, 500, and logged.
func TestAllEventsRefusedByTheRuntimeIsNotAnEmptyStream(t *testing.T) {
	for name, c := range map[string]struct {
		rt     func(t *testing.T) *workers.Runtime[*workers.MemStore]
		status int
		logged string
	}{
		"shut down": {func(t *testing.T) *workers.Runtime[*workers.MemStore] {
			rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
			require.NoError(t, rt.Shutdown(context.Background()))
			return rt
		}, http.StatusServiceUnavailable, ""},
		"misconfigured": {func(*testing.T) *workers.Runtime[*workers.MemStore] {
			return workers.NewRuntime(workers.NewMemStore(), workers.Config{CleanupInterval: -1})
		}, http.StatusInternalServerError, "negative CleanupInterval"},
	} {
		t.Run(name, func(t *testing.T) {
			rt := c.rt(t)
			var mu sync.Mutex
			var logs bytes.Buffer
			logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))
			srv := start(t, rt, httptest.NewUnstartedServer(workershttp.Handler(rt, authByHeader, workershttp.WithLogger(logger), workershttp.WithHeartbeat(0))))
			for _, method := range []string{"GET", "HEAD"} {
				req, err := http.NewRequest(method, srv.URL+"/events", nil)
				require.NoError(t, err)
				req.Header.Set("X-User", "alice")
				res, err := srv.Client().Do(req)
				require.NoError(t, err)
				body, _ := io.ReadAll(res.Body)
				res.Body.Close()
				assert.Equal(t, c.status, res.StatusCode, "%s /events: %q (Content-Type %q)", method, body, res.Header.Get("Content-Type"))
			}
			mu.Lock()
			defer mu.Unlock()
			assert.Contains(t, logs.String(), c.logged)
		})
	}
}

// HEAD on a task's event route answers as GET would: 404 for a task the
// caller may not see.
func TestHeadOnTheEventsOfATaskTheCallerMayNotSeeIs404(t *testing.T) {
	f := newFixture(t, workershttp.WithHeartbeat(0))
	sub, err := f.rt.Submit(context.Background(), "mine", func(context.Context, *workers.Task) (any, error) { return nil, nil }, alice)
	require.NoError(t, err)
	waitEnd(t, f.rt, sub.ID)
	res, _ := f.do(t, "HEAD", "/tasks/"+url.PathEscape(sub.ID)+"/events", "bob", nil)
	assert.Equal(t, http.StatusNotFound, res.StatusCode, "bob may not see alice's task")
	res, _ = f.do(t, "HEAD", "/tasks/alice::nothing/events", "alice", nil)
	assert.Equal(t, http.StatusNotFound, res.StatusCode)
	res, _ = f.do(t, "HEAD", "/tasks/"+url.PathEscape(sub.ID)+"/events", "alice", nil)
	assert.Equal(t, http.StatusOK, res.StatusCode)
}

// The default cross-origin protection refuses in JSON, like every other
// error of the handler.
func TestCrossOriginRefusalIsJSON(t *testing.T) {
	f := newFixture(t)
	req, err := http.NewRequest("POST", f.srv.URL+"/tasks/alice::k/cancel", nil)
	require.NoError(t, err)
	req.Header.Set("X-User", "alice")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	res, err := f.srv.Client().Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusForbidden, res.StatusCode)
	assert.Equal(t, "application/json", res.Header.Get("Content-Type"))
	assert.Equal(t, "cross_origin", errorCode(t, res))
}

// HEAD on a task's events answers what GET answers, whatever refuses it:
// a runtime shut down (503), a caller who may not see the task (404), a
// client that has the run's end already (204).
func TestHeadOnTaskEventsAnswersAsGetDoes(t *testing.T) {
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	f := &fixture{rt: rt, srv: start(t, rt, httptest.NewUnstartedServer(workershttp.Handler(rt, authByHeader, workershttp.WithHeartbeat(0))))}
	sub, err := rt.Submit(context.Background(), "k", func(context.Context, *workers.Task) (any, error) { return nil, nil }, alice)
	require.NoError(t, err)
	end := waitEnd(t, rt, sub.ID)
	path := "/tasks/" + url.PathEscape(sub.ID) + "/events"
	both := func(user, lastID string) (get, head int) {
		t.Helper()
		for _, method := range []string{"GET", "HEAD"} {
			res, err := f.srv.Client().Do(eventsRequest(t, f, method, path, user, lastID))
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if method == "GET" {
				get = res.StatusCode
			} else {
				head = res.StatusCode
			}
		}
		return get, head
	}
	get, head := both("bob", "")
	assert.Equal(t, [2]int{404, 404}, [2]int{get, head}, "a task bob may not see")
	get, head = both("alice", end.RunID+"/end")
	assert.Equal(t, [2]int{204, 204}, [2]int{get, head}, "a client that has the end")
	require.NoError(t, rt.Shutdown(context.Background()))
	get, head = both("alice", "")
	assert.Equal(t, [2]int{503, 503}, [2]int{get, head}, "after Shutdown")
}

// countingLists is a MemStore that counts its ListTasks calls.
type countingLists struct {
	*workers.MemStore
	n atomic.Int32
}

func (s *countingLists) ListTasks(ctx context.Context, f workers.Filter) ([]workers.Record, error) {
	s.n.Add(1)
	return s.MemStore.ListTasks(ctx, f)
}

// HEAD on /events reads the store once, for the check GET makes before
// its stream, and starts no subscription.
func TestHeadOnAllEventsStartsNoSubscription(t *testing.T) {
	s := &countingLists{MemStore: workers.NewMemStore()}
	rt := workers.NewRuntime(s, workers.Config{})
	srv := start(t, rt, httptest.NewUnstartedServer(workershttp.Handler(rt, authByHeader, workershttp.WithHeartbeat(0))))
	req, err := http.NewRequest("HEAD", srv.URL+"/events", nil)
	require.NoError(t, err)
	req.Header.Set("X-User", "alice")
	res, err := srv.Client().Do(req)
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.NoError(t, rt.Shutdown(context.Background())) // a subscription would have read by now
	assert.Equal(t, int32(1), s.n.Load(), "store reads")
}

// readFailsAfterCancel is a MemStore that fails every read once a task
// was cancelled: a database that went away just after the cancel landed.
type readFailsAfterCancel struct {
	*workers.MemStore
	cancelled atomic.Bool
}

func (s *readFailsAfterCancel) GetTask(ctx context.Context, id string) (workers.Record, error) {
	if s.cancelled.Load() {
		return workers.Record{}, errors.New("connection reset")
	}
	return s.MemStore.GetTask(ctx, id)
}

func (s *readFailsAfterCancel) TransitionTask(ctx context.Context, id, runID string, from []workers.Status, next workers.State) (bool, error) {
	ok, err := s.MemStore.TransitionTask(ctx, id, runID, from, next)
	if ok && next.Status == workers.StatusCancelled {
		s.cancelled.Store(true)
	}
	return ok, err
}

// A cancel that landed is answered 204 when the read of the task after
// it fails: not a 5xx, whose retry would be told the task finished.
func TestCancelThatLandedIsNotAnErrorWhenTheReadAfterItFails(t *testing.T) {
	s := &readFailsAfterCancel{MemStore: workers.NewMemStore()}
	rt := workers.NewRuntime(s, workers.Config{})
	f := &fixture{srv: start(t, rt, httptest.NewUnstartedServer(workershttp.Handler(rt, authByHeader, workershttp.WithHeartbeat(0))))}
	release := make(chan struct{})
	defer close(release)
	sub, err := rt.Submit(context.Background(), "k", blocker(release), alice)
	require.NoError(t, err)
	res, body := f.do(t, "POST", "/tasks/"+url.PathEscape(sub.ID)+"/cancel", "alice", nil)
	assert.Equal(t, http.StatusNoContent, res.StatusCode, "%s", body)
	assert.True(t, s.cancelled.Load())
	rec, err := s.MemStore.GetTask(context.Background(), sub.ID)
	require.NoError(t, err)
	assert.Equal(t, workers.StatusCancelled, rec.Status)
}

// flushOnly is a middleware's ResponseWriter that flushes but has no
// Unwrap method: a write deadline cannot be set through it.
type flushOnly struct{ http.ResponseWriter }

func (f flushOnly) Flush() { f.ResponseWriter.(http.Flusher).Flush() }

// Behind a writer that cannot set a write deadline, streams are served,
// and the log says once what they go without: their write timeout, or,
// with WithWriteTimeout(0), a way around the server's WriteTimeout.
func TestEventStreamsBehindAWriterWithoutDeadlinesAreServedAndLoggedOnce(t *testing.T) {
	for name, c := range map[string]struct {
		opts   []workershttp.Option
		logged string
	}{
		"write timeout": {nil, "without their write timeout"},
		"none":          {[]workershttp.Option{workershttp.WithWriteTimeout(0)}, "end at the server's WriteTimeout"},
	} {
		t.Run(name, func(t *testing.T) {
			rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
			var mu sync.Mutex
			var logs bytes.Buffer
			logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))
			h := workershttp.Handler(rt, authByHeader, append([]workershttp.Option{workershttp.WithLogger(logger), workershttp.WithHeartbeat(0)}, c.opts...)...)
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				h.ServeHTTP(flushOnly{w}, r)
			}))
			srv.Config.WriteTimeout = time.Minute
			f := &fixture{rt: rt, srv: start(t, rt, srv)}
			var streams []chan sseEvent
			for range 2 {
				res, events, _ := openSSE(t, f, "/events", "alice", "")
				require.Equal(t, http.StatusOK, res.StatusCode)
				streams = append(streams, events)
			}
			sub, err := rt.Submit(context.Background(), "job", func(context.Context, *workers.Task) (any, error) { return nil, nil }, alice)
			require.NoError(t, err)
			for _, events := range streams {
				for {
					_, tk, ok := next(t, events)
					require.True(t, ok, "the stream ended")
					if tk.ID == sub.ID && tk.Status.Terminal() {
						break
					}
				}
			}
			mu.Lock()
			defer mu.Unlock()
			assert.Equal(t, 1, strings.Count(logs.String(), c.logged), logs.String())
		})
	}
}

// A runtime's Shutdown, a deploy's expected end, ends the open streams
// without an error in the log.
func TestRuntimeShutdownEndsStreamsWithoutAnErrorLog(t *testing.T) {
	var mu sync.Mutex
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))
	f := newFixture(t, workershttp.WithLogger(logger), workershttp.WithHeartbeat(0))
	res, events, _ := openSSE(t, f, "/events", "alice", "")
	require.Equal(t, http.StatusOK, res.StatusCode)
	sub, err := f.rt.Submit(context.Background(), "job", func(context.Context, *workers.Task) (any, error) { return nil, nil }, alice)
	require.NoError(t, err)
	_, tk, ok := next(t, events)
	require.True(t, ok)
	require.Equal(t, sub.ID, tk.ID)
	require.NoError(t, f.rt.Shutdown(context.Background()))
	for {
		if _, _, ok := next(t, events); !ok {
			break // the stream ended
		}
	}
	mu.Lock()
	defer mu.Unlock()
	assert.NotContains(t, logs.String(), "level=ERROR")
}

// heldReads is a store without notices whose reads wait while mu is
// held: a test holds it to make several writes land between two reads.
type heldReads struct {
	workers.Store
	mu sync.RWMutex
}

func (s *heldReads) GetTask(ctx context.Context, id string) (workers.Record, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.Store.GetTask(ctx, id)
}

func (s *heldReads) ListTasks(ctx context.Context, f workers.Filter) ([]workers.Record, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.Store.ListTasks(ctx, f)
}

// GET /events tells a client that a task it showed live is gone when the
// stream cannot read how its run ended: here the run ended in another
// runtime, and the key was re-run without alice among its watchers, before
// alice's stream read the record again.
func TestAllEventsSaysGoneOfATaskItCannotFollowToItsEnd(t *testing.T) {
	ctx := context.Background()
	mem := workers.NewMemStore()
	reads := &heldReads{Store: mem}
	front := workers.NewRuntime[workers.Store](struct {
		workers.Store
		workers.Leaser
	}{reads, mem}, workers.Config{})
	runner := workers.NewRuntime(mem, workers.Config{})
	release, again := make(chan struct{}), make(chan struct{})
	defer func() {
		close(again)
		require.NoError(t, runner.Shutdown(ctx))
	}()
	sub, err := runner.Submit(ctx, "x", blocker(release), bob, workers.WithWatchers(alice))
	require.NoError(t, err)
	f := &fixture{srv: start(t, front, httptest.NewUnstartedServer(workershttp.Handler(front, authByHeader)))}
	res, events, _ := openSSE(t, f, "/events", "alice", "")
	require.Equal(t, 200, res.StatusCode)
	_, tk, ok := next(t, events)
	require.True(t, ok)
	require.Equal(t, sub.ID, tk.ID)
	require.Equal(t, workers.StatusRunning, tk.Status)

	reads.mu.Lock()
	close(release)
	_, err = runner.Wait(ctx, sub.ID, workers.System)
	require.NoError(t, err)
	_, err = runner.Submit(ctx, "x", blocker(again), bob) // watchers reset to bob
	require.NoError(t, err)
	reads.mu.Unlock()

	for {
		ev, tk, ok := next(t, events)
		require.True(t, ok, "the stream ended")
		require.Equal(t, sub.ID, tk.ID)
		require.False(t, tk.Status.Terminal(), "a run's end alice's stream could not have read")
		if ev.event == "gone" {
			assert.Equal(t, sub.RunID+"/gone", ev.id)
			assert.Equal(t, sub.RunID, tk.RunID)
			assert.JSONEq(t, fmt.Sprintf(`{"id":%q,"run_id":%q}`, sub.ID, sub.RunID), ev.data)
			break
		}
		require.Equal(t, "task", ev.event)
	}
}

// Over HTTP/2, the deadline of a heartbeat's write is cleared once it is
// flushed, as an event's is: heartbeats farther apart than the write
// timeout keep a stream open.
func TestHTTP2HeartbeatsFartherApartThanTheWriteTimeoutKeepTheStream(t *testing.T) {
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	srv := httptest.NewUnstartedServer(workershttp.Handler(rt, authByHeader,
		workershttp.WithHeartbeat(150*time.Millisecond), workershttp.WithWriteTimeout(100*time.Millisecond)))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	f := &fixture{rt: rt, srv: start(t, rt, srv)}
	res, events, comments := openSSE(t, f, "/events", "alice", "")
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Equal(t, 2, res.ProtoMajor, "served over HTTP/2")
	beats := 0
	idle := time.After(700 * time.Millisecond)
	for {
		select {
		case _, ok := <-events:
			require.True(t, ok, "the stream was cut after %d heartbeats", beats)
		case _, ok := <-comments:
			require.True(t, ok, "the stream was cut after %d heartbeats", beats)
			beats++
		case <-idle:
			require.GreaterOrEqual(t, beats, 3, "heartbeats every 150ms for 700ms")
			return
		}
	}
}

// Over HTTP/2 a write deadline is a timer on the stream, which resets the
// stream when it fires, whether a write is under way or not: each write
// of an event stream is bounded by WithWriteTimeout, and the time between
// writes is not, so a stream with nothing to send lives on.
func TestAnIdleHTTP2StreamOutlivesTheWriteTimeout(t *testing.T) {
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	srv := httptest.NewUnstartedServer(workershttp.Handler(rt, authByHeader,
		workershttp.WithHeartbeat(0), workershttp.WithWriteTimeout(100*time.Millisecond)))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	f := &fixture{rt: rt, srv: start(t, rt, srv)}
	release := make(chan struct{})
	defer close(release)
	sub, err := rt.Submit(context.Background(), "job", blocker(release), alice)
	require.NoError(t, err)

	paths := []string{"/events", "/tasks/" + url.PathEscape(sub.ID) + "/events"}
	streams := make([]chan sseEvent, len(paths))
	for i, path := range paths {
		res, events, _ := openSSE(t, f, path, "alice", "")
		require.Equal(t, http.StatusOK, res.StatusCode, path)
		require.Equal(t, 2, res.ProtoMajor, "%s is served over HTTP/2", path)
		streams[i] = events
	}
	end := time.Now().Add(500 * time.Millisecond) // five write timeouts
	for i, events := range streams {
		idle := time.After(time.Until(end))
		for open := true; open; {
			select {
			case _, ok := <-events:
				require.True(t, ok, "%s: the idle stream was cut", paths[i])
			case <-idle:
				open = false
			}
		}
	}
}

// WithWriteTimeout(0) sets no bound: the server's WriteTimeout, which
// net/http sets when it has read the request, does not end a stream at
// that age either, over HTTP/1 or HTTP/2.
func TestStreamsWithoutAWriteTimeoutOutliveTheServersWriteTimeout(t *testing.T) {
	for _, proto := range []int{1, 2} {
		t.Run(fmt.Sprintf("HTTP%d", proto), func(t *testing.T) {
			t.Parallel()
			rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
			srv := httptest.NewUnstartedServer(workershttp.Handler(rt, authByHeader,
				workershttp.WithHeartbeat(20*time.Millisecond), workershttp.WithWriteTimeout(0)))
			srv.Config.WriteTimeout = 100 * time.Millisecond
			if proto == 2 {
				srv.EnableHTTP2 = true
				srv.StartTLS()
			}
			f := &fixture{rt: rt, srv: start(t, rt, srv)}
			res, events, comments := openSSE(t, f, "/events", "alice", "")
			require.Equal(t, http.StatusOK, res.StatusCode)
			require.Equal(t, proto, res.ProtoMajor)
			idle := time.After(500 * time.Millisecond) // five of the server's WriteTimeout
			for {
				select {
				case _, ok := <-events:
					require.True(t, ok, "the stream was cut at the server's WriteTimeout")
				case <-comments:
				case <-idle:
					return
				}
			}
		})
	}
}

// An event stream asked for once the stream context has ended (the
// server is shutting down, and its RegisterOnShutdown ended the streams)
// is refused 503, as on a runtime shut down, on both routes and whatever
// the store answers first: never a 200 that is no event stream, on which
// an EventSource gives up.
func TestEventStreamsAskedForAfterTheStreamContextEndedAre503(t *testing.T) {
	streams, endStreams := context.WithCancel(context.Background())
	f := newFixture(t, workershttp.WithStreamContext(streams))
	release := make(chan struct{})
	defer close(release)
	sub, err := f.rt.Submit(context.Background(), "job", blocker(release), alice)
	require.NoError(t, err)
	endStreams()
	for range 50 {
		for _, path := range []string{"/tasks/" + url.PathEscape(sub.ID) + "/events", "/events"} {
			for _, method := range []string{"GET", "HEAD"} {
				res, body := f.do(t, method, path, "alice", nil)
				require.Equal(t, http.StatusServiceUnavailable, res.StatusCode, "%s %s: Content-Type %q, body %q", method, path, res.Header.Get("Content-Type"), body)
				require.Equal(t, "application/json", res.Header.Get("Content-Type"), "%s %s", method, path)
			}
		}
	}
}

// heldKey marks a request whose task reads heldReadsOfRequests holds.
type heldKey struct{}

// heldReadsOfRequests is a MemStore whose reads of a task for a marked
// request say so on reading, then wait for their context to end, as a
// database read cut off does.
type heldReadsOfRequests struct {
	*workers.MemStore
	reading chan struct{}
}

func (s heldReadsOfRequests) GetTask(ctx context.Context, id string) (workers.Record, error) {
	if ctx.Value(heldKey{}) == nil {
		return s.MemStore.GetTask(ctx, id)
	}
	s.reading <- struct{}{}
	<-ctx.Done()
	return workers.Record{}, ctx.Err()
}

// A task's event stream whose stream context ends while it reads the
// task's first snapshot is refused 503, as one asked for after it ended.
func TestATaskStreamWhoseStreamContextEndsBeforeItsFirstEventIs503(t *testing.T) {
	s := heldReadsOfRequests{MemStore: workers.NewMemStore(), reading: make(chan struct{})}
	rt := workers.NewRuntime(s, workers.Config{})
	streams, endStreams := context.WithCancel(context.Background())
	defer endStreams()
	h := workershttp.Handler(rt, authByHeader, workershttp.WithHeartbeat(0), workershttp.WithStreamContext(streams))
	srv := start(t, rt, httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), heldKey{}, true)))
	})))
	release := make(chan struct{})
	defer close(release)
	sub, err := rt.Submit(context.Background(), "job", blocker(release), alice)
	require.NoError(t, err)

	type answer struct {
		res  *http.Response
		body []byte
	}
	answered := make(chan answer, 1)
	go func() {
		res, body := get(t, srv.URL+"/tasks/"+url.PathEscape(sub.ID)+"/events", map[string]string{"X-User": "alice"})
		answered <- answer{res, body}
	}()
	select {
	case <-s.reading:
	case <-time.After(5 * time.Second):
		t.Fatal("the stream did not read its task")
	}
	endStreams()
	a := <-answered
	assert.Equal(t, http.StatusServiceUnavailable, a.res.StatusCode, "Content-Type %q, body %q", a.res.Header.Get("Content-Type"), a.body)
}

// A task's event stream whose request deadline (a timeout in front of
// the handler) passes while it reads the task's first snapshot is
// answered 504, as the other routes answer a deadline, never with an
// empty 200, which an EventSource would give up on for good.
func TestATaskStreamWhoseRequestDeadlinePassesBeforeItsFirstEventIs504(t *testing.T) {
	s := heldReadsOfRequests{MemStore: workers.NewMemStore(), reading: make(chan struct{}, 1)}
	rt := workers.NewRuntime(s, workers.Config{})
	h := workershttp.Handler(rt, authByHeader, workershttp.WithHeartbeat(0), workershttp.WithLogger(slog.New(slog.DiscardHandler)))
	srv := start(t, rt, httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 50*time.Millisecond)
		defer cancel()
		h.ServeHTTP(w, r.WithContext(context.WithValue(ctx, heldKey{}, true)))
	})))
	release := make(chan struct{})
	defer close(release)
	sub, err := rt.Submit(context.Background(), "job", blocker(release), alice)
	require.NoError(t, err)

	res, body := get(t, srv.URL+"/tasks/"+url.PathEscape(sub.ID)+"/events", map[string]string{"X-User": "alice"})
	assert.Equal(t, http.StatusGatewayTimeout, res.StatusCode, "Content-Type %q, body %q", res.Header.Get("Content-Type"), body)
	assert.Contains(t, string(body), `"timeout"`)
}

// errorCode returns the code of the JSON error res carries.
func errorCode(t *testing.T, res *http.Response) string {
	t.Helper()
	var body struct {
		Error struct{ Code string } `json:"error"`
	}
	require.NoError(t, json.NewDecoder(res.Body).Decode(&body))
	return body.Error.Code
}

// An identity may hold WithStreamLimit's count of event streams open at
// once, of both kinds: one more is refused with 429, a Retry-After and
// its own code, while another identity is served; once one of its
// streams ends, the identity may open one again.
func TestEventStreamsOfOneIdentityAreBounded(t *testing.T) {
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	srv := start(t, rt, httptest.NewUnstartedServer(workershttp.Handler(rt, authByHeader, workershttp.WithHeartbeat(0), workershttp.WithStreamLimit(2))))
	sub, err := rt.Submit(context.Background(), "k", func(ctx context.Context, _ *workers.Task) (any, error) {
		<-ctx.Done()
		return nil, context.Cause(ctx)
	}, workers.MustOwner("alice"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = rt.Cancel(context.Background(), sub.ID, workers.System) }) // before the Shutdown start's cleanup makes
	open := func(user, path string) (*http.Response, context.CancelFunc) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		req, err := http.NewRequestWithContext(ctx, "GET", srv.URL+path, nil)
		require.NoError(t, err)
		req.Header.Set("X-User", user)
		res, err := srv.Client().Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { cancel(); res.Body.Close() })
		return res, cancel
	}
	first, closeFirst := open("alice", "/events")
	require.Equal(t, http.StatusOK, first.StatusCode)
	second, _ := open("alice", "/tasks/"+url.PathEscape(sub.ID)+"/events")
	require.Equal(t, http.StatusOK, second.StatusCode)

	third, _ := open("alice", "/events")
	assert.Equal(t, http.StatusTooManyRequests, third.StatusCode)
	assert.Equal(t, "5", third.Header.Get("Retry-After"))
	assert.Equal(t, "too_many_streams", errorCode(t, third))

	other, _ := open("bob", "/events")
	assert.Equal(t, http.StatusOK, other.StatusCode, "another identity's stream")
	head, err := http.NewRequest(http.MethodHead, srv.URL+"/events", nil)
	require.NoError(t, err)
	head.Header.Set("X-User", "alice")
	res, err := srv.Client().Do(head)
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, http.StatusTooManyRequests, res.StatusCode, "HEAD /events at the limit answers as GET does")

	closeFirst()
	deadline := time.Now().Add(5 * time.Second)
	for {
		res, cancel := open("alice", "/events")
		if res.StatusCode == http.StatusOK {
			break
		}
		cancel()
		if time.Now().After(deadline) {
			t.Fatalf("alice's stream after one of hers ended: %d", res.StatusCode)
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline: the handler counts the ended stream out on its return
	}
}

// Without WithStreamLimit an identity may hold 16 event streams open.
func TestEventStreamsOfOneIdentityAreBoundedByDefault(t *testing.T) {
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	srv := start(t, rt, httptest.NewUnstartedServer(workershttp.Handler(rt, authByHeader, workershttp.WithHeartbeat(0))))
	var codes []int
	for range 17 {
		ctx, cancel := context.WithCancel(context.Background())
		req, err := http.NewRequestWithContext(ctx, "GET", srv.URL+"/events", nil)
		require.NoError(t, err)
		req.Header.Set("X-User", "alice")
		res, err := srv.Client().Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { cancel(); res.Body.Close() })
		codes = append(codes, res.StatusCode)
	}
	want := append(slices.Repeat([]int{http.StatusOK}, 16), http.StatusTooManyRequests)
	assert.Equal(t, want, codes)
}
