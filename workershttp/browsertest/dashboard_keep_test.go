package browsertest

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/taskgate/workers"
)

// setKeep sets how many finished rows the dashboard keeps (its table
// body's data-keep).
func setKeep(t *testing.T, bctx context.Context, n int) {
	t.Helper()
	if _, err := chromedp.Run(bctx, chromedp.Evaluate[string](fmt.Sprintf(`document.getElementById("tasks").dataset.keep = "%d"`, n))); err != nil {
		t.Fatal(err)
	}
}

// shownRows is the dashboard's rows, each as "id status", sorted.
const shownRows = `[...document.querySelectorAll("#tasks tr")].map(tr => tr.dataset.id + " " + tr.dataset.status).sort().join(", ")`

// rowsAre waits until the dashboard's rows are want, each "id status",
// in any order; it fails t with the rows shown if they never are.
func rowsAre(t *testing.T, bctx context.Context, want ...string) {
	t.Helper()
	slices.Sort(want)
	joined := strings.Join(want, ", ")
	err := chromedp.Do(bctx, chromedp.Poll[chromedp.Void](shownRows+" === "+strconv.Quote(joined), chromedp.WithPollingTimeout(20*time.Second)))
	if err != nil {
		shown, _ := chromedp.Run(bctx, chromedp.Evaluate[string](shownRows))
		t.Fatalf("the dashboard shows\n\t%s\nnot\n\t%s\n(%v)", shown, joined, err)
	}
}

// endNow submits alice's task key, which returns at once, and waits for
// its end.
func endNow(t *testing.T, rt *workers.Runtime[*workers.MemStore], key string) workers.Submission {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sub, err := rt.Submit(ctx, key, func(context.Context, *workers.Task) (any, error) { return nil, nil }, workers.MustOwner("alice"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Wait(ctx, sub.ID, workers.System); err != nil {
		t.Fatal(err)
	}
	return sub
}

// A dashboard left open keeps every live row but only the finished rows
// that ended last, as many as its table body's data-keep says: the
// others leave the page, which would otherwise grow with every task that
// ends while it is open. A list read again on reconnecting shows what
// ended while the stream was down, and keeps to the same bound.
func TestDashboardKeepsOnlyTheRowsThatEndedLast(t *testing.T) {
	bin := chromium(t)
	ctx := context.Background()
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	// While held, a new stream waits to be served: the page reconnects
	// only once the test has ended tasks meanwhile.
	hs := holdStreams(server(rt))
	srv := serve(t, rt, hs)
	first, finish := submitHeld(t, rt, "first")

	bctx := openBrowser(t, bin)
	if err := chromedp.Do(bctx,
		chromedp.Navigate(srv.URL+"/login?user=alice"),
		attr(row(first.ID), "status", "running"),
		isLive,
	); err != nil {
		t.Fatalf("dashboard did not load: %v", err)
	}
	setKeep(t, bctx, 3)
	var done []workers.Submission
	for i := range 6 {
		done = append(done, endNow(t, rt, fmt.Sprint("done-", i)))
	}
	// The oldest row stays: it is live.
	rowsAre(t, bctx,
		done[5].ID+" completed", done[4].ID+" completed", done[3].ID+" completed",
		first.ID+" running")

	hs.held.Store(true)
	srv.CloseClientConnections() // the stream drops; the page reconnects, and waits
	close(finish)
	if _, err := rt.Wait(ctx, first.ID, workers.System); err != nil {
		t.Fatal(err)
	}
	last := endNow(t, rt, "done-6")
	hs.release()
	// The list has all eight tasks: the page shows the three that ended
	// last, two of them in the list alone.
	rowsAre(t, bctx, last.ID+" completed", done[5].ID+" completed", first.ID+" completed")
}

// A row that ended, and would leave the page as more rows end, stays
// while a list asked for before its end is in flight: that list, which
// has the task live, would otherwise show it again, running, with no
// stream event left to end it.
func TestDashboardKeepsARowALateListHasLive(t *testing.T) {
	bin := chromium(t)
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	// The list is read at once, and its answer held until released.
	srv, hold, listRead, release := heldListServer(t, rt)
	late, finish := submitHeld(t, rt, "late")

	bctx := openBrowser(t, bin)
	hold.Store(true)
	if err := chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/login?user=alice")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-listRead: // the list has the task running
	case <-time.After(20 * time.Second):
		t.Fatal("the dashboard never asked for the list")
	}
	setKeep(t, bctx, 2)
	close(finish)
	if err := chromedp.Do(bctx, attr(row(late.ID), "status", "completed")); err != nil {
		t.Fatalf("the stream's end never shown: %v", err)
	}
	a, b := endNow(t, rt, "a"), endNow(t, rt, "b")
	if err := chromedp.Do(bctx, attr(row(b.ID), "status", "completed")); err != nil {
		t.Fatalf("the stream's end never shown: %v", err)
	}
	close(release)
	if err := chromedp.Do(bctx, isLive); err != nil {
		t.Fatalf("the list never rendered: %v", err)
	}
	rowsAre(t, bctx, b.ID+" completed", a.ID+" completed")
}

// A list whose answer never comes (a stalled connection, or one queued
// behind the browser's other connections to the server) is given up
// after the table body's data-list-wait, and read again: until then no
// finished row leaves the page, which would otherwise grow for good
// with every task that ends.
func TestDashboardKeepsToItsBoundPastAListThatNeverAnswers(t *testing.T) {
	bin := chromium(t)
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	h := server(rt)
	// While held, a list is answered never: its request waits until the
	// page gives it up, or the test ends.
	var hold atomic.Bool
	listAsked := make(chan struct{})
	srv := serve(t, rt, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/tasks" && hold.CompareAndSwap(true, false) {
			close(listAsked)
			<-r.Context().Done()
			return
		}
		h.ServeHTTP(w, r)
	}))

	bctx := openBrowser(t, bin)
	if err := chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/login?user=alice"), isLive); err != nil {
		t.Fatalf("dashboard did not load: %v", err)
	}
	setKeep(t, bctx, 2)
	if _, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.getElementById("tasks").dataset.listWait = "1000"`)); err != nil {
		t.Fatal(err)
	}
	hold.Store(true)
	srv.CloseClientConnections() // the stream drops; the page reconnects, and lists again
	select {
	case <-listAsked:
	case <-time.After(20 * time.Second):
		t.Fatal("the dashboard never asked for the list again")
	}
	var done []workers.Submission
	for i := range 4 {
		done = append(done, endNow(t, rt, fmt.Sprint("done-", i)))
	}
	rowsAre(t, bctx, done[3].ID+" completed", done[2].ID+" completed")
}
