package browsertest

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/taskgate/workers"
)

// A task that began and ended while the page's stream passed changes
// over (the page fell behind, or the server's notices were interrupted)
// is shown all the same: the stream sends "skipped", and the page reads
// the list again. The stream here is the test's, which sends nothing
// but that event.
func TestDashboardReadsTheListAgainWhenTheStreamSkipped(t *testing.T) {
	bin := chromium(t)
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	h := server(rt)
	opened, skip := make(chan struct{}), make(chan struct{})
	var once sync.Once
	srv := serve(t, rt, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/events" {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		once.Do(func() { close(opened) })
		select {
		case <-skip:
			fmt.Fprint(w, "event: skipped\ndata: {}\n\n")
			http.NewResponseController(w).Flush()
		case <-r.Context().Done():
			return
		}
		<-r.Context().Done()
	}))

	bctx := openBrowser(t, bin)
	if err := chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/login?user=alice"), isLive); err != nil {
		t.Fatal(err)
	}
	<-opened
	alice := workers.MustOwner("alice")
	sub, err := rt.Submit(context.Background(), "passed-over", func(context.Context, *workers.Task) (any, error) { return nil, nil }, alice)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := rt.Wait(ctx, sub.ID, alice); err != nil {
		t.Fatal(err)
	}
	close(skip)
	if err := chromedp.Do(bctx, attr(row(sub.ID), "status", "completed")); err != nil {
		t.Fatalf("the task the stream passed over is not shown: %v", err)
	}
}
