package workershttp_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/workershttp"
)

// A client that sent its GET of an event stream with a body (a
// Content-Length of 256 KB or more, which net/http does not discard for
// the handler) and then went away must have
// its stream ended (or be refused at once), its subscription and goroutine released and its
// place under WithStreamLimit given back, as for any other client.
// net/http starts watching the connection for its close only once the
// request's body is read to its end, so a stream that never reads it
// never learns that its client went.
func TestEventStreamOfAGoneClientThatSentABodyEnds(t *testing.T) {
	for _, path := range []string{"/events", "/tasks/alice::job/events"} {
		t.Run(strings.TrimPrefix(path, "/"), func(t *testing.T) {
			rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
			streams, endStreams := context.WithCancel(context.Background())
			srv := start(t, rt, httptest.NewUnstartedServer(workershttp.Handler(rt, authByHeader,
				workershttp.WithHeartbeat(0), workershttp.WithStreamLimit(1), workershttp.WithStreamContext(streams))))
			t.Cleanup(endStreams) // runs first: a stream left open must not hold srv.Close
			release := make(chan struct{})
			t.Cleanup(func() { close(release) })
			_, err := rt.Submit(context.Background(), "job", blocker(release), alice)
			require.NoError(t, err)

			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			require.NoError(t, err)
			fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: x\r\nX-User: alice\r\nContent-Length: 300000\r\n\r\n", path)
			buf := make([]byte, 4096)
			conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, err = conn.Read(buf) // the stream's headers, or its refusal
			require.NoError(t, err)
			conn.Close() // the client goes

			deadline := time.Now().Add(5 * time.Second)
			for {
				req, err := http.NewRequest("GET", srv.URL+"/events", nil)
				require.NoError(t, err)
				req.Header.Set("X-User", "alice")
				ctx, cancel := context.WithCancel(context.Background())
				res, err := srv.Client().Do(req.WithContext(ctx))
				require.NoError(t, err)
				code := res.StatusCode
				cancel()
				res.Body.Close()
				if code == http.StatusOK {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("5s after its client went, the stream still holds alice's only place: %d", code)
				}
				time.Sleep(20 * time.Millisecond) // polling with a deadline: the handler counts the ended stream out on its return
			}
		})
	}
}
