package browsertest

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
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

// A cancel's answer is the run it cancelled. It may come after the
// stream brought a newer run of the task, submitted again once the
// cancelled run ended: the late answer must not put the older run back
// on the row, which would show the running task as cancelled until its
// next change.
func TestDashboardLateCancelAnswerKeepsTheNewerRun(t *testing.T) {
	bin := chromium(t)
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	h := server(rt)
	served, letThrough := make(chan struct{}, 1), make(chan struct{})
	srv := serve(t, rt, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/cancel") {
			h.ServeHTTP(w, r)
			return
		}
		answer := httptest.NewRecorder()
		h.ServeHTTP(answer, r) // the cancel lands; its answer waits
		served <- struct{}{}
		select {
		case <-letThrough:
		case <-r.Context().Done():
			return
		}
		maps.Copy(w.Header(), answer.Header())
		w.WriteHeader(answer.Code)
		_, _ = w.Write(answer.Body.Bytes())
	}))
	first, _ := submitHeld(t, rt, "report")

	bctx := openBrowser(t, bin)
	if err := chromedp.Do(bctx,
		chromedp.Navigate(srv.URL+"/login?user=alice"),
		isLive,
		attr(row(first.ID), "status", "running"),
		chromedp.Click(chromedp.CSS(row(first.ID)+` button`)),
	); err != nil {
		t.Fatal(err)
	}
	select {
	case <-served:
	case <-time.After(20 * time.Second):
		t.Fatal("the cancel never reached the server")
	}
	if err := chromedp.Do(bctx, attr(row(first.ID), "status", "cancelled")); err != nil {
		t.Fatalf("the cancel never shown by the stream: %v", err)
	}
	second, finish := submitHeld(t, rt, "report")
	defer close(finish)
	if second.ID != first.ID || second.RunID == first.RunID {
		t.Fatalf("submitted again: %+v after %+v, want a new run of the task", second, first)
	}
	if err := chromedp.Do(bctx, attr(row(first.ID), "status", "running")); err != nil {
		t.Fatalf("the newer run never shown: %v", err)
	}
	close(letThrough)
	if err := chromedp.Do(bctx, chromedp.Poll[chromedp.Void](strconv.Quote("Cancelled "+first.ID)+` === document.getElementById("state").textContent`,
		chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		t.Fatalf("the cancel's answer never shown: %v", err)
	}
	status, err := chromedp.Run(bctx, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%s).dataset.status`, strconv.Quote(row(first.ID)))))
	if err != nil {
		t.Fatal(err)
	}
	if status != "running" {
		t.Errorf("after the late answer of the cancelled run, the row of the running newer run shows %q", status)
	}
}
