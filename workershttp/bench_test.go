package workershttp_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/workershttp"
)

// BenchmarkSSEFanout streams one task to 1,000 SSE clients while it
// reports progress in 100 steps and completes: events/s is what the
// clients received in all, bytes/subscriber what each one read.
func BenchmarkSSEFanout(b *testing.B) {
	const clients = 1000
	for b.Loop() {
		b.StopTimer()
		rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
		srv := httptest.NewServer(workershttp.Handler(rt, authByHeader))
		tr := &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: 0}
		client := &http.Client{Transport: tr}
		release := make(chan struct{})
		sub, err := rt.Submit(context.Background(), "job", func(ctx context.Context, tk *workers.Task) (any, error) {
			<-release
			for p := 1; p <= 100; p++ {
				tk.SetProgress(p)
			}
			return "ok", nil
		}, alice)
		if err != nil {
			b.Fatal(err)
		}
		path := srv.URL + "/tasks/" + url.PathEscape(sub.ID) + "/events"
		var events, bytes atomic.Int64
		var wg sync.WaitGroup
		ready := make(chan struct{}, clients)
		for range clients {
			wg.Go(func() {
				req, _ := http.NewRequest("GET", path, nil)
				req.Header.Set("X-User", "alice")
				res, err := client.Do(req)
				if err != nil {
					b.Error(err)
					ready <- struct{}{}
					return
				}
				defer res.Body.Close()
				cr := &countingReader{r: res.Body}
				sc := bufio.NewScanner(cr)
				first := true
				for sc.Scan() {
					if strings.HasPrefix(sc.Text(), "data:") {
						events.Add(1)
						if first {
							first = false
							ready <- struct{}{}
						}
					}
				}
				bytes.Add(cr.n)
			})
		}
		for range clients {
			<-ready
		}
		b.StartTimer()
		start := time.Now()
		close(release)
		wg.Wait()
		elapsed := time.Since(start)
		b.StopTimer()
		b.ReportMetric(float64(events.Load())/elapsed.Seconds(), "events/s")
		b.ReportMetric(float64(events.Load())/clients, "events/subscriber")
		b.ReportMetric(float64(bytes.Load())/clients, "bytes/subscriber")
		srv.CloseClientConnections()
		srv.Close()
		tr.CloseIdleConnections()
		if err := rt.Shutdown(context.Background()); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
