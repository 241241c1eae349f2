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
	"strings"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/workershttp"
)

func ExampleHandler() {
	ctx := context.Background()
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	defer rt.Shutdown(ctx)

	// The application's authentication: here, a header names the user.
	authenticate := func(r *http.Request) (workers.TaskAuthority, error) {
		return workers.NewOwner(r.Header.Get("X-User"))
	}
	mux := http.NewServeMux()
	mux.Handle("/api/", http.StripPrefix("/api", workershttp.Handler(rt, authenticate, workershttp.WithDashboard())))
	submit := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		owner, err := authenticate(r)
		if err != nil {
			// 401, as the handler answers: passed as it is, this error
			// (an invalid owner id) would be 400.
			workershttp.WriteError(w, fmt.Errorf("%w: %w", workershttp.ErrUnauthenticated, err))
			return
		}
		sub, err := rt.Submit(r.Context(), r.URL.Query().Get("key"), func(context.Context, *workers.Task) (any, error) {
			return "done", nil
		}, owner)
		workershttp.WriteSubmission(w, "/api", sub, err)
	})
	// A browser's cookies would authenticate it too: refuse cross-origin
	// posts, as the handler does for its own POST routes.
	mux.Handle("POST /api/tasks", http.NewCrossOriginProtection().Handler(submit))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	call := func(method, path, user string) {
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		req.Header.Set("X-User", user)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		fmt.Println(res.StatusCode, res.Header.Get("Location"), strings.TrimSpace(string(body)))
	}
	call("POST", "/api/tasks?key=", "alice")
	call("POST", "/api/tasks?key=report", "")
	call("GET", "/api/tasks", "")
	call("GET", "/api/tasks/alice::report/events", "bob")
	// Output:
	// 400  {"error":{"code":"invalid_input","message":"workers: invalid key \"\": empty"}}
	// 401  {"error":{"code":"unauthenticated","message":"authentication required"}}
	// 401  {"error":{"code":"unauthenticated","message":"authentication required"}}
	// 404  {"error":{"code":"not_found","message":"task not found"}}
}

// StatusCode and WriteError are the one table from the runtime's errors
// to HTTP statuses: an application's own routes answer with them too.
func ExampleWriteError() {
	ctx := context.Background()
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{
		Limits: workers.Limits{Owner: workers.OwnerLimits{Running: 1, Waiting: 1}},
	})
	defer rt.Shutdown(ctx)

	alice := workers.MustOwner("alice")
	release := make(chan struct{})
	defer close(release)
	slow := func(context.Context, *workers.Task) (any, error) { <-release; return nil, nil }
	rt.Submit(ctx, "first", slow, alice)  // running
	rt.Submit(ctx, "second", slow, alice) // waiting
	_, err := rt.Submit(ctx, "third", slow, alice)

	rec := httptest.NewRecorder()
	workershttp.WriteError(rec, err)
	fmt.Println(rec.Code, rec.Header().Get("Retry-After"), strings.TrimSpace(rec.Body.String()))
	for _, err := range []error{workers.ErrNotFound, workers.ErrFinished, workers.ErrClosed, errors.New("disk on fire")} {
		fmt.Println(workershttp.StatusCode(err), err)
	}
	// Output:
	// 429 1 {"error":{"code":"too_many_requests","message":"quota exceeded; retry later"}}
	// 404 workers: task not found
	// 409 workers: task already finished
	// 503 workers: runtime closed
	// 500 disk on fire
}

// A client follows one task over Server-Sent Events until its end, and a
// stream still open when the server shuts down ends with it: the cancel
// of WithStreamContext's context is registered with the server.
func ExampleWithStreamContext() {
	ctx := context.Background()
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	alice := workers.MustOwner("alice")
	authenticate := func(r *http.Request) (workers.TaskAuthority, error) {
		return workers.NewOwner(r.Header.Get("X-User"))
	}

	streams, endStreams := context.WithCancel(context.Background())
	srv := httptest.NewUnstartedServer(workershttp.Handler(rt, authenticate, workershttp.WithStreamContext(streams)))
	srv.Config.RegisterOnShutdown(endStreams)
	srv.Start()
	get := func(path string) *http.Response {
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		req.Header.Set("X-User", "alice")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		return res
	}

	step := make(chan struct{})
	sub, _ := rt.Submit(ctx, "export", func(ctx context.Context, t *workers.Task) (any, error) {
		for i := range 4 {
			select {
			case <-step:
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
			t.SetProgress((i + 1) * 25)
		}
		return map[string]int{"rows": 4}, nil
	}, alice)

	// One event per change, coalesced for a slow reader; the last one,
	// of id "<run id>/end", is the task's end.
	res := get("/tasks/" + sub.ID + "/events")
	events := bufio.NewScanner(res.Body)
	var name string
	started := false
	for events.Scan() {
		line := events.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			var task workershttp.Task
			json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &task)
			switch task.Status {
			case workers.StatusRunning:
				if !started {
					started = true
					fmt.Println(name, task.Status, task.Progress)
					close(step) // let the task run to its end
				}
			case workers.StatusCompleted:
				fmt.Println(name, task.Status, task.Progress, string(task.Result))
			}
		}
	}
	res.Body.Close()
	fmt.Println("the task's stream ended with it")

	// A stream of every task never ends by itself: the server's Shutdown
	// ends it, then the runtime's drains the runs.
	all := get("/events")
	shutdown, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	srv.Config.Shutdown(shutdown)
	io.Copy(io.Discard, all.Body)
	all.Body.Close()
	fmt.Println("the server's streams ended:", all.StatusCode)
	srv.Close()
	fmt.Println(rt.Shutdown(shutdown))
	// Output:
	// task running 0
	// task completed 100 {"rows":4}
	// the task's stream ended with it
	// the server's streams ended: 200
	// <nil>
}
