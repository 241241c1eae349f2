package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/taskgate/workers"
)

// The messages the runtime records for its cancellation causes.
const (
	byUser     = "Cancelled by user"
	byShutdown = "Cancelled by worker shutdown"
)

var liveStatuses = []workers.Status{workers.StatusPending, workers.StatusRunning}

// wantClaimed fails the case unless the store's record for id already
// says CANCELLED by the user under runID, with a completion time.
func wantClaimed(h *harness, id, runID string) {
	h.t.Helper()
	rec := h.stored(id)
	if rec.Status != workers.StatusCancelled || rec.Error != byUser || rec.RunID != runID || rec.CompletedAt.IsZero() {
		h.t.Errorf("once Cancel returned, the record is %s (%q) under run %q, completed %s; want CANCELLED (%q) under run %q, with a completion time",
			rec.Status, rec.Error, rec.RunID, show(rec.CompletedAt), byUser, runID)
	}
}

func cancelWhilePending(h *harness) {
	rt := h.runtime(workers.Config{})
	head := h.gate("head")
	hs := h.submitSeq(rt, "q", "head", head.fn, alice)
	h.wait(head.started, "the head of the queue to start")
	var queued counter
	sub := h.submitSeq(rt, "q", "queued", queued.fn, alice)
	if rec := h.stored(sub.ID); rec.Status != workers.StatusPending {
		h.t.Errorf("an item behind a running head is %s, want PENDING", rec.Status)
	}

	h.must(rt.Cancel(h.ctx, sub.ID, alice), "Cancel of the waiting item")
	wantClaimed(h, sub.ID, sub.RunID)

	head.open()
	h.wantEnded(h.settled(rt, hs.ID), hs.RunID, workers.StatusCompleted, "", nil)
	after := h.submitSeq(rt, "q", "after", returns("after"), alice)
	h.wantEnded(h.settled(rt, after.ID), after.RunID, workers.StatusCompleted, "", nil)

	snap := h.status(rt, sub.ID, alice)
	h.wantEnded(snap, sub.RunID, workers.StatusCancelled, byUser, workers.ErrCancelled)
	if !snap.StartedAt.IsZero() {
		h.t.Errorf("the cancelled item has a start time %s, want none: it never ran", show(snap.StartedAt))
	}
	if n := queued.calls.Load(); n != 0 {
		h.t.Errorf("the cancelled item's callback ran %d times, want never", n)
	}
	if err := rt.Cancel(h.ctx, sub.ID, alice); !errors.Is(err, workers.ErrFinished) {
		h.t.Errorf("a second Cancel: error %v, want ErrFinished", err)
	}
}

func cancelWhileRunning(h *harness) {
	rt := h.runtime(workers.Config{})
	g := h.gate("finished anyway")
	sub := h.submit(rt, "k", g.fn, alice)
	h.wait(g.started, "the run to start")

	h.must(rt.Cancel(h.ctx, sub.ID, alice), "Cancel of the running task")
	wantClaimed(h, sub.ID, sub.RunID)
	h.wait(g.ran, "the callback to see its context end")
	if !errors.Is(g.cause, workers.ErrCancelled) {
		h.t.Errorf("the callback's context ended with the cause %v, want ErrCancelled", g.cause)
	}
	if reason := g.task.CancelCause(); !errors.Is(reason, workers.ErrCancelled) {
		h.t.Errorf("CancelReason() = %v, want ErrCancelled", reason)
	}

	h.shutdown(rt) // the run has settled: its own final write is done
	h.wantEnded(h.status(rt, sub.ID, alice), sub.RunID, workers.StatusCancelled, byUser, workers.ErrCancelled)
	if err := rt.Cancel(h.ctx, sub.ID, alice); !errors.Is(err, workers.ErrFinished) {
		h.t.Errorf("a second Cancel: error %v, want ErrFinished", err)
	}
}

func cancelFromAnotherRuntime(h *harness) {
	executing, other := h.runtime(workers.Config{}), h.runtime(workers.Config{})
	g := h.gate("finished anyway")
	sub := h.submit(executing, "k", g.fn, alice)
	h.wait(g.started, "the run to start")

	h.must(other.Cancel(h.ctx, sub.ID, alice), "Cancel through another runtime")
	wantClaimed(h, sub.ID, sub.RunID)

	g.open() // the executing runtime's run was not interrupted: it completes
	h.shutdown(executing)
	snap := h.status(other, sub.ID, alice)
	h.wantEnded(snap, sub.RunID, workers.StatusCancelled, byUser, workers.ErrCancelled)
	if snap.Result != nil {
		h.t.Errorf("the cancelled record carries the late run's result %s", snap.Result)
	}
}

func shutdownAbandonsBacklog(h *harness) {
	rt := h.runtime(workers.Config{})
	head := h.gate("head")
	hs := h.submitSeq(rt, "q", "head", head.fn, alice)
	h.wait(head.started, "the head of the queue to start")
	var backlog counter
	subs := make([]workers.Submission, 4)
	for i := range subs {
		subs[i] = h.submitSeq(rt, "q", fmt.Sprint("backlog-", i), backlog.fn, alice)
	}

	h.shutdown(rt)
	if n := backlog.calls.Load(); n != 0 {
		h.t.Errorf("%d backlog callbacks ran during the shutdown, want none", n)
	}
	for _, sub := range subs {
		snap := h.status(rt, sub.ID, alice)
		h.wantEnded(snap, sub.RunID, workers.StatusCancelled, byShutdown, workers.ErrShutdown)
		if !snap.StartedAt.IsZero() {
			h.t.Errorf("abandoned item %q has a start time %s, want none", sub.ID, show(snap.StartedAt))
		}
	}
	h.wantEnded(h.status(rt, hs.ID, alice), hs.RunID, workers.StatusCancelled, byShutdown, workers.ErrShutdown)

	if _, err := rt.Submit(h.ctx, "late", backlog.fn, alice); !errors.Is(err, workers.ErrClosed) {
		h.t.Errorf("Submit after Shutdown: error %v, want ErrClosed", err)
	}
	if _, err := rt.SubmitSequential(h.ctx, "q", "late", backlog.fn, alice); !errors.Is(err, workers.ErrClosed) {
		h.t.Errorf("SubmitSequential after Shutdown: error %v, want ErrClosed", err)
	}
	h.wantMissing("alice::late")
}

func shutdownLeavesNothingLive(h *harness) {
	rt := h.runtime(workers.Config{})
	blocked := func(ctx context.Context, _ *workers.Task) (any, error) {
		<-ctx.Done()
		return nil, context.Cause(ctx)
	}
	finishesAnyway := func(ctx context.Context, _ *workers.Task) (any, error) {
		<-ctx.Done()
		return "finished anyway", nil
	}
	failing := func(context.Context, *workers.Task) (any, error) { return nil, errors.New("transient") }
	// Runs in flight of every kind: blocked, finishing anyway, parked in
	// a retry's backoff, and a queue with a backlog.
	h.submit(rt, "blocked", blocked, alice)
	h.submit(rt, "finishes", finishesAnyway, alice)
	h.submit(rt, "backoff", failing, alice, workers.WithRetry(workers.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Hour}))
	for i := range 3 {
		h.submitSeq(rt, "q", fmt.Sprint("queued-", i), blocked, alice)
	}

	// Submitters race the shutdown on both paths.
	const submitters, most = 4, 200
	var submitted atomic.Int32
	var wg sync.WaitGroup
	for i := range submitters {
		wg.Go(func() {
			for j := range most {
				fn := []workers.Func{blocked, returns(j)}[j%2]
				key := fmt.Sprintf("s%d-%d", i, j)
				var err error
				if i%2 == 0 {
					_, err = rt.Submit(h.ctx, key, fn, alice)
				} else {
					_, err = rt.SubmitSequential(h.ctx, fmt.Sprint("race-", i), key, fn, alice)
				}
				if errors.Is(err, workers.ErrClosed) {
					return
				}
				if err != nil {
					h.t.Errorf("submitting %q while the runtime shuts down: %v", key, err)
					return
				}
				submitted.Add(1)
			}
		})
	}
	submittersDone := make(chan struct{})
	go func() {
		wg.Wait()
		close(submittersDone)
	}()
	h.eventually("some racing submissions", func() bool { return submitted.Load() >= 4*submitters })

	h.shutdown(rt)
	h.wait(submittersDone, "the submitters to see ErrClosed")
	live, err := h.store.ListTasks(h.ctx, workers.Filter{Statuses: liveStatuses})
	h.must(err, "ListTasks of the live records")
	for _, r := range live {
		h.t.Errorf("after Shutdown returned nil, %q is still %s", r.ID, r.Status)
	}
}

func recoverySweepsZombies(h *harness) {
	ts := time.Now().UTC().Truncate(time.Microsecond).Add(-time.Hour)
	mk := func(id string, st workers.State) workers.Record {
		return workers.Record{ID: id, RunID: "dead-" + id, Watchers: []string{"alice"}, CreatedAt: ts, State: st}
	}
	finished := []workers.Record{
		mk("alice::done", workers.State{Status: workers.StatusCompleted, Progress: 100, Attempt: 1, Result: json.RawMessage(`{"ok": true}`), StartedAt: ts, CompletedAt: ts}),
		mk("alice::failed", workers.State{Status: workers.StatusFailed, Attempt: 1, Error: "disk full", StartedAt: ts, CompletedAt: ts}),
		mk("alice::cancelled", workers.State{Status: workers.StatusCancelled, Error: byUser, CompletedAt: ts}),
	}
	// Live records a process that died left behind.
	orphan := mk("alice::orphan", workers.State{Status: workers.StatusPending})
	crashed := mk("alice::crashed", workers.State{Status: workers.StatusRunning, Progress: 40, Attempt: 1, StartedAt: ts})
	h.insert(append(finished, orphan, crashed)...)

	dead := h.runtime(workers.Config{}) // stands for a process that hung or died
	stuck := h.stubbornGate("late")
	zombie := h.submit(dead, "zombie", stuck.fn, alice)
	h.wait(stuck.started, "the doomed run to start")
	// Over a store with leases, a process that died has no live lease:
	// end the one the doomed runtime took (it renews only every few
	// seconds, long after this case).
	if l, ok := h.store.(workers.Leaser); ok {
		h.must(l.ReleaseLease(h.ctx, workers.InstanceOf(zombie.RunID)), "ReleaseLease of the doomed runtime")
	}

	fresh := h.runtime(workers.Config{RecoverZombies: true})
	mine := h.gate("mine")
	own := h.submit(fresh, "own", mine.fn, alice) // live in the recovering runtime
	h.wait(mine.started, "the recovering runtime's own run to start")
	h.must(fresh.Start(h.ctx), "Start with RecoverZombies")

	for _, z := range []struct{ id, runID string }{{zombie.ID, zombie.RunID}, {orphan.ID, orphan.RunID}, {crashed.ID, crashed.RunID}} {
		h.wantEnded(h.status(fresh, z.id, workers.System), z.runID, workers.StatusFailed, "", workers.ErrAbandoned)
	}
	if p := h.stored(crashed.ID).Progress; p != 40 {
		h.t.Errorf("the recovered record has progress %d, want the 40 it was found with", p)
	}
	if rec := h.stored(own.ID); rec.Status != workers.StatusRunning || rec.RunID != own.RunID {
		h.t.Errorf("the recovering runtime's own run is %s under run %q, want RUNNING under %q", rec.Status, rec.RunID, own.RunID)
	}
	for _, r := range finished {
		h.wantStored(r)
	}
	if n, err := fresh.RecoverZombies(h.ctx); n != 0 || err != nil {
		h.t.Errorf("a second RecoverZombies = %d, %v; want 0, nil", n, err)
	}

	stuck.open()
	h.wait(stuck.ran, "the abandoned callback to return")
	h.shutdown(dead) // its run has settled: its late write is done
	h.wantEnded(h.status(fresh, zombie.ID, workers.System), zombie.RunID, workers.StatusFailed, "", workers.ErrAbandoned)
	if r := h.stored(zombie.ID).Result; r != nil {
		h.t.Errorf("the recovered record carries the abandoned run's late result %s", r)
	}

	mine.open()
	h.wantEnded(h.settled(fresh, own.ID), own.RunID, workers.StatusCompleted, "", nil)
	h.shutdown(fresh)
}

func cleanupDeletesOld(h *harness) {
	now := time.Now().UTC().Truncate(time.Microsecond)
	old, recent := now.Add(-2*time.Hour), now.Add(-10*time.Minute)
	// The live records belong to an instance that holds a lease, over a
	// store with leases, so that the recovery Start runs leaves them be.
	const keeper = "storetest-keeper"
	if l, ok := h.store.(workers.Leaser); ok {
		_, err := l.RenewLease(h.ctx, keeper, time.Hour)
		h.must(err, "setup: RenewLease")
	}
	mk := func(id string, status workers.Status, when time.Time) workers.Record {
		r := workers.Record{ID: id, RunID: keeper + "." + id, Watchers: []string{"alice"}, CreatedAt: when.Add(-time.Minute), State: workers.State{Status: status}}
		switch {
		case status.Terminal():
			r.StartedAt, r.CompletedAt = when.Add(-time.Second), when
		case status == workers.StatusRunning:
			r.StartedAt = when
		}
		return r
	}
	doomed := []workers.Record{
		mk("alice::old-completed", workers.StatusCompleted, old),
		mk("alice::old-failed", workers.StatusFailed, old),
		mk("alice::old-cancelled", workers.StatusCancelled, old),
	}
	kept := []workers.Record{
		mk("alice::recent-completed", workers.StatusCompleted, recent),
		mk("alice::old-running", workers.StatusRunning, old),
		mk("alice::old-pending", workers.StatusPending, old),
	}
	h.insert(append(doomed, kept...)...)

	rt := h.runtime(workers.Config{})
	g := h.gate(nil)
	live := h.submit(rt, "live", g.fn, alice)
	h.wait(g.started, "a live run to start")

	for _, want := range []int{len(doomed), 0} {
		if n, err := rt.Cleanup(h.ctx, time.Hour); n != want || err != nil {
			h.t.Errorf("Cleanup(1h) = %d, %v; want %d, nil", n, err, want)
		}
	}
	for _, r := range doomed {
		h.wantMissing(r.ID)
	}
	for _, r := range kept {
		h.wantStored(r)
	}

	// The scheduler does the same on its own.
	late := mk("alice::old-again", workers.StatusCompleted, old)
	h.insert(late)
	sched := h.runtime(workers.Config{CleanupInterval: 10 * time.Millisecond, Retention: time.Hour})
	h.must(sched.Start(h.ctx), "Start with a cleanup scheduler")
	h.eventually("the cleanup scheduler to delete an old record", func() bool {
		_, err := h.store.GetTask(h.ctx, late.ID)
		return errors.Is(err, workers.ErrNotFound)
	})
	for _, r := range kept {
		h.wantStored(r)
	}
	if rec := h.stored(live.ID); rec.Status != workers.StatusRunning {
		h.t.Errorf("the live run's record is %s after the cleanups, want RUNNING", rec.Status)
	}
	g.open()
	h.wantEnded(h.settled(rt, live.ID), live.RunID, workers.StatusCompleted, "", nil)
}

func resetKeepsDurable(h *harness) {
	rt := h.runtime(workers.Config{})
	done := h.submit(rt, "done", returns(1), alice)
	h.settled(rt, done.ID)
	head := h.gate(nil)
	hs := h.submitSeq(rt, "q", "head", head.fn, alice)
	h.wait(head.started, "the head of the queue to start")
	var waiting counter
	pending := h.submitSeq(rt, "q", "pending", waiting.fn, alice)

	h.must(rt.Reset(h.ctx), "Reset")
	h.wait(head.ran, "the head to see its context end")
	_, clears := h.store.(workers.RecordClearer)
	if clears && !h.su.durable {
		recs, err := h.store.ListTasks(h.ctx, workers.Filter{})
		h.must(err, "ListTasks after Reset")
		if len(recs) != 0 {
			h.t.Errorf("Reset of a volatile store left the records %q", ids(recs))
		}
	} else {
		for _, id := range []string{done.ID, hs.ID, pending.ID} {
			if _, err := h.store.GetTask(h.ctx, id); err != nil {
				h.fatalf("Reset of a store that is durable or has no RecordClearer lost the record %q: %v", id, err)
			}
		}
		h.wantEnded(h.status(rt, done.ID, alice), done.RunID, workers.StatusCompleted, "", nil)
		h.wantEnded(h.status(rt, pending.ID, alice), pending.RunID, workers.StatusCancelled, byShutdown, workers.ErrShutdown)
		h.eventually("the reset head to record its cancellation", func() bool {
			return h.status(rt, hs.ID, alice).Status.Terminal()
		})
		h.wantEnded(h.status(rt, hs.ID, alice), hs.RunID, workers.StatusCancelled, byShutdown, workers.ErrShutdown)
	}

	after := h.submit(rt, "after", returns(2), alice)
	h.wantEnded(h.settled(rt, after.ID), after.RunID, workers.StatusCompleted, "", nil)
	if n := waiting.calls.Load(); n != 0 {
		h.t.Errorf("the waiting item's callback ran %d times after Reset, want never", n)
	}
}
