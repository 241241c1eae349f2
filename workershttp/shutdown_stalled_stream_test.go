package workershttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/taskgate/workers/workershttp"
)

// writeSignal is a middleware's ResponseWriter (it unwraps, as
// http.ResponseController asks) that says when a large write begins.
type writeSignal struct {
	http.ResponseWriter
	once    *sync.Once
	writing chan struct{}
}

func (w writeSignal) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w writeSignal) Write(p []byte) (int, error) {
	if len(p) > 1<<20 {
		w.once.Do(func() { close(w.writing) })
	}
	return w.ResponseWriter.Write(p)
}

// The README's Lifecycle: with WithStreamContext, its cancel registered
// with RegisterOnShutdown, "the streams end as the server shuts down, and
// httpServer.Shutdown does not spend the bound waiting for them". A
// stream blocked in a write to a client that stopped reading (a laptop
// gone to sleep with the dashboard open, a stalled proxy) ends too: it
// does not hold Shutdown until WithWriteTimeout (30 s by default), which
// would spend the whole bound and leave rt.Shutdown none.
func TestStreamBlockedInAWriteEndsWithTheStreamContext(t *testing.T) {
	rt, id := bigEndedTask(t)

	streams, endStreams := context.WithCancel(context.Background())
	defer endStreams()
	h := workershttp.Handler(rt, authByHeader, workershttp.WithHeartbeat(0), workershttp.WithStreamContext(streams))
	writing := make(chan struct{})
	var once sync.Once
	srv := start(t, rt, httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(writeSignal{w, &once, writing}, r)
	})))
	srv.Config.RegisterOnShutdown(endStreams)

	askWithoutReading(t, srv, id)
	select {
	case <-writing:
	case <-time.After(time.Minute): // the encoding of the result may take seconds under -race
		t.Fatal("the stream did not begin its write")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	began := time.Now()
	err := srv.Config.Shutdown(ctx)
	assert.NoError(t, err, "Shutdown waited %v for a stream blocked in a write", time.Since(began).Round(time.Millisecond))
}
