package main

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// With an event stream open (the README's "curl -N .../events") while a
// task runs, serve still shuts the server down and drains the runtime
// within its bound: the stream ends as the server shuts down, instead of
// holding srv.Shutdown to the bound and leaving rt.Shutdown no time.
func TestServeShutsDownWithAnEventStreamOpen(t *testing.T) {
	c, sub, shutdown := serveWithATask(t, 2*time.Second)
	req, err := http.NewRequest("GET", c.base+"/tasks/"+sub.ID+"/events", nil)
	require.NoError(t, err)
	req.Header.Set("X-User", "alice")
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	res, err := (&http.Client{Transport: tr}).Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	http.DefaultClient.CloseIdleConnections()
	assert.NoError(t, shutdown(), "serve with an open event stream")
}
