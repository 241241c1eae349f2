package browsertest

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"go.uber.org/goleak"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/workershttp"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// chromium returns the browser to drive, or skips the test.
func chromium(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("WORKERS_TEST_CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser"} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Skip("no Chromium: set WORKERS_TEST_CHROMIUM or install it (apt-get install chromium) to run the browser test")
	return ""
}

// server is a service as an application writes it: a cookie names the
// user, and the dashboard is served by workershttp.
func server[S workers.Store](rt *workers.Runtime[S]) http.Handler {
	auth := func(r *http.Request) (workers.TaskAuthority, error) {
		c, err := r.Cookie("user")
		if err != nil {
			return nil, err
		}
		return workers.NewOwner(c.Value)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /login", func(w http.ResponseWriter, r *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: "user", Value: r.URL.Query().Get("user"), Path: "/"})
		http.Redirect(w, r, "/", http.StatusSeeOther)
	})
	mux.Handle("/", workershttp.Handler(rt, auth, workershttp.WithDashboard(), workershttp.WithHeartbeat(time.Second)))
	return mux
}

// openBrowser starts Chromium, headless, and returns the context of its
// first tab, with a deadline of a minute; t's cleanup closes it.
func openBrowser(t *testing.T, bin string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(420, 900), // a phone's width
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	browser, cancelBrowser := chromedp.NewContext(actx)
	t.Cleanup(cancelBrowser)
	// The first Run starts the browser, with no deadline of its own.
	if err := chromedp.Do(browser); err != nil {
		t.Fatalf("start Chromium: %v", err)
	}
	bctx, cancelTimeout := context.WithTimeout(browser, 60*time.Second)
	t.Cleanup(cancelTimeout)
	return bctx
}

// serve serves h, which serves rt, on a test server; t's cleanup closes
// the server, then shuts rt down.
func serve[S workers.Store](t *testing.T, rt *workers.Runtime[S], h http.Handler) *httptest.Server {
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := rt.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	return srv
}

// submitHeld submits alice's task key, which runs until finish is
// closed, then completes.
func submitHeld(t *testing.T, rt *workers.Runtime[*workers.MemStore], key string) (workers.Submission, chan struct{}) {
	t.Helper()
	finish := make(chan struct{})
	sub, err := rt.Submit(context.Background(), key, func(ctx context.Context, _ *workers.Task) (any, error) {
		select {
		case <-finish:
			return "done", nil
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}, workers.MustOwner("alice"))
	if err != nil {
		t.Fatal(err)
	}
	return sub, finish
}

// row selects a task's row on the dashboard.
func row(id string) string { return fmt.Sprintf(`tr[data-id=%q]`, id) }

// attr waits until the element sel has the data attribute name at want.
func attr(sel, name, want string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](fmt.Sprintf(`(() => { const e = document.querySelector(%s); return e !== null && e.dataset[%q] === %q })()`,
		strconv.Quote(sel), name, want), chromedp.WithPollingTimeout(20*time.Second))
}

// isLive waits until the dashboard says it is live: its list is in.
var isLive = chromedp.Poll[chromedp.Void](`document.getElementById("state").textContent === "Live"`, chromedp.WithPollingTimeout(20*time.Second))

func TestDashboardInChromium(t *testing.T) {
	bin := chromium(t)
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	srv := serve(t, rt, server(rt))
	ctx := context.Background()
	alice, bob := workers.MustOwner("alice"), workers.MustOwner("bob")

	// progress advances one step each time the test says so.
	step := make(chan int)
	progress := func(ctx context.Context, tk *workers.Task) (any, error) {
		for {
			select {
			case p, ok := <-step:
				if !ok {
					return "report ready", nil
				}
				tk.SetProgress(p)
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		}
	}
	blocked := func(ctx context.Context, tk *workers.Task) (any, error) {
		tk.SetProgress(5)
		<-ctx.Done()
		return nil, context.Cause(ctx)
	}
	report, err := rt.Submit(ctx, "report", progress, alice)
	if err != nil {
		t.Fatal(err)
	}
	export, err := rt.Submit(ctx, "export", blocked, alice)
	if err != nil {
		t.Fatal(err)
	}
	secret, err := rt.Submit(ctx, "secret", blocked, bob)
	if err != nil {
		t.Fatal(err)
	}

	bctx := openBrowser(t, bin)
	if err := chromedp.Do(bctx,
		chromedp.Navigate(srv.URL+"/login?user=alice"),
		chromedp.WaitVisible(chromedp.CSS(row(report.ID))),
		chromedp.WaitVisible(chromedp.CSS(row(export.ID))),
		isLive,
	); err != nil {
		t.Fatalf("dashboard did not load: %v", err)
	}

	// The progress bar follows the run over SSE, up to 100.
	for _, p := range []int{25, 60, 100} {
		step <- p
		if err := chromedp.Do(bctx, attr(row(report.ID), "progress", strconv.Itoa(p))); err != nil {
			t.Fatalf("progress %d never shown: %v", p, err)
		}
	}
	close(step)
	if err := chromedp.Do(bctx, attr(row(report.ID), "status", "completed")); err != nil {
		t.Fatalf("completion never shown: %v", err)
	}

	// The cancel button cancels, and the row shows it.
	if err := chromedp.Do(bctx,
		chromedp.Click(chromedp.CSS(row(export.ID)+` button`)),
		attr(row(export.ID), "status", "cancelled"),
	); err != nil {
		t.Fatalf("cancel not shown: %v", err)
	}
	snap, err := rt.Status(ctx, export.ID, alice)
	if err != nil || snap.Status != workers.StatusCancelled || snap.CancelledBy != "alice" {
		t.Fatalf("the runtime did not record alice's cancel: %+v, %v", snap, err)
	}

	// bob's task never appears on alice's page.
	bobs, err := chromedp.Run(bctx, chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll(%s).length`, strconv.Quote(row(secret.ID)))))
	if err != nil {
		t.Fatal(err)
	}
	if bobs != 0 {
		t.Fatalf("bob's task is shown to alice")
	}

	shot, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("WORKERS_TEST_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "dashboard.png")
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
	if err := rt.Cancel(ctx, secret.ID, bob); err != nil {
		t.Fatal(err)
	}
}

// The dashboard's list request and its event stream answer on two
// connections, in either order. A task that ends after the list was read
// but before its answer arrives shows its end, from the stream, and the
// late list does not put it back to running.
func TestDashboardKeepsAnEndThatArrivesBeforeTheList(t *testing.T) {
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
	close(finish)
	if err := chromedp.Do(bctx, attr(row(late.ID), "status", "completed")); err != nil {
		t.Fatalf("the stream's end never shown: %v", err)
	}
	close(release)
	if err := chromedp.Do(bctx, isLive); err != nil {
		t.Fatalf("the list never rendered: %v", err)
	}
	shown, err := chromedp.Run(bctx, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%s).dataset.status`, strconv.Quote(row(late.ID)))))
	if err != nil {
		t.Fatal(err)
	}
	if shown != "completed" {
		t.Fatalf("after the late list the task shows %q, not its end", shown)
	}
}

// A stream the server refuses (here 503, as a runtime shut down answers,
// or a 401 once a session ends) is one the browser never opens again: the
// dashboard shows the list meanwhile, says so, and opens the stream
// itself once the server takes it.
func TestDashboardRetriesAStreamTheServerRefused(t *testing.T) {
	bin := chromium(t)
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	h := server(rt)
	var refuse atomic.Bool
	refuse.Store(true)
	var refused atomic.Int32
	srv := serve(t, rt, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/events" && refuse.Load() {
			refused.Add(1)
			workershttp.WriteError(w, workers.ErrClosed)
			return
		}
		h.ServeHTTP(w, r)
	}))
	task, finish := submitHeld(t, rt, "report")

	bctx := openBrowser(t, bin)
	if err := chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/login?user=alice")); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(bctx, attr(row(task.ID), "status", "running")); err != nil {
		t.Fatalf("the list never shown while the stream was refused: %v", err)
	}
	unavailable := chromedp.Poll[chromedp.Void](`document.getElementById("state").textContent.startsWith("Live updates unavailable")`, chromedp.WithPollingTimeout(20*time.Second))
	if err := chromedp.Do(bctx, unavailable); err != nil {
		t.Fatalf("the page never said the stream was refused: %v", err)
	}
	for deadline := time.Now().Add(20 * time.Second); refused.Load() < 2; {
		if time.Now().After(deadline) {
			t.Fatal("the page never asked for the refused stream again")
		}
		time.Sleep(10 * time.Millisecond) // polling, with a deadline
	}
	refuse.Store(false)
	if err := chromedp.Do(bctx, isLive); err != nil {
		t.Fatalf("the stream never opened once the server took it: %v", err)
	}
	close(finish)
	if err := chromedp.Do(bctx, attr(row(task.ID), "status", "completed")); err != nil {
		t.Fatalf("the end never streamed: %v", err)
	}
}

// heldReads is a store without notices whose reads wait while mu is
// held: a test holds it to make several writes land between two reads.
type heldReads struct {
	workers.Store
	mu sync.RWMutex
}

func (s *heldReads) GetTask(ctx context.Context, id string) (workers.Record, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.Store.GetTask(ctx, id)
}

func (s *heldReads) ListTasks(ctx context.Context, f workers.Filter) ([]workers.Record, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.Store.ListTasks(ctx, f)
}

// A task alice was shown, whose run ended in another process and whose
// key bob then re-ran without her before her page's stream read it
// again, leaves her dashboard: the stream says it is gone, where it
// would otherwise stay running on the page.
func TestDashboardDropsATaskThatIsGone(t *testing.T) {
	bin := chromium(t)
	ctx := context.Background()
	mem := workers.NewMemStore()
	reads := &heldReads{Store: mem}
	front := workers.NewRuntime[workers.Store](struct {
		workers.Store
		workers.Leaser
	}{reads, mem}, workers.Config{})
	srv := serve(t, front, server(front))
	runner := workers.NewRuntime(mem, workers.Config{})
	release, again := make(chan struct{}), make(chan struct{})
	held := func(done chan struct{}) workers.Func {
		return func(ctx context.Context, _ *workers.Task) (any, error) {
			select {
			case <-done:
				return "done", nil
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		}
	}
	alice, bob := workers.MustOwner("alice"), workers.MustOwner("bob")
	shared, err := runner.Submit(ctx, "shared", held(release), bob, workers.WithWatchers(alice))
	if err != nil {
		t.Fatal(err)
	}
	own, finish := submitHeld(t, runner, "own")
	end := sync.OnceFunc(func() { close(finish) })
	t.Cleanup(func() {
		close(again)
		end()
		if err := runner.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})

	bctx := openBrowser(t, bin)
	if err := chromedp.Do(bctx,
		chromedp.Navigate(srv.URL+"/login?user=alice"),
		attr(row(shared.ID), "status", "running"),
		attr(row(own.ID), "status", "running"),
		isLive,
	); err != nil {
		t.Fatalf("dashboard did not load: %v", err)
	}
	reads.mu.Lock()
	close(release)
	if _, err := runner.Wait(ctx, shared.ID, workers.System); err != nil {
		reads.mu.Unlock()
		t.Fatal(err)
	}
	_, err = runner.Submit(ctx, "shared", held(again), bob) // watchers reset to bob
	reads.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	gone := fmt.Sprintf(`document.querySelector(%s) === null`, strconv.Quote(row(shared.ID)))
	if err := chromedp.Do(bctx, chromedp.Poll[chromedp.Void](gone, chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		t.Fatalf("the task bob re-ran without alice stays on her page: %v", err)
	}
	// The stream goes on: alice's own task still shows its end.
	end()
	if err := chromedp.Do(bctx, attr(row(own.ID), "status", "completed")); err != nil {
		t.Fatalf("the stream stopped after the gone task: %v", err)
	}
}

// A task shown live whose end came while the stream was down, and which
// a hundred newer tasks then pushed out of the list the page reads on
// reconnecting, shows its end: the page reads such a row on its own.
func TestDashboardShowsTheEndOfATaskTheListNoLongerHas(t *testing.T) {
	bin := chromium(t)
	ctx := context.Background()
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	// While held, a new stream waits to be served: the page reconnects
	// only once the task has ended and the newer ones are in.
	hs := holdStreams(server(rt))
	srv := serve(t, rt, hs)
	old, finish := submitHeld(t, rt, "old")

	bctx := openBrowser(t, bin)
	if err := chromedp.Do(bctx,
		chromedp.Navigate(srv.URL+"/login?user=alice"),
		attr(row(old.ID), "status", "running"),
		isLive,
	); err != nil {
		t.Fatalf("dashboard did not load: %v", err)
	}
	hs.held.Store(true)
	srv.CloseClientConnections() // the stream drops; the page reconnects, and waits
	close(finish)
	if _, err := rt.Wait(ctx, old.ID, workers.System); err != nil {
		t.Fatal(err)
	}
	endNewer(t, rt, 100)
	hs.release()
	if err := chromedp.Do(bctx, attr(row(old.ID), "status", "completed")); err != nil {
		shown, _ := chromedp.Run(bctx, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%s).dataset.status`, strconv.Quote(row(old.ID)))))
		t.Fatalf("after the reconnection the task that ended meanwhile shows %q, not its end: %v", shown, err)
	}
}

// heldListServer serves rt's dashboard; once hold is set, the next list
// request is read at once, listRead closed, and its answer held until
// release is closed.
func heldListServer(t *testing.T, rt *workers.Runtime[*workers.MemStore]) (srv *httptest.Server, hold *atomic.Bool, listRead, release chan struct{}) {
	h := server(rt)
	hold = new(atomic.Bool)
	listRead, release = make(chan struct{}), make(chan struct{})
	srv = serve(t, rt, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/tasks" || !hold.CompareAndSwap(true, false) {
			h.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		close(listRead)
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		maps.Copy(w.Header(), rec.Header())
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	}))
	return srv, hold, listRead, release
}

// heldStreams serves h, except that while held is set a new event
// stream waits to be served until release.
type heldStreams struct {
	h      http.Handler
	held   atomic.Bool
	resume chan struct{}
}

func holdStreams(h http.Handler) *heldStreams {
	return &heldStreams{h: h, resume: make(chan struct{})}
}

func (s *heldStreams) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/events" && s.held.Load() {
		select {
		case <-s.resume:
		case <-r.Context().Done():
			return
		}
	}
	s.h.ServeHTTP(w, r)
}

// release serves the streams held, and those to come.
func (s *heldStreams) release() {
	s.held.Store(false)
	close(s.resume)
}

// endNewer submits n of alice's tasks that end at once, each waited for.
func endNewer(t *testing.T, rt *workers.Runtime[*workers.MemStore], n int) {
	t.Helper()
	for i := range n {
		sub, err := rt.Submit(context.Background(), fmt.Sprint("newer-", i), func(context.Context, *workers.Task) (any, error) { return nil, nil }, workers.MustOwner("alice"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rt.Wait(context.Background(), sub.ID, workers.System); err != nil {
			t.Fatal(err)
		}
	}
}
