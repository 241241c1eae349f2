package browsertest

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/taskgate/workers"
)

// buttonDisabled reads whether the cancel button of task id's row is
// disabled.
func buttonDisabled(t *testing.T, bctx context.Context, id string) bool {
	t.Helper()
	d, err := chromedp.Run(bctx, chromedp.Evaluate[bool](fmt.Sprintf(`document.querySelector(%s).disabled`, strconv.Quote(row(id)+" button"))))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// A cancel that loses the race with the task's own end is answered 409
// (finished). The row shows the end the stream brought; its Cancel
// button must stay disabled, as it is for every ended task.
func TestDashboardCancelThatFindsTheTaskFinishedKeepsItsButtonDisabled(t *testing.T) {
	bin := chromium(t)
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	h := server(rt)
	arrived, letThrough := make(chan struct{}, 1), make(chan struct{})
	srv := serve(t, rt, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/cancel") {
			arrived <- struct{}{}
			select {
			case <-letThrough:
			case <-r.Context().Done():
				return
			}
		}
		h.ServeHTTP(w, r)
	}))
	sub, finish := submitHeld(t, rt, "report")

	bctx := openBrowser(t, bin)
	if err := chromedp.Do(bctx,
		chromedp.Navigate(srv.URL+"/login?user=alice"),
		isLive,
		attr(row(sub.ID), "status", "running"),
		chromedp.Click(chromedp.CSS(row(sub.ID)+` button`)),
	); err != nil {
		t.Fatal(err)
	}
	select {
	case <-arrived:
	case <-time.After(20 * time.Second):
		t.Fatal("the cancel never reached the server")
	}
	close(finish) // the task completes before the cancel is served
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := rt.Wait(ctx, sub.ID, workers.System); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(bctx, attr(row(sub.ID), "status", "completed")); err != nil {
		t.Fatalf("completion never shown: %v", err)
	}
	close(letThrough) // now answered 409 finished
	if err := chromedp.Do(bctx, chromedp.Poll[chromedp.Void](`document.getElementById("state").textContent.startsWith("Cancel failed")`, chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		t.Fatalf("the refused cancel never shown: %v", err)
	}
	if !buttonDisabled(t, bctx, sub.ID) {
		t.Fatalf("the Cancel button of a completed task is enabled again after a cancel refused as finished")
	}
}

// A cancel whose request fails on the network (the connection drops)
// leaves a live task: the page must say the cancel failed and let the
// user try again, not keep the button disabled for good.
func TestDashboardCancelLostOnTheNetworkCanBeTriedAgain(t *testing.T) {
	bin := chromium(t)
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	h := server(rt)
	srv := serve(t, rt, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/cancel") {
			// The connection drops before any answer.
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		h.ServeHTTP(w, r)
	}))
	sub, finish := submitHeld(t, rt, "report")
	defer close(finish)

	bctx := openBrowser(t, bin)
	if err := chromedp.Do(bctx,
		chromedp.Navigate(srv.URL+"/login?user=alice"),
		isLive,
		attr(row(sub.ID), "status", "running"),
		chromedp.Click(chromedp.CSS(row(sub.ID)+` button`)),
	); err != nil {
		t.Fatal(err)
	}
	err := chromedp.Do(bctx, chromedp.Poll[chromedp.Void](fmt.Sprintf(`!document.querySelector(%s).disabled`, strconv.Quote(row(sub.ID)+" button")), chromedp.WithPollingTimeout(10*time.Second)))
	state, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.getElementById("state").textContent`))
	if err != nil {
		t.Fatalf("after a cancel lost on the network the running task's Cancel button stays disabled (state %q): %v", state, err)
	}
}
