// Command httpserver is a small JSON API over a workers runtime, built on
// package workershttp: submit (the application's own route), and
// workershttp's list, status, cancel, live events and dashboard, each
// acting for the owner named in the X-User request header or the cookie
// /login sets (a stand-in for real authentication). SIGINT or SIGTERM
// shuts the HTTP server down, then drains the runtime, within one bound;
// a second one ends the process at once (but for a SIGINT the process
// was started ignoring, as a background job of a shell without job
// control is: that one is ignored again, and SIGTERM ends it).
//
//	go run ./examples/httpserver &
//	curl -XPOST -H 'X-User: alice' 'localhost:8080/tasks?key=report&steps=200'
//	curl -H 'X-User: alice' localhost:8080/tasks/alice::report
//	curl -N -H 'X-User: alice' localhost:8080/tasks/alice::report/events
//	curl -H 'X-User: alice' 'localhost:8080/tasks?status=running&limit=10'
//	curl -XPOST -H 'X-User: alice' -d '{"reason":"not needed"}' localhost:8080/tasks/alice::report/cancel
//
// The dashboard: open http://localhost:8080/login?user=alice in a browser.
package main

import (
	"cmp"
	"context"
	"encoding/base64"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/workershttp"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address")
	drain := flag.Duration("drain", 10*time.Second, "how long shutdown may take")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Once the first signal came, the next one is left to Go's default
	// handling, which ends the process without waiting for the drain; a
	// SIGINT ignored when the process started goes back to being ignored.
	// (Not on the way out: the deferred stop ends ctx too.)
	defer context.AfterFunc(ctx, func() {
		stop()
		log.Print("shutting down; a second signal quits at once")
	})()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("listening on %s", ln.Addr())
	if err := serve(ctx, ln, *drain); err != nil {
		log.Fatal(err)
	}
	log.Print("every task settled")
}

// serve runs the API on ln until ctx ends, then shuts the HTTP server
// down and drains the runtime, both within drain.
func serve(ctx context.Context, ln net.Listener, drain time.Duration) error {
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{
		Queues:          []string{"reports"},
		CleanupInterval: time.Minute,
		Retention:       time.Hour,
		Limits:          limits,
	})
	// Every queue name gets a processor: let clients use only the known
	// ones, or any of them could start goroutines without limit.
	rt.Store().SetQueueAuthorizer(func(queue, _ string) bool {
		return queue == workers.DefaultQueue || queue == "reports"
	})
	if err := rt.Start(ctx); err != nil {
		return err
	}
	// Event streams never go idle: they end when the server shuts down,
	// or srv.Shutdown would wait for them until its bound.
	streams, endStreams := context.WithCancel(context.Background())
	defer endStreams()
	srv := &http.Server{Handler: newAPI(rt, streams), ReadHeaderTimeout: 5 * time.Second}
	srv.RegisterOnShutdown(endStreams)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()

	select {
	case err := <-serveErr:
		log.Printf("server: %v", err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	httpErr := srv.Shutdown(shutdown)
	if err := rt.Shutdown(shutdown); err != nil {
		return err
	}
	return httpErr
}

// limits keep one tenant from taking the machine: at most 64 callbacks
// run at once, each owner runs 4 and queues 100 more; past that a
// submission is answered 429 with a Retry-After.
var limits = workers.Limits{
	MaxRunning: 64,
	MaxWaiting: 10000,
	Owner:      workers.OwnerLimits{Running: 4, Waiting: 100},
}

// newAPI returns the service's handler: the submit route, which is the
// application's since it chooses the Func, beside workershttp's routes
// for listing, status, cancel, live events and the dashboard. Event
// streams end when streams does.
func newAPI[S workers.Store](rt *workers.Runtime[S], streams context.Context) http.Handler {
	mux := http.NewServeMux()
	submit := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth, err := authenticate(r)
		if err != nil {
			// Wrapped, the failure is 401, as workershttp's routes
			// answer it, and its text is not shown.
			workershttp.WriteError(w, fmt.Errorf("%w: %w", workershttp.ErrUnauthenticated, err))
			return
		}
		steps, err := strconv.Atoi(cmp.Or(r.URL.Query().Get("steps"), "10"))
		if err != nil || steps < 1 || steps > 1000 {
			workershttp.WriteError(w, fmt.Errorf("%w: steps must be 1 to 1000", workershttp.ErrBadRequest))
			return
		}
		key := r.URL.Query().Get("key")
		var sub workers.Submission
		if q := r.URL.Query().Get("queue"); q != "" {
			sub, err = rt.SubmitSequential(r.Context(), q, key, demoTask(steps), auth)
		} else {
			sub, err = rt.Submit(r.Context(), key, demoTask(steps), auth)
		}
		workershttp.WriteSubmission(w, "", sub, err)
	})
	mux.Handle("POST /tasks", http.NewCrossOriginProtection().Handler(submit))
	mux.HandleFunc("GET /login", login)
	// The readiness probe: 200 while the runtime takes submissions, 503
	// with a Retry-After once Shutdown has begun or while its store
	// cannot renew its lease, so that a load balancer sends the work to
	// another replica.
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := rt.Ready(r.Context()); err != nil {
			workershttp.WriteError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	// workershttp's routes are mounted on their own paths, not on "/":
	// a catch-all would answer for this mux's routes too, a method they
	// do not take 404 or 405 with an Allow that leaves theirs out.
	api := workershttp.Handler(rt, authenticate, workershttp.WithDashboard(), workershttp.WithStreamContext(streams))
	for _, pattern := range []string{"GET /tasks", "/tasks/{id}", "/tasks/{id}/{op}", "/events", "/{$}"} {
		mux.Handle(pattern, api)
	}
	return jsonMisses(mux)
}

// jsonMisses serves mux, and answers a request none of its patterns
// takes in JSON, as workershttp answers its own: 404, or 405 with the
// Allow header mux would send. Anything else mux answers without a
// pattern (a redirect to a path's clean form) goes as mux makes it.
func jsonMisses(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, pattern := mux.Handler(r)
		if pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		m := &miss{header: make(http.Header)}
		h.ServeHTTP(m, r)
		code, msg := "not_found", "no such route"
		switch m.status {
		case http.StatusNotFound:
		case http.StatusMethodNotAllowed:
			code, msg = "method_not_allowed", "method not allowed"
			w.Header().Set("Allow", m.header.Get("Allow"))
		default:
			mux.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(m.status)
		fmt.Fprintf(w, "{\"error\":{\"code\":%q,\"message\":%q}}\n", code, msg)
	})
}

// miss records what a handler answers, and discards its body.
type miss struct {
	header http.Header
	status int
}

func (m *miss) Header() http.Header         { return m.header }
func (m *miss) Write(p []byte) (int, error) { return len(p), nil }
func (m *miss) WriteHeader(status int)      { m.status = status }

// authenticate reads the caller from the X-User request header, or from
// the user cookie that /login sets for a browser (an EventSource cannot
// send headers). A real service takes the identity from its own
// authentication; a missing or invalid one is refused, never passed on
// as an empty identity.
func authenticate(r *http.Request) (workers.TaskAuthority, error) {
	user := r.Header.Get("X-User")
	if user == "" {
		if c, err := r.Cookie("user"); err == nil {
			b, err := base64.RawURLEncoding.DecodeString(c.Value)
			if err != nil {
				return nil, err
			}
			user = string(b)
		}
	}
	return workers.NewOwner(user)
}

// login is the demo's stand-in for signing in: it remembers ?user= in a
// cookie and opens the dashboard. The cookie holds the id base64url
// encoded: a cookie drops the bytes it cannot hold (é, ;, a space), which
// would sign "éric" in as "ric".
func login(w http.ResponseWriter, r *http.Request) {
	owner, err := workers.NewOwner(r.URL.Query().Get("user"))
	if err != nil {
		workershttp.WriteError(w, fmt.Errorf("%w: %v", workershttp.ErrBadRequest, err))
		return
	}
	http.SetCookie(w, &http.Cookie{Name: "user", Value: base64.RawURLEncoding.EncodeToString([]byte(owner.ID())), Path: "/", HttpOnly: true, SameSite: http.SameSiteLaxMode})
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// demoTask stands in for real work: steps of 100ms, with progress.
func demoTask(steps int) workers.Func {
	return func(ctx context.Context, t *workers.Task) (any, error) {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := 1; i <= steps; i++ {
			select {
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			case <-tick.C:
			}
			t.SetProgress(i * 100 / steps)
		}
		return map[string]int{"steps": steps}, nil
	}
}
