package browsertest

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/taskgate/workers"
)

// A row shown live that the list read on reconnecting no longer has is
// read on its own; when that read fails (no answer within the table
// body's data-list-wait, or an answer whose body is cut off), the list
// is read again, as after a failed list, until the row shows its end.
func TestDashboardReadsARowAgainWhoseOwnReadFailed(t *testing.T) {
	for _, c := range []struct {
		name string
		fail func(w http.ResponseWriter, r *http.Request)
	}{
		{"no answer", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }},
		{"body cut off", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", "1000")
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte(`{"id":`))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			bin := chromium(t)
			ctx := context.Background()
			rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
			old, finish := submitHeld(t, rt, "old")
			// While held, a new stream waits to be served: the page
			// reconnects only once the task has ended and the newer
			// ones are in. The row's first read on its own fails.
			hs := holdStreams(server(rt))
			var failRead atomic.Bool
			srv := serve(t, rt, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodGet && r.URL.Path == "/tasks/"+old.ID && failRead.CompareAndSwap(true, false) {
					c.fail(w, r)
					return
				}
				hs.ServeHTTP(w, r)
			}))

			bctx := openBrowser(t, bin)
			if err := chromedp.Do(bctx,
				chromedp.Navigate(srv.URL+"/login?user=alice"),
				attr(row(old.ID), "status", "running"),
				isLive,
			); err != nil {
				t.Fatalf("dashboard did not load: %v", err)
			}
			if _, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.getElementById("tasks").dataset.listWait = "1000"`)); err != nil {
				t.Fatal(err)
			}
			hs.held.Store(true)
			failRead.Store(true)
			srv.CloseClientConnections() // the stream drops; the page reconnects, and waits
			close(finish)
			if _, err := rt.Wait(ctx, old.ID, workers.System); err != nil {
				t.Fatal(err)
			}
			endNewer(t, rt, 100)
			hs.release()
			if err := chromedp.Do(bctx, attr(row(old.ID), "status", "completed")); err != nil {
				shown, _ := chromedp.Run(bctx, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%s).dataset.status`, strconv.Quote(row(old.ID)))))
				state, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.getElementById("state").textContent`))
				t.Fatalf("after the row's own read failed, the task that ended meanwhile shows %q (state %q), not its end: %v", shown, state, err)
			}
			if failRead.Load() {
				t.Fatal("the row was never read on its own")
			}
		})
	}
}
