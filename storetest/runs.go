package storetest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/taskgate/workers"
)

// report is a result with the shapes a JSON column may re-encode:
// nesting, non-ASCII text, a fraction, a null.
type report struct {
	Rows  int               `json:"rows"`
	Title string            `json:"title"`
	Tags  []string          `json:"tags"`
	Ratio float64           `json:"ratio"`
	Meta  map[string]string `json:"meta"`
	None  *int              `json:"none"`
}

func runsAndCompletes(h *harness) {
	rt := h.runtime(workers.Config{})
	want := report{Rows: 3, Title: "échec ✓", Tags: []string{"a", "b"}, Ratio: 0.5, Meta: map[string]string{"k": "v"}}
	var calls atomic.Int32
	sub := h.submit(rt, "report", func(context.Context, *workers.Task) (any, error) {
		calls.Add(1)
		return want, nil
	}, alice)
	if id, _ := workers.ScopedTaskKey("report", alice); sub.ID != id || sub.RunID == "" || sub.Joined {
		h.t.Errorf("Submit = %+v, want the id %q, a run id, and not joined", sub, id)
	}

	snap := h.settled(rt, sub.ID)
	h.wantEnded(snap, sub.RunID, workers.StatusCompleted, "", nil)
	got, err := workers.ResultAs[report](snap)
	if err != nil || !reflect.DeepEqual(got, want) {
		h.t.Errorf("ResultAs = %+v, %v; want %+v, nil (stored result %s)", got, err, want, snap.Result)
	}

	rec := h.stored(sub.ID)
	if rec.RunID != sub.RunID || rec.Status != workers.StatusCompleted || rec.Attempt != 1 || rec.Queue != "" || !sameSet(rec.Watchers, []string{"alice"}) {
		h.t.Errorf("stored record: run %q, %s, attempt %d, queue %q, watchers %q; want run %q, completed, attempt 1, no queue, watchers [alice]",
			rec.RunID, rec.Status, rec.Attempt, rec.Queue, rec.Watchers, sub.RunID)
	}
	if rec.CreatedAt.IsZero() || rec.StartedAt.Before(rec.CreatedAt) || rec.CompletedAt.Before(rec.StartedAt) {
		h.t.Errorf("stored times out of order: created %s, started %s, completed %s",
			show(rec.CreatedAt), show(rec.StartedAt), show(rec.CompletedAt))
	}
	if n := calls.Load(); n != 1 {
		h.t.Errorf("the callback ran %d times, want once", n)
	}
}

func joinLiveKey(h *harness) {
	rt, other := h.runtime(workers.Config{}), h.runtime(workers.Config{})
	g := h.gate("first")
	first := h.submit(rt, "k", g.fn, alice)
	h.wait(g.started, "the first run to start")

	var joiner counter
	for _, via := range []struct {
		name string
		rt   *testRuntime
	}{{"the same runtime", rt}, {"another runtime over the store", other}} {
		sub := h.submit(via.rt, "k", joiner.fn, alice)
		if !sub.Joined || sub.ID != first.ID || sub.RunID != first.RunID {
			h.t.Errorf("a second Submit of the live key through %s = %+v, want it joined to %+v", via.name, sub, first)
		}
	}
	if rec := h.stored(first.ID); rec.RunID != first.RunID || !sameSet(rec.Watchers, []string{"alice"}) {
		h.t.Errorf("after the joins the record has run %q and watchers %q, want run %q and [alice]", rec.RunID, rec.Watchers, first.RunID)
	}

	g.open()
	snap := h.settled(rt, first.ID)
	h.wantEnded(snap, first.RunID, workers.StatusCompleted, "", nil)
	if got, err := workers.ResultAs[string](snap); got != "first" {
		h.t.Errorf("the task's result is %q (%v), want the first run's", got, err)
	}
	h.shutdown(rt)
	h.shutdown(other)
	if n := joiner.calls.Load(); n != 0 {
		h.t.Errorf("a joiner's callback ran %d times, want never", n)
	}
}

func rerunSupersedes(h *harness) {
	rt := h.runtime(workers.Config{})
	old := h.stubbornGate("old")
	first := h.submit(rt, "k", old.fn, alice)
	h.wait(old.started, "the first run to start")

	// An operator, or another process, marks the record finished while
	// the run still executes here.
	rec := h.stored(first.ID)
	rec.Status, rec.Error = workers.StatusFailed, "marked failed by an operator"
	rec.CompletedAt = time.Now().UTC().Truncate(time.Microsecond)
	h.must(h.store.SetTask(h.ctx, rec), "SetTask marking the run FAILED")

	fresh := h.gate("new")
	second := h.submit(rt, "k", fresh.fn, alice)
	if second.Joined || second.ID != first.ID || second.RunID == first.RunID {
		h.fatalf("re-submitting the finished key = %+v, want a new run of %q replacing run %q", second, first.ID, first.RunID)
	}
	h.wait(fresh.started, "the new run to start (it must not be stranded PENDING)")
	if reason := old.task.CancelCause(); !errors.Is(reason, workers.ErrSuperseded) {
		h.t.Errorf("the predecessor's CancelReason() = %v, want ErrSuperseded", reason)
	}

	old.open()
	late := h.terminalWrite(first.RunID, "the predecessor's late write")
	if late.ok || late.err != nil {
		h.t.Errorf("the superseded run's %s write reported %v, %v; want false, nil", late.next, late.ok, late.err)
	}
	if rec := h.stored(first.ID); rec.RunID != second.RunID || rec.Status != workers.StatusRunning || rec.Result != nil {
		h.t.Errorf("after the predecessor's late write the record is %s under run %q with result %s; want RUNNING under run %q, no result",
			rec.Status, rec.RunID, show(rec.Result), second.RunID)
	}

	fresh.open()
	snap := h.settled(rt, first.ID)
	h.wantEnded(snap, second.RunID, workers.StatusCompleted, "", nil)
	if got, err := workers.ResultAs[string](snap); got != "new" {
		h.t.Errorf("the task's result is %q (%v), want the new run's", got, err)
	}
}

func rerunResetsWatchers(h *harness) {
	rt := h.runtime(workers.Config{})
	first := h.submit(rt, "k", returns(1), alice, workers.WithWatchers(bob))
	h.settled(rt, first.ID)
	h.status(rt, first.ID, bob) // granted at submit

	second := h.submit(rt, "k", returns(2), alice, workers.WithWatchers(carol))
	if second.Joined || second.RunID == first.RunID {
		h.fatalf("re-running the finished key = %+v, want a new run", second)
	}
	snap := h.settled(rt, first.ID)
	h.wantEnded(snap, second.RunID, workers.StatusCompleted, "", nil)
	if n, err := workers.ResultAs[int](snap); n != 2 {
		h.t.Errorf("the task's result is %d (%v), want the re-run's", n, err)
	}
	wantAccess(h, rt, first.ID, []string{"alice", "carol"}, carol)
	wantNoAccess(h, rt, first.ID, bob, "a watcher of the previous run")

	// A global id has no owner: after a re-run, its watchers are exactly
	// who may see it.
	shared := h.submit(rt, "shared", returns("alice's"), alice, global, workers.WithWatchers(bob))
	h.settled(rt, shared.ID)
	again := h.submit(rt, "shared", returns("bob's"), bob, global)
	if again.Joined || again.RunID == shared.RunID {
		h.fatalf("bob re-running the finished global key he watches = %+v, want a new run", again)
	}
	h.wantEnded(h.settled(rt, shared.ID), again.RunID, workers.StatusCompleted, "", nil)
	wantAccess(h, rt, shared.ID, []string{"bob"}, bob)
	wantNoAccess(h, rt, shared.ID, alice, "the submitter of the previous run of a global key")
}

// wantAccess fails the case unless id's record lists exactly watchers,
// and who can read it and finds it in its list.
func wantAccess(h *harness, rt *testRuntime, id string, watchers []string, who workers.Owner) {
	h.t.Helper()
	if got := h.stored(id).Watchers; !sameSet(got, watchers) {
		h.t.Errorf("record %q lists the watchers %q, want %q", id, got, watchers)
	}
	if _, err := rt.Status(h.ctx, id, who); err != nil {
		h.t.Errorf("Status(%q) for %v: %v", id, who, err)
	}
	if !slices.Contains(listed(h, rt, who), id) {
		h.t.Errorf("List for %v does not show %q", who, id)
	}
}

// wantNoAccess fails the case if who can read id or finds it in its
// list.
func wantNoAccess(h *harness, rt *testRuntime, id string, who workers.Owner, role string) {
	h.t.Helper()
	if _, err := rt.Status(h.ctx, id, who); !errors.Is(err, workers.ErrNotFound) {
		h.t.Errorf("Status(%q) for %v, %s: error %v, want ErrNotFound", id, who, role, err)
	}
	if slices.Contains(listed(h, rt, who), id) {
		h.t.Errorf("List for %v, %s, still shows %q", who, role, id)
	}
}

// listed returns the ids rt lists for auth.
func listed(h *harness, rt *testRuntime, auth workers.TaskAuthority) []string {
	h.t.Helper()
	snaps, err := rt.List(h.ctx, auth)
	h.must(err, "List for %v", auth)
	out := make([]string, len(snaps))
	for i, s := range snaps {
		out[i] = s.ID
	}
	return out
}

func queueFIFO(h *harness) {
	rt := h.runtime(workers.Config{})
	var running atomic.Int32 // items of the queue executing now
	var mu sync.Mutex
	var order []int // guarded by mu
	head := h.gate("head")
	hs := h.submitSeq(rt, "q", "head", func(ctx context.Context, t *workers.Task) (any, error) {
		running.Add(1)
		defer running.Add(-1)
		return head.fn(ctx, t)
	}, alice)
	h.wait(head.started, "the head of the queue to start")

	const n = 6
	subs := make([]workers.Submission, n)
	for i := range subs {
		who := []workers.Owner{alice, bob}[i%2] // order holds across submitters
		subs[i] = h.submitSeq(rt, "q", fmt.Sprint("item-", i), func(context.Context, *workers.Task) (any, error) {
			if running.Add(1) != 1 {
				h.t.Errorf("item %d started while another item of its queue was running", i)
			}
			defer running.Add(-1)
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			return i, nil
		}, who)
	}
	for _, sub := range subs {
		if rec := h.stored(sub.ID); rec.Status != workers.StatusPending {
			h.t.Errorf("item %q is %s behind a running head, want PENDING", sub.ID, rec.Status)
		}
	}

	head.open()
	h.wantEnded(h.settled(rt, hs.ID), hs.RunID, workers.StatusCompleted, "", nil)
	for i, sub := range subs {
		snap := h.settled(rt, sub.ID)
		h.wantEnded(snap, sub.RunID, workers.StatusCompleted, "", nil)
		if got, err := workers.ResultAs[int](snap); got != i || err != nil {
			h.t.Errorf("item %d's result is %d, %v", i, got, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []int{0, 1, 2, 3, 4, 5}; !slices.Equal(order, want) {
		h.t.Errorf("the items ran in the order %v, want %v", order, want)
	}
}

func progressLive(h *harness) {
	rt := h.runtime(workers.Config{})
	step := make(chan int)
	acked := make(chan struct{})
	sub := h.submit(rt, "k", func(ctx context.Context, t *workers.Task) (any, error) {
		for {
			select {
			case p, ok := <-step:
				if !ok {
					return "done", nil
				}
				t.SetProgress(p)
				acked <- struct{}{}
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		}
	}, alice)
	for _, p := range []int{10, 55, 70} {
		select {
		case step <- p:
		case <-h.ctx.Done():
			h.fatalf("gave up handing the callback progress %d: the case ran out of time", p)
		}
		h.wait(acked, "the callback to set its progress")
		snap := h.status(rt, sub.ID, alice)
		if snap.Status != workers.StatusRunning || snap.Progress != p || snap.Attempt != 1 {
			h.t.Errorf("Status while the run executes: %s, progress %d, attempt %d; want running, progress %d, attempt 1",
				snap.Status, snap.Progress, snap.Attempt, p)
		}
	}
	close(step)
	snap := h.settled(rt, sub.ID)
	h.wantEnded(snap, sub.RunID, workers.StatusCompleted, "", nil)
	if snap.Progress != 70 {
		h.t.Errorf("the finished task reports progress %d, want the last value set, 70", snap.Progress)
	}
	if p := h.stored(sub.ID).Progress; p != 70 {
		h.t.Errorf("the terminal record keeps progress %d, want 70", p)
	}
}

func panicFails(h *harness) {
	rt := h.runtime(workers.Config{})
	boom := func(context.Context, *workers.Task) (any, error) { panic("boom") }
	for _, sub := range []workers.Submission{
		h.submit(rt, "panics", boom, alice),
		h.submitSeq(rt, "q", "panics-seq", boom, alice),
	} {
		snap := h.settled(rt, sub.ID)
		h.wantEnded(snap, sub.RunID, workers.StatusFailed, "", nil)
		var te *workers.TaskError
		if !errors.As(snap.Err(), &te) || !containsAll(snap.Error, "panicked", "boom") {
			h.t.Errorf("task %q recorded %q (Err %v), want a *TaskError naming the panic and its value", sub.ID, snap.Error, snap.Err())
		}
		if rec := h.stored(sub.ID); rec.Cause != workers.CausePanicked || !strings.Contains(rec.Stack, "panicFails") {
			h.t.Errorf("task %q stored cause %q and a stack of %d bytes, want %q and the panicking goroutine's stack", sub.ID, rec.Cause, len(rec.Stack), workers.CausePanicked)
		}
	}
	for _, sub := range []workers.Submission{
		h.submit(rt, "after", returns("fine"), alice),
		h.submitSeq(rt, "q", "after-seq", returns("fine"), alice),
	} {
		h.wantEnded(h.settled(rt, sub.ID), sub.RunID, workers.StatusCompleted, "", nil)
	}
}

// containsAll reports whether s contains every one of subs.
func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

func timeoutFails(h *harness) {
	// A real timer, short but far longer than a run takes to start: a
	// SQL store cannot run inside a synctest bubble.
	const timeout = 50 * time.Millisecond
	rt := h.runtime(workers.Config{})
	stuck := h.stubbornGate("late")
	var calls atomic.Int32
	sub := h.submit(rt, "slow", func(ctx context.Context, t *workers.Task) (any, error) {
		calls.Add(1)
		return stuck.fn(ctx, t)
	}, alice, workers.WithTimeout(timeout), workers.WithRetry(workers.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond}))
	h.wait(stuck.started, "the callback to start")

	snap := h.settled(rt, sub.ID)
	h.wantEnded(snap, sub.RunID, workers.StatusFailed, "", workers.ErrTimeout)
	var te *workers.TimeoutError
	if !errors.As(snap.Err(), &te) || te.Timeout != timeout {
		h.t.Errorf("Snapshot.Err() = %v (recorded %q), want a *TimeoutError for %v", snap.Err(), snap.Error, timeout)
	}
	if reason := stuck.task.CancelCause(); !errors.As(reason, &te) {
		h.t.Errorf("the run's CancelReason() = %v, want a *TimeoutError", reason)
	}

	stuck.open()
	h.wait(stuck.ran, "the timed-out callback to return")
	h.shutdown(rt) // the run has settled: its late return is handled
	if rec := h.stored(sub.ID); rec.Status != workers.StatusFailed || rec.RunID != sub.RunID || rec.Result != nil {
		h.t.Errorf("after the late return the record is %s under run %q with result %s; want FAILED under run %q, no result",
			rec.Status, rec.RunID, show(rec.Result), sub.RunID)
	}
	if n := calls.Load(); n != 1 {
		h.t.Errorf("the callback ran %d times, want once: a timed-out run is never retried", n)
	}
}
