package workershttp_test

import (
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/workershttp"
)

// listPanics is a store without notices, so that Subscribe reads the
// live tasks every second, whose ListTasks panics while panics is set,
// as a store's or a driver's bug would.
type listPanics struct {
	workers.Store
	panics atomic.Bool
}

func (s *listPanics) ListTasks(ctx context.Context, f workers.Filter) ([]workers.Record, error) {
	if s.panics.Load() {
		panic("store bug")
	}
	return s.Store.ListTasks(ctx, f)
}

// A store's panic in an event stream's read fails that stream, as a
// panic in any other handler fails its request, and not the process:
// the stream's reads run on a goroutine of their own, where nothing
// would recover it.
func TestAStorePanicInAnEventStreamFailsOnlyTheStream(t *testing.T) {
	s := &listPanics{Store: workers.NewMemStore()}
	rt := workers.NewRuntime(s, workers.Config{})
	srv := httptest.NewUnstartedServer(workershttp.Handler(rt, authByHeader))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the server logs the panic it recovered
	srv = start(t, rt, srv)
	f := &fixture{srv: srv} // its requests, over another store's runtime
	res, events, _ := openSSE(t, f, "/events", "alice", "")
	require.Equal(t, http.StatusOK, res.StatusCode)
	s.panics.Store(true) // the stream's next read of the live tasks panics
	timeout := time.After(10 * time.Second)
	for open := true; open; {
		select {
		case _, open = <-events:
		case <-timeout:
			t.Fatal("the stream whose read panicked is still open")
		}
	}
	s.panics.Store(false)
	res, body := f.do(t, "GET", "/tasks", "alice", nil)
	require.Equal(t, http.StatusOK, res.StatusCode, "the server goes on: %s", body)
}
