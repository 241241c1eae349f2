package workershttp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/workershttp"
)

// heldWriter holds every write of an event stream's body while held is
// set, as a client that reads slowly (or a congested network) does.
type heldWriter struct {
	http.ResponseWriter
	held    *atomic.Bool
	blocked chan<- struct{} // told once, when a write is held
	release <-chan struct{}
	once    *sync.Once
}

func (w heldWriter) Write(p []byte) (int, error) {
	if w.held.Load() {
		w.once.Do(func() { close(w.blocked) })
		<-w.release
	}
	return w.ResponseWriter.Write(p)
}

func (w heldWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// GET /events carries every change, or says it passed some over: a
// client that falls more than 256 tasks behind skips to what is live,
// and a task submitted and ended in the burst sends no event of its
// own, so the stream sends an event named "skipped", on which a view
// reads the list again. The stream goes on after it.
func TestAllEventsSayTheySkippedABurstTheClientFellBehind(t *testing.T) {
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	var held atomic.Bool
	blocked, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h := workershttp.Handler(rt, authByHeader, workershttp.WithHeartbeat(0))
	srv := start(t, rt, httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(heldWriter{w, &held, blocked, release, &once}, r)
	})))
	f := &fixture{rt: rt, srv: srv}
	res, events, _ := openSSE(t, f, "/events", "alice", "")
	require.Equal(t, http.StatusOK, res.StatusCode)
	held.Store(true)

	const n = 300
	var ids []string
	for i := range n {
		sub, err := rt.Submit(context.Background(), fmt.Sprint("k", i), func(context.Context, *workers.Task) (any, error) { return i, nil }, alice)
		require.NoError(t, err)
		ids = append(ids, sub.ID)
		if i == 0 {
			<-blocked // the stream is held writing the first task's first event
		}
	}
	for _, id := range ids {
		waitEnd(t, rt, id)
	}
	held.Store(false)
	close(release)

	seen := map[string]bool{}
	skipped := false
	timeout := time.After(10 * time.Second)
	for len(seen) < n && !skipped {
		select {
		case ev, ok := <-events:
			require.True(t, ok, "stream ended")
			if ev.event == "skipped" {
				skipped = true
				require.Equal(t, "{}", ev.data)
				require.Empty(t, ev.id, "a skipped event moves no Last-Event-ID")
				continue
			}
			var tk workershttp.Task
			require.NoError(t, json.Unmarshal([]byte(ev.data), &tk))
			seen[tk.ID] = true
		case <-timeout:
			t.Fatalf("of %d tasks submitted and ended while the stream was open, it showed %d, and said nothing of the others", n, len(seen))
		}
	}
	require.True(t, skipped, "the stream fell behind and showed every task: the test shows nothing")

	after, err := rt.Submit(context.Background(), "after", func(context.Context, *workers.Task) (any, error) { return nil, nil }, alice)
	require.NoError(t, err)
	for {
		select {
		case ev, ok := <-events:
			require.True(t, ok, "stream ended")
			var tk workershttp.Task
			require.NoError(t, json.Unmarshal([]byte(ev.data), &tk))
			if tk.ID == after.ID {
				return // the stream went on
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the stream showed nothing after the skipped event")
		}
	}
}
