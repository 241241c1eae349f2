package browsertest

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/workershttp"
)

// A task that ends while the page's stream is down reaches the page only
// through the list it reads once the stream is open again (the stream
// begins with what is live). When that one read fails (a store blip:
// 503), the page must read the list again; it does not, and the row
// shows the task running, with its Cancel button, for as long as the
// page stays open.
func TestDashboardReadsTheListAgainWhenItFailedOnReconnect(t *testing.T) {
	bin := chromium(t)
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	h := server(rt)
	var streams atomic.Int32
	cut, cutFirst := context.WithCancel(context.Background())
	defer cutFirst()
	gate := make(chan struct{})
	var failList atomic.Bool
	srv := serve(t, rt, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/events":
			switch streams.Add(1) {
			case 1: // the first stream ends when the test says
				ctx, cancel := context.WithCancel(r.Context())
				defer context.AfterFunc(cut, cancel)()
				h.ServeHTTP(w, r.WithContext(ctx))
				return
			case 2: // the browser's reconnection waits for the task's end
				select {
				case <-gate:
				case <-r.Context().Done():
					return
				}
			}
		case r.URL.Path == "/tasks" && failList.CompareAndSwap(true, false):
			workershttp.WriteError(w, workers.ErrUnavailable)
			return
		}
		h.ServeHTTP(w, r)
	}))
	sub, finish := submitHeld(t, rt, "report")

	bctx := openBrowser(t, bin)
	if err := chromedp.Do(bctx,
		chromedp.Navigate(srv.URL+"/login?user=alice"),
		isLive,
		attr(row(sub.ID), "status", "running"),
	); err != nil {
		t.Fatal(err)
	}
	failList.Store(true)
	cutFirst() // the stream ends; the browser reconnects
	deadline := time.Now().Add(20 * time.Second)
	for streams.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the browser never reconnected")
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	close(finish)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := rt.Wait(ctx, sub.ID, workers.System); err != nil {
		t.Fatal(err)
	}
	close(gate) // the stream opens; its list is answered 503, once
	if err := chromedp.Do(bctx, chromedp.Poll[chromedp.Void](`document.getElementById("state").textContent.startsWith("Could not load")`, chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		t.Fatalf("the failed list never shown: %v", err)
	}
	if err := chromedp.Do(bctx, chromedp.Poll[chromedp.Void](`(() => { const e = document.querySelector(`+"`"+`tr[data-id="alice::report"]`+"`"+`); return e !== null && e.dataset.status === "completed" })()`, chromedp.WithPollingTimeout(15*time.Second))); err != nil {
		state, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.getElementById("state").textContent`))
		status, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.querySelector('tr[data-id="alice::report"]').dataset.status`))
		t.Fatalf("15 s after a list that failed on reconnect, the task that completed meanwhile still shows %q (state %q): %v", status, state, err)
	}
}
