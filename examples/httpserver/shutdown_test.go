package main

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers/workershttp"
)

// With an event stream open (the README's "curl -N .../events") while a
// task runs, serve still shuts the server down and drains the runtime
// within its bound: the stream ends as the server shuts down, instead of
// holding srv.Shutdown to the bound and leaving rt.Shutdown no time.
func TestServeShutsDownWithAnEventStreamOpen(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- serve(ctx, ln, 2*time.Second) }()
	base := "http://" + ln.Addr().String()
	c := client{t, base}
	var sub workershttp.SubmissionResponse
	require.Equal(t, http.StatusAccepted, c.do("POST", "/tasks?key=long&steps=1000", "alice", &sub))

	req, err := http.NewRequest("GET", base+"/tasks/"+sub.ID+"/events", nil)
	require.NoError(t, err)
	req.Header.Set("X-User", "alice")
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	res, err := (&http.Client{Transport: tr}).Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	http.DefaultClient.CloseIdleConnections()

	stop()
	select {
	case err := <-served:
		assert.NoError(t, err, "serve with an open event stream")
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not return")
	}
}
