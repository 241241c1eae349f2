package storetest

import (
	"errors"

	"github.com/taskgate/workers"
)

// limited is a runtime config with one running slot and one waiting
// place per owner.
var limited = workers.Config{Limits: workers.Limits{MaxRunning: 1, Owner: workers.OwnerLimits{Waiting: 1}}}

func admissionRefusalWritesNothing(h *harness) {
	rt := h.runtime(limited)
	head := h.gate("head")
	hs := h.submit(rt, "head", head.fn, alice)
	h.wait(head.started, "the head to start")
	var waiting counter
	ws := h.submit(rt, "waiting", waiting.fn, alice)
	if rec := h.stored(ws.ID); rec.Status != workers.StatusPending {
		h.t.Errorf("a task waiting for a slot is %s in the store, want PENDING", rec.Status)
	}

	var refused counter
	for _, submit := range []func() error{
		func() error { _, err := rt.Submit(h.ctx, "over", refused.fn, alice); return err },
		func() error { _, err := rt.SubmitSequential(h.ctx, "q", "over", refused.fn, alice); return err },
	} {
		err := submit()
		var qe *workers.QuotaError
		if !errors.Is(err, workers.ErrQuotaExceeded) || !errors.As(err, &qe) {
			h.t.Errorf("a submission past the owner's waiting cap: error %v, want a *QuotaError", err)
		} else if qe.Max != 1 || qe.Current != 1 || qe.RetryAfter() <= 0 {
			h.t.Errorf("QuotaError says limit %d, current %d, retry after %v; want 1, 1 and a positive hint", qe.Max, qe.Current, qe.RetryAfter())
		}
		h.wantMissing("alice::over")
	}

	// Joining a live run costs no quota: the running and the waiting one.
	for _, sub := range []workers.Submission{hs, ws} {
		key := sub.ID[len("alice::"):]
		j, err := rt.Submit(h.ctx, key, refused.fn, alice)
		if err != nil || !j.Joined || j.RunID != sub.RunID {
			h.t.Errorf("a join of %q at the waiting cap: %+v, %v; want it joined to run %q", sub.ID, j, err, sub.RunID)
		}
	}
	head.open()
	h.wantEnded(h.settled(rt, ws.ID), ws.RunID, workers.StatusCompleted, "", nil)
	if n := refused.calls.Load(); n != 0 {
		h.t.Errorf("refused or joining callbacks ran %d times, want never", n)
	}
}

func admissionWaitingCancelled(h *harness) {
	rt := h.runtime(limited)
	head := h.gate("head")
	hs := h.submit(rt, "head", head.fn, alice)
	h.wait(head.started, "the head to start")
	var waiting counter
	ws := h.submit(rt, "waiting", waiting.fn, alice)
	h.must(rt.Cancel(h.ctx, ws.ID, alice), "Cancel of the waiting task")
	wantClaimed(h, ws.ID, ws.RunID)
	// Its waiting place is free again.
	next := h.submit(rt, "next", returns("next"), alice)
	head.open()
	h.wantEnded(h.settled(rt, hs.ID), hs.RunID, workers.StatusCompleted, "", nil)
	h.wantEnded(h.settled(rt, next.ID), next.RunID, workers.StatusCompleted, "", nil)
	if n := waiting.calls.Load(); n != 0 {
		h.t.Errorf("the cancelled waiting task's callback ran %d times, want never", n)
	}
}

func admissionShutdownCancelsWaiting(h *harness) {
	rt := h.runtime(workers.Config{Limits: workers.Limits{MaxRunning: 1}})
	head := h.gate("head")
	h.submit(rt, "head", head.fn, alice)
	h.wait(head.started, "the head to start")
	var waiting counter
	subs := []workers.Submission{
		h.submit(rt, "w1", waiting.fn, alice),
		h.submit(rt, "w2", waiting.fn, bob),
		h.submitSeq(rt, "q", "s1", waiting.fn, alice), // waits for a slot
		h.submitSeq(rt, "q", "s2", waiting.fn, bob),   // waits in the queue
	}
	h.shutdown(rt)
	if n := waiting.calls.Load(); n != 0 {
		h.t.Errorf("%d waiting callbacks ran during the shutdown, want none", n)
	}
	for _, sub := range subs {
		snap := h.status(rt, sub.ID, workers.System)
		h.wantEnded(snap, sub.RunID, workers.StatusCancelled, byShutdown, workers.ErrShutdown)
		if !snap.StartedAt.IsZero() {
			h.t.Errorf("waiting task %q has a start time %s, want none", sub.ID, show(snap.StartedAt))
		}
	}
}
