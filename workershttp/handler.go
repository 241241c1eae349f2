// Package workershttp serves a workers.Runtime over HTTP: list, status,
// cancel and live Server-Sent Events for the tasks a request's identity
// may see, an optional live dashboard, and the one table from the
// runtime's errors to HTTP statuses (StatusCode, WriteError).
//
// Submission stays in application code, since it needs a workers.Func;
// WriteSubmission writes the standard response for it. Such a route
// answers its own authentication's failure with WriteError, wrapped with
// ErrUnauthenticated, so that it is 401 as on the handler's routes.
//
// # Routes
//
// Relative to where the handler is mounted (use http.StripPrefix to
// mount it under a path):
//
//	GET  /tasks                 list: ?status=running,pending (or repeated) &limit=N (1 to 500, default 50) &cursor=C, newest first
//	GET  /tasks/{id}            one task
//	POST /tasks/{id}/cancel     cancel; optional JSON body {"reason": "..."}; the task after it, or 204 if it could not be read
//	GET  /tasks/{id}/events     Server-Sent Events: the task's snapshots until its end
//	GET  /events                Server-Sent Events: every task the caller may see; ?status= chooses the tasks shown, each followed to its end or "gone"
//	GET  /                      the dashboard, with WithDashboard
//
// Every route but the dashboard's page, which holds no data and whose
// requests go to the other routes, authenticates the request first; a
// failure is 401. What a caller may see is decided by the runtime: a task
// of someone else's is 404, exactly like a missing one. POST routes are
// guarded by http.CrossOriginProtection; the default one refuses a
// cross-origin request with a JSON 403 of code "cross_origin".
//
// # Events
//
// Each SSE event is named "task", its data the task's JSON, its id
// "<run id>/<n>", or "<run id>/end" for the terminal snapshot. GET
// /events also sends an event named "gone", of id "<run id>/gone" and
// data {"id", "run_id", "queue"} (queue left out when empty), for a
// task it showed live and can no longer see (see
// workers.Snapshot.Gone): a view drops the task.
//
// A client that reconnects with Last-Event-ID gets its events numbered
// on from the id it gave. On GET /tasks/{id}/events it starts again from
// the task's current snapshot, and one whose last event was the end is
// answered 204, so that an EventSource stops reconnecting.
//
// On both routes a comment line is sent as a heartbeat while nothing
// changes, and a stream that the runtime's Shutdown ends is not logged
// as an error. Behind a middleware's ResponseWriter that cannot flush
// (neither an http.Flusher nor one with an Unwrap method), no event
// would reach the client: both routes answer 500, and log why.
//
// GET /events begins with the caller's live tasks, then carries their
// changes and those of every task after. Its subscription starts before
// the response opens, so every change the runtime makes, or hears of
// through its store's notices once it runs (see Runtime.Start), after the
// client has the response's headers shows. A reconnected stream begins
// the same way, with what is live then: a task that ended while the
// client was away sends no end, so a view that keeps tasks re-reads GET
// /tasks each time its stream opens (EventSource's open event), and GET
// /tasks/{id} for a task it shows live that the list no longer has, as
// the dashboard does. Only the run that Last-Event-ID names numbers its ids
// on; the other runs' ids start again at 1. A view re-reads GET /tasks
// as well on an event named "skipped" (data {}, no id), which GET
// /events sends when it passed over changes (workers.ErrSkipped: the
// client fell more than 256 tasks behind, or the store's notices were
// interrupted), since a task that began and ended in the gap sends
// nothing else.
package workershttp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/taskgate/workers"
)

// runtime is what the handler uses of a *workers.Runtime[S].
type runtime interface {
	Status(ctx context.Context, id string, auth workers.TaskAuthority) (workers.Snapshot, error)
	List(ctx context.Context, auth workers.TaskAuthority, opts ...workers.ListOption) ([]workers.Snapshot, error)
	ListPage(ctx context.Context, auth workers.TaskAuthority, opts ...workers.ListOption) (workers.Page, error)
	Cancel(ctx context.Context, id string, auth workers.TaskAuthority, opts ...workers.CancelOption) error
	Watch(ctx context.Context, id string, auth workers.TaskAuthority) iter.Seq2[workers.Snapshot, error]
	Subscribe(ctx context.Context, auth workers.TaskAuthority, opts ...workers.ListOption) iter.Seq2[workers.Snapshot, error]
	Ready(ctx context.Context) error
}

// Option configures Handler.
type Option func(*config)

type config struct {
	dashboard bool
	heartbeat time.Duration
	logger    *slog.Logger
	cop       *http.CrossOriginProtection
	streams   context.Context // event streams end with it; nil: never
	writes    time.Duration   // bound of each write of an event stream; 0: none
	perCaller int             // event streams open at once per identity; 0: no bound
}

// WithDashboard serves the live dashboard at the handler's root: one
// page listing the caller's tasks with live progress and a cancel
// button, embedded in the binary, with no external assets. Only pages of
// its own origin may frame it. The page keeps every live task and the
// 500 that ended last: a page left open on a busy service does not grow
// without end.
func WithDashboard() Option { return func(c *config) { c.dashboard = true } }

// WithHeartbeat sets how often an idle event stream sends a comment line
// to keep proxies from closing it. Defaults to 15s; zero or less sends
// none.
func WithHeartbeat(d time.Duration) Option { return func(c *config) { c.heartbeat = d } }

// WithWriteTimeout bounds each write of an event stream (an event or a
// heartbeat): a client that has not taken it in d, having stopped reading
// with its connection open, is cut off, and its stream ends. The time
// between writes is not bounded, over HTTP/2 as over HTTP/1: a stream
// with nothing to send stays open. It replaces the server's WriteTimeout
// for the streams, which would otherwise end every stream at that age.
// Defaults to 30s; zero or less sets no bound, the server's WriteTimeout
// included. Behind a middleware's ResponseWriter that cannot set a write
// deadline (one without an Unwrap method), streams go unbounded, or with
// zero keep the server's WriteTimeout, and the handler logs so once.
func WithWriteTimeout(d time.Duration) Option { return func(c *config) { c.writes = d } }

// WithStreamLimit bounds the event streams open at once for one
// identity (one Owner, or System), each of which holds a goroutine and a
// subscription of the runtime's until its client goes: one beyond it is
// refused with 429 Too Many Requests (ErrTooManyStreams) and a
// Retry-After. Defaults to 16, more than a browser's tabs of one user
// usually open; zero or less sets no bound.
func WithStreamLimit(n int) Option { return func(c *config) { c.perCaller = max(n, 0) } }

// WithLogger sets where unexpected (5xx) errors are logged. Defaults to
// slog.Default.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithStreamContext ends every event stream when ctx ends. An event
// stream is a request that never goes idle, so http.Server.Shutdown,
// which waits for every connection to, would wait for the streams until
// its deadline: register the cancel of ctx with the server's
// RegisterOnShutdown, and the streams end as the server shuts down.
// Clients reconnect (an EventSource does) to whichever server serves
// them next. A stream asked for once ctx has ended is refused 503 (code
// "closed"), as on a runtime shut down. A nil ctx, the default, ends
// no stream: each ends with its request or its runtime.
func WithStreamContext(ctx context.Context) Option { return func(c *config) { c.streams = ctx } }

// WithCrossOriginProtection replaces the default protection of the POST
// routes, for example to add trusted origins. Its deny handler is its
// own: set one that answers in JSON, as WriteError does, to keep every
// error of the handler JSON.
func WithCrossOriginProtection(p *http.CrossOriginProtection) Option {
	return func(c *config) { c.cop = p }
}

// Handler returns the HTTP handler for rt. authenticate is the
// application's: it returns the identity a request acts as (a
// workers.Owner, or workers.System for an administrator), or an error,
// which is answered 401 without its text. Handler panics if rt or
// authenticate is nil. Every error is answered in
// JSON (see WriteError), a request no route takes too: 404, or 405 with
// the route's Allow header.
func Handler[S workers.Store](rt *workers.Runtime[S], authenticate func(*http.Request) (workers.TaskAuthority, error), opts ...Option) http.Handler {
	if rt == nil || authenticate == nil {
		panic("workershttp: Handler with a nil Runtime or authenticate function")
	}
	c := config{heartbeat: 15 * time.Second, writes: 30 * time.Second, perCaller: defaultStreamLimit}
	for _, o := range opts {
		if o != nil { // as the runtime's options: a nil one sets nothing
			o(&c)
		}
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	if c.cop == nil {
		c.cop = http.NewCrossOriginProtection()
		c.cop.SetDenyHandler(http.HandlerFunc(crossOriginDenied))
	}
	h := &handler{rt: rt, auth: authenticate, cfg: c}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /tasks", h.authed(h.list))
	mux.HandleFunc("GET /tasks/{id}", h.authed(h.status))
	mux.Handle("POST /tasks/{id}/cancel", c.cop.Handler(http.HandlerFunc(h.authed(h.cancel))))
	mux.HandleFunc("GET /tasks/{id}/events", h.authed(h.taskEvents))
	mux.HandleFunc("GET /events", h.authed(h.allEvents))
	if c.dashboard {
		mux.HandleFunc("GET /{$}", serveDashboard)
	}
	return routes{mux}
}

// slashID reports whether escaped, a request's escaped path, names a
// task route of the id "/", and returns what follows the id.
func slashID(escaped string) (rest string, ok bool) {
	after, ok := strings.CutPrefix(escaped, "/tasks/%2")
	if !ok || after == "" || after[0] != 'F' && after[0] != 'f' {
		return "", false
	}
	switch rest = after[1:]; rest {
	case "", "/cancel", "/events":
		return rest, true
	}
	return "", false
}

// routes is the handler's mux, whose answers for a request no route
// takes, 404 or 405 with its Allow header, are JSON errors like every
// other. Its other answers without a route (a redirect to a path's clean
// form, a 400 for a malformed target) go as the mux makes them.
type routes struct{ mux *http.ServeMux }

func (m routes) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if rest, ok := slashID(r.URL.EscapedPath()); ok {
		// ServeMux takes a segment that is an escaped slash alone for a
		// trailing slash, and matches no {id} wildcard with it: the route
		// is found for a stand-in id, and served with the id "/".
		stand := r.Clone(r.Context())
		stand.URL.Path, stand.URL.RawPath = "/tasks/_"+rest, ""
		if h, pattern := m.mux.Handler(stand); pattern != "" {
			r.SetPathValue("id", "/")
			h.ServeHTTP(w, r)
			return
		}
		r = stand // the route's 405, with its Allow
	}
	h, pattern := m.mux.Handler(r)
	if pattern != "" {
		m.mux.ServeHTTP(w, r)
		return
	}
	miss := routeMiss{header: make(http.Header)}
	h.ServeHTTP(&miss, r)
	code, msg := "not_found", "no such route"
	switch miss.status {
	case http.StatusNotFound:
	case http.StatusMethodNotAllowed:
		code, msg = "method_not_allowed", "method not allowed"
		w.Header()["Allow"] = miss.header.Values("Allow")
	default:
		h.ServeHTTP(w, r) // the mux's handler does nothing but answer: it answers again, for real
		return
	}
	writeJSON(w, miss.status, errorBody{errorDetail{Code: code, Message: msg}})
}

// routeMiss keeps the status and headers of the mux's own answer to a
// request no route takes, and drops its text/plain body.
type routeMiss struct {
	header http.Header
	status int
}

func (m *routeMiss) Header() http.Header { return m.header }

func (m *routeMiss) WriteHeader(status int) {
	if m.status == 0 {
		m.status = status
	}
}

func (m *routeMiss) Write(b []byte) (int, error) {
	m.WriteHeader(http.StatusOK)
	return len(b), nil
}

type handler struct {
	rt        runtime
	auth      func(*http.Request) (workers.TaskAuthority, error)
	cfg       config
	unbounded sync.Once // logs that streams cannot set their write deadline

	mu   sync.Mutex
	open map[string]int // guarded by mu: event streams open, by identity
}

// defaultStreamLimit is WithStreamLimit's default.
const defaultStreamLimit = 16

// openStream counts an event stream of auth's identity, and returns the
// function that counts it out, or ErrTooManyStreams when that identity
// has WithStreamLimit's count open already.
func (h *handler) openStream(auth workers.TaskAuthority) (func(), error) {
	if h.cfg.perCaller == 0 {
		return func() {}, nil
	}
	id := identity(auth)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.open[id] >= h.cfg.perCaller {
		return nil, ErrTooManyStreams
	}
	if h.open == nil {
		h.open = make(map[string]int)
	}
	h.open[id]++
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.open[id]--; h.open[id] == 0 {
			delete(h.open, id)
		}
	}, nil
}

// streamsFull reports whether auth's identity has WithStreamLimit's
// count of event streams open: a stream asked for now would be refused.
// A route asks it before the store reads that precede its stream, so
// that a client retrying at its limit costs none.
func (h *handler) streamsFull(auth workers.TaskAuthority) bool {
	if h.cfg.perCaller == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.open[identity(auth)] >= h.cfg.perCaller
}

// identity names whom auth acts for: an owner's id, or System (and any
// other authority, which the runtime refuses).
func identity(auth workers.TaskAuthority) string {
	switch a := auth.(type) {
	case workers.Owner:
		return "owner:" + a.ID()
	case *workers.Owner:
		if a != nil {
			return "owner:" + a.ID()
		}
	}
	return "system"
}

// authed authenticates the request before f.
func (h *handler) authed(f func(http.ResponseWriter, *http.Request, workers.TaskAuthority)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		auth, err := h.auth(r)
		if err != nil || auth == nil {
			WriteError(w, ErrUnauthenticated)
			return
		}
		f(w, r, auth)
	}
}

// fail writes err, logging what the client is not told.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	h.logUnexpected(r, "workershttp: request failed", err)
	WriteError(w, err)
}

// logUnexpected logs err with msg if its status is a 5xx.
func (h *handler) logUnexpected(r *http.Request, msg string, err error) {
	if StatusCode(err) >= 500 {
		h.cfg.logger.Error(msg, "method", r.Method, "path", r.URL.Path, "err", err)
	}
}

const (
	defaultLimit = 50
	maxLimit     = 500
)

func (h *handler) list(w http.ResponseWriter, r *http.Request, auth workers.TaskAuthority) {
	q := r.URL.Query()
	statuses, err := parseStatuses(q["status"])
	if err != nil {
		h.fail(w, r, err)
		return
	}
	limit := defaultLimit
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxLimit {
			h.fail(w, r, fmt.Errorf("%w: limit must be 1 to %d", ErrBadRequest, maxLimit))
			return
		}
		limit = n
	}
	snaps, next, err := listPage(r.Context(), h.rt, auth, statuses, limit, q.Get("cursor"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	page := Page{Tasks: make([]Task, len(snaps)), Next: next}
	for i, s := range snaps {
		page.Tasks[i] = FromSnapshot(s)
	}
	writeJSON(w, http.StatusOK, page)
}

func (h *handler) status(w http.ResponseWriter, r *http.Request, auth workers.TaskAuthority) {
	snap, err := h.rt.Status(r.Context(), r.PathValue("id"), auth)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, FromSnapshot(snap))
}

// maxCancelBody bounds a cancel request's body.
const maxCancelBody = 4 << 10

func (h *handler) cancel(w http.ResponseWriter, r *http.Request, auth workers.TaskAuthority) {
	var body struct {
		Reason string `json:"reason"`
	}
	if r.ContentLength != 0 && r.Body != nil {
		err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxCancelBody)).Decode(&body)
		if err != nil && !errors.Is(err, errEOF) {
			h.fail(w, r, fmt.Errorf("%w: cancel body: %w", ErrBadRequest, err))
			return
		}
	}
	id := r.PathValue("id")
	var opts []workers.CancelOption
	if body.Reason != "" {
		opts = append(opts, workers.WithReason(body.Reason))
	}
	if err := h.rt.Cancel(r.Context(), id, auth, opts...); err != nil {
		h.fail(w, r, err)
		return
	}
	snap, err := h.rt.Status(r.Context(), id, auth)
	if err != nil {
		// The cancel landed: a retry would be told the task finished.
		h.logUnexpected(r, "workershttp: reading a task after its cancel failed", err)
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusNoContent)
		return
	}
	writeJSON(w, http.StatusOK, FromSnapshot(snap))
}

// crossOriginDenied answers a request the default cross-origin
// protection refused, in JSON like every other error.
func crossOriginDenied(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusForbidden, errorBody{errorDetail{Code: "cross_origin", Message: "cross-origin request refused"}})
}

// parseStatuses reads a status filter: comma-separated lists, in one
// parameter or several (status=a,b or status=a&status=b).
func parseStatuses(params []string) ([]workers.Status, error) {
	var out []workers.Status // each status once: five at most
	for _, s := range params {
		if s == "" {
			continue
		}
		for v := range strings.SplitSeq(s, ",") {
			st := workers.Status(strings.TrimSpace(v))
			if !st.Valid() {
				return nil, fmt.Errorf("%w: unknown status %q", ErrBadRequest, v)
			}
			if !slices.Contains(out, st) {
				out = append(out, st)
			}
		}
	}
	return out, nil
}

// WriteSubmission writes the standard response for a submission: on
// success 202 Accepted (200 OK when it joined a run already live) with a
// SubmissionResponse body and a Location naming the task under the list
// route at prefix (the path the handler is mounted at, "" for the root);
// on failure the error, as WriteError writes it.
func WriteSubmission(w http.ResponseWriter, prefix string, sub workers.Submission, err error) {
	if err != nil {
		WriteError(w, err)
		return
	}
	w.Header().Set("Location", strings.TrimSuffix(prefix, "/")+"/tasks/"+pathEscape(sub.ID))
	status := http.StatusAccepted
	if sub.Joined {
		status = http.StatusOK
	}
	writeJSON(w, status, SubmissionResponse{ID: sub.ID, RunID: sub.RunID, Joined: sub.Joined})
}
