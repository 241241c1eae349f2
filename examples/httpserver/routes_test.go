package main

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/taskgate/workers"
)

// The example's documented routes, with a key holding a slash (its id
// escaped as %2F), all reach workershttp; and a request no route takes
// is answered in JSON, as workershttp answers every error.
func TestEveryRouteAnswersAndAMissIsJSON(t *testing.T) {
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	defer rt.Shutdown(context.Background())
	if err := rt.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	streams, end := context.WithCancel(context.Background())
	defer end()
	api := newAPI(rt, streams)
	do := func(method, path string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, nil)
		req.Header.Set("X-User", "alice")
		w := httptest.NewRecorder()
		api.ServeHTTP(w, req)
		return w
	}
	if w := do("POST", "/tasks?key=a/b&steps=1"); w.Code/100 != 2 {
		t.Fatalf("submit: %d %s", w.Code, w.Body)
	}
	for _, c := range []struct {
		method, path string
		code         int
	}{
		{"GET", "/", 200},
		{"GET", "/login?user=alice", 303},
		{"GET", "/readyz", 204},
		{"GET", "/tasks/alice::a%2Fb", 200},
		{"HEAD", "/tasks/alice::a%2Fb/events", 200},
		{"GET", "/tasks?limit=10", 200},
		{"HEAD", "/events", 200},
		{"POST", "/tasks/alice::a%2Fb/cancel", 0},
	} {
		w := do(c.method, c.path)
		if c.code != 0 && w.Code != c.code {
			t.Errorf("%s %s: %d %s", c.method, c.path, w.Code, w.Body)
		}
		if c.code == 0 && (w.Code == 404 || w.Code == 405) {
			t.Errorf("%s %s: %d %s", c.method, c.path, w.Code, w.Body)
		}
	}
	for _, p := range []string{"/nope", "/tasks/", "/tasks/alice::a%2Fb/nope/x"} {
		w := do("GET", p)
		if w.Code != 404 || !strings.HasPrefix(w.Header().Get("Content-Type"), "application/json") {
			t.Errorf("GET %s: %d %q %q; want a JSON 404", p, w.Code, w.Header().Get("Content-Type"), w.Body)
		}
	}
}

// The readiness route answers 503, in JSON and with a Retry-After, once
// Shutdown has begun: a load balancer stops sending it work.
func TestReadinessFailsOnceShutdownBegins(t *testing.T) {
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	streams, end := context.WithCancel(context.Background())
	defer end()
	api := newAPI(rt, streams)
	ready := func() *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		api.ServeHTTP(w, httptest.NewRequest("GET", "/readyz", nil))
		return w
	}
	if w := ready(); w.Code != 204 {
		t.Fatalf("GET /readyz: %d %s, want 204", w.Code, w.Body)
	}
	if err := rt.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	w := ready()
	if w.Code != 503 || w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), `"closed"`) {
		t.Errorf("GET /readyz after Shutdown: %d %q %s, want 503 closed with a Retry-After", w.Code, w.Header().Get("Retry-After"), w.Body)
	}
}
