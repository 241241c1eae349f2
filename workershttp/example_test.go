package workershttp_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

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
	mux.HandleFunc("POST /api/tasks", func(w http.ResponseWriter, r *http.Request) {
		owner, err := authenticate(r)
		if err != nil {
			workershttp.WriteError(w, workershttp.ErrUnauthenticated)
			return
		}
		sub, err := rt.Submit(r.Context(), r.URL.Query().Get("key"), func(context.Context, *workers.Task) (any, error) {
			return "done", nil
		}, owner)
		workershttp.WriteSubmission(w, "/api", sub, err)
	})
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
	call("GET", "/api/tasks", "")
	call("GET", "/api/tasks/alice::report/events", "bob")
	// Output:
	// 400  {"error":{"code":"invalid_input","message":"workers: invalid key \"\": empty"}}
	// 401  {"error":{"code":"unauthenticated","message":"authentication required"}}
	// 404  {"error":{"code":"not_found","message":"task not found"}}
}
