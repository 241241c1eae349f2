package workershttp_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/workershttp"
)

// quotaErr stands for any error carrying a retry hint.
type quotaErr struct{ after time.Duration }

func (e quotaErr) Error() string             { return "quota: tenant t1 over 10 tasks" }
func (e quotaErr) RetryAfter() time.Duration { return e.after }

// WriteError is for errors: called with none, it answers no success.
func TestWriteErrorOfNilIsNoSuccess(t *testing.T) {
	w := httptest.NewRecorder()
	workershttp.WriteError(w, nil)
	assert.Equal(t, http.StatusInternalServerError, w.Code)
	assert.JSONEq(t, `{"error":{"code":"internal","message":"Internal Server Error"}}`, w.Body.String())
}

// Handler refuses what it could never serve when it is built, not on
// each request.
func TestHandlerPanicsOnNilArguments(t *testing.T) {
	const want = "workershttp: Handler with a nil Runtime or authenticate function"
	assert.PanicsWithValue(t, want, func() {
		workershttp.Handler[*workers.MemStore](nil, func(*http.Request) (workers.TaskAuthority, error) { return workers.System, nil })
	})
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	defer rt.Shutdown(context.Background())
	assert.PanicsWithValue(t, want, func() { workershttp.Handler(rt, nil) })
}

func TestStatusCodeTable(t *testing.T) {
	cases := []struct {
		err        error
		status     int
		retryAfter string
	}{
		{nil, 200, ""},
		{workershttp.ErrUnauthenticated, 401, ""},
		{workers.ErrNoAuthority, 401, ""},
		{workers.ErrNotFound, 404, ""},
		{&workers.AuthorizationError{Op: "submit", Queue: "q", UserID: "u"}, 403, ""},
		{fmt.Errorf("x: %w", quotaErr{2500 * time.Millisecond}), 429, "3"},
		{quotaErr{time.Duration(math.MaxInt64)}, 429, "9223372037"}, // "never", as x/time/rate says it
		{quotaErr{time.Duration(math.MaxInt64 / time.Second * time.Second)}, 429, "9223372036"},
		{&workers.QuotaError{Limit: workers.QuotaOwnerWaiting, Max: 2, Current: 2, Retry: 4 * time.Second}, 429, "4"},
		{fmt.Errorf("%w: no hint", workers.ErrQuotaExceeded), 429, ""},
		{workers.ErrFinished, 409, ""},
		{fmt.Errorf("%w: kept changing", workers.ErrConflict), 503, "1"},
		{workers.ErrClosed, 503, "1"},
		{fmt.Errorf("sqlstore/postgres: get task: %w: dial tcp: connection refused", workers.ErrUnavailable), 503, "5"},
		{invalidOwner(), 400, ""},
		{workers.ErrInvalidOption, 400, ""},
		{fmt.Errorf("%w: %w: negative interval", workers.ErrInvalidConfig, workers.ErrInvalidOption), 500, ""},
		{workershttp.ErrBadRequest, 400, ""},
		{fmt.Errorf("read task: %w", context.DeadlineExceeded), 504, ""},
		{fmt.Errorf("read task: %w", context.Canceled), 499, ""},
		{errors.New("pq: connection refused to 10.0.0.5"), 500, ""},
	}
	for _, c := range cases {
		assert.Equal(t, c.status, workershttp.StatusCode(c.err), "%v", c.err)
		if c.err == nil {
			continue
		}
		w := httptest.NewRecorder()
		workershttp.WriteError(w, c.err)
		assert.Equal(t, c.status, w.Code)
		assert.Equal(t, c.retryAfter, w.Header().Get("Retry-After"), "%v", c.err)
		if c.status >= 500 {
			assert.NotContains(t, w.Body.String(), c.err.Error(), "a 5xx never echoes the error's text")
			assert.NotContains(t, w.Body.String(), "10.0.0.5")
		}
	}
}

func invalidOwner() error {
	_, err := workers.NewOwner("")
	return err
}
