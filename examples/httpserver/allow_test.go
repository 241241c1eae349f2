package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/taskgate/workers"
)

// The API answers a method its route does not take 405 with an Allow
// header naming the methods the route does take (the README: "405 with
// its Allow header"). /tasks takes POST (the submit route) beside GET,
// and /login takes GET: workershttp's handler, mounted on "/", answers
// for them without knowing the application's own routes.
func TestMethodNotAllowedNamesTheApplicationsRoutes(t *testing.T) {
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	defer rt.Shutdown(context.Background())
	api := newAPI(rt, t.Context())
	for _, c := range []struct{ method, path, allows string }{
		{"PUT", "/tasks", "POST"},
		{"DELETE", "/tasks", "POST"},
		{"POST", "/login", "GET"},
	} {
		req := httptest.NewRequest(c.method, c.path, nil)
		req.Header.Set("X-User", "alice")
		w := httptest.NewRecorder()
		api.ServeHTTP(w, req)
		if w.Code != http.StatusMethodNotAllowed || !strings.Contains(w.Header().Get("Allow"), c.allows) {
			t.Errorf("%s %s: %d, Allow %q; want 405 with an Allow naming %s", c.method, c.path, w.Code, w.Header().Get("Allow"), c.allows)
		}
	}
}
