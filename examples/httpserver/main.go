// Command httpserver is a small JSON API over a workers runtime: submit,
// status, list and cancel, each acting for the owner named in the X-User
// request header (a stand-in for real authentication). SIGINT or SIGTERM
// shuts the HTTP server down, then drains the runtime, within one bound.
//
//	go run ./examples/httpserver &
//	curl -XPOST -H 'X-User: alice' 'localhost:8080/tasks?key=report&steps=20'
//	curl -H 'X-User: alice' localhost:8080/tasks/alice::report
//	curl -H 'X-User: alice' localhost:8080/tasks
//	curl -XDELETE -H 'X-User: alice' localhost:8080/tasks/alice::report
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/taskgate/workers"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address")
	drain := flag.Duration("drain", 10*time.Second, "how long shutdown may take")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
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
	srv := &http.Server{Handler: newAPI(rt), ReadHeaderTimeout: 5 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()

	select {
	case err := <-serveErr:
		log.Printf("server: %v", err)
	case <-ctx.Done():
		log.Print("shutting down")
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

// newAPI returns the JSON API's handler.
func newAPI[S workers.Store](rt *workers.Runtime[S]) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /tasks", func(w http.ResponseWriter, r *http.Request) {
		owner, ok := ownerOf(w, r)
		if !ok {
			return
		}
		steps, err := strconv.Atoi(cmp.Or(r.URL.Query().Get("steps"), "10"))
		if err != nil || steps < 1 || steps > 1000 {
			writeError(w, http.StatusBadRequest, errors.New("steps must be 1 to 1000"))
			return
		}
		key := r.URL.Query().Get("key")
		var sub workers.Submission
		if q := r.URL.Query().Get("queue"); q != "" {
			sub, err = rt.SubmitSequential(r.Context(), q, key, demoTask(steps), owner)
		} else {
			sub, err = rt.Submit(r.Context(), key, demoTask(steps), owner)
		}
		if err != nil {
			retryAfter(w, err)
			writeError(w, statusFor(err), err)
			return
		}
		code := http.StatusAccepted
		if sub.Joined {
			code = http.StatusOK
		}
		writeJSON(w, code, sub)
	})
	mux.HandleFunc("GET /tasks/{id}", func(w http.ResponseWriter, r *http.Request) {
		owner, ok := ownerOf(w, r)
		if !ok {
			return
		}
		snap, err := rt.Status(r.Context(), r.PathValue("id"), owner)
		if err != nil {
			writeError(w, statusFor(err), err)
			return
		}
		writeJSON(w, http.StatusOK, snap)
	})
	mux.HandleFunc("GET /tasks", func(w http.ResponseWriter, r *http.Request) {
		owner, ok := ownerOf(w, r)
		if !ok {
			return
		}
		list, err := rt.List(r.Context(), owner)
		if err != nil {
			writeError(w, statusFor(err), err)
			return
		}
		writeJSON(w, http.StatusOK, list)
	})
	mux.HandleFunc("DELETE /tasks/{id}", func(w http.ResponseWriter, r *http.Request) {
		owner, ok := ownerOf(w, r)
		if !ok {
			return
		}
		if err := rt.Cancel(r.Context(), r.PathValue("id"), owner); err != nil {
			writeError(w, statusFor(err), err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
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

// ownerOf reads the caller from the X-User header. A real service takes
// it from its authentication; a missing or invalid one is refused here,
// never passed on as an empty identity.
func ownerOf(w http.ResponseWriter, r *http.Request) (workers.Owner, bool) {
	owner, err := workers.NewOwner(r.Header.Get("X-User"))
	if err != nil {
		writeError(w, http.StatusUnauthorized, err)
		return workers.Owner{}, false
	}
	return owner, true
}

// statusFor maps the library's errors to HTTP statuses.
func statusFor(err error) int {
	switch {
	case errors.Is(err, workers.ErrQuotaExceeded):
		return http.StatusTooManyRequests
	case errors.Is(err, workers.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, workers.ErrUnauthorized):
		return http.StatusForbidden
	case errors.Is(err, workers.ErrFinished):
		return http.StatusConflict
	case errors.Is(err, workers.ErrClosed):
		return http.StatusServiceUnavailable
	case errors.Is(err, workers.ErrInvalidKey), errors.Is(err, workers.ErrInvalidOption):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

// retryAfter sets Retry-After, in whole seconds rounded up, on the answer
// to a submission refused by a quota.
func retryAfter(w http.ResponseWriter, err error) {
	var qe *workers.QuotaError
	if errors.As(err, &qe) {
		secs := int((qe.RetryAfter() + time.Second - 1) / time.Second)
		w.Header().Set("Retry-After", strconv.Itoa(max(1, secs)))
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, map[string]string{"error": err.Error()})
}
