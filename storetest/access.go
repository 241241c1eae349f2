package storetest

import (
	"errors"
	"reflect"
	"slices"

	"github.com/taskgate/workers"
)

func joinForeignRefused(h *harness) {
	rt := h.runtime(workers.Config{})
	g := h.gate("alice's")
	sub := h.submit(rt, "warm-cache", g.fn, alice, global)
	h.wait(g.started, "alice's run to start")
	before := h.stored(sub.ID)

	var bobs counter
	refusals := []struct {
		name string
		auth workers.WatchAuthorizer
	}{
		{"no watch authorizer", nil},
		{"a watch authorizer that panics", func(string, []string, string) bool { panic("watch authorizer exploded") }},
	}
	refuse := func(state string) {
		h.t.Helper()
		for _, c := range refusals {
			h.store.SetWatchAuthorizer(c.auth)
			_, err := rt.Submit(h.ctx, "warm-cache", bobs.fn, bob, global)
			var ae *workers.AuthorizationError
			if !errors.Is(err, workers.ErrUnauthorized) || !errors.As(err, &ae) || ae.TaskID != sub.ID {
				h.t.Errorf("with %s, bob's Submit of alice's %s global key: error %v, want an *AuthorizationError for %q", c.name, state, err, sub.ID)
			}
			if _, err := rt.Status(h.ctx, sub.ID, bob); !errors.Is(err, workers.ErrNotFound) {
				h.t.Errorf("with %s, Status for refused bob: error %v, want ErrNotFound", c.name, err)
			}
		}
	}

	refuse("live")
	h.wantStored(before)

	g.open()
	snap := h.settled(rt, sub.ID)
	h.wantEnded(snap, sub.RunID, workers.StatusCompleted, "", nil)
	finished := h.stored(sub.ID)
	refuse("finished") // a re-run would discard alice's result
	h.wantStored(finished)
	h.shutdown(rt)
	if n := bobs.calls.Load(); n != 0 {
		h.t.Errorf("a refused caller's callback ran %d times", n)
	}
}

func joinForeignAllowed(h *harness) {
	rt := h.runtime(workers.Config{})
	g := h.gate("alice's")
	sub := h.submit(rt, "warm-cache", g.fn, alice, global)
	h.wait(g.started, "alice's run to start")

	h.store.SetWatchAuthorizer(func(id string, watchers []string, user string) bool {
		return id == "warm-cache" && user == "bob" && slices.Contains(watchers, "alice")
	})
	var bobs counter
	joined := h.submit(rt, "warm-cache", bobs.fn, bob, global)
	if !joined.Joined || joined.ID != sub.ID || joined.RunID != sub.RunID {
		h.t.Errorf("bob's allowed Submit = %+v, want it joined to %+v", joined, sub)
	}
	if w := h.stored(sub.ID).Watchers; !sameSet(w, []string{"alice", "bob"}) {
		h.t.Errorf("after bob joined the record lists the watchers %q, want [alice bob]", w)
	}
	snap := h.status(rt, sub.ID, bob)
	if snap.RunID != sub.RunID || snap.WatcherCount != 2 {
		h.t.Errorf("Status for the joiner: run %q, %d watchers; want run %q, 2 watchers", snap.RunID, snap.WatcherCount, sub.RunID)
	}
	if !slices.Contains(listed(h, rt, bob), sub.ID) {
		h.t.Errorf("List for the joiner does not show %q", sub.ID)
	}
	if _, err := rt.Submit(h.ctx, "warm-cache", bobs.fn, carol, global); !errors.Is(err, workers.ErrUnauthorized) {
		h.t.Errorf("carol's Submit, which the authorizer does not allow: error %v, want ErrUnauthorized", err)
	}

	g.open()
	h.wantEnded(h.settled(rt, sub.ID), sub.RunID, workers.StatusCompleted, "", nil)
	h.status(rt, sub.ID, bob) // the joiner still sees the finished task
	h.shutdown(rt)
	if n := bobs.calls.Load(); n != 0 {
		h.t.Errorf("the joiner's callback ran %d times, want never", n)
	}
}

func queueAuthorizerPanics(h *harness) {
	rt := h.runtime(workers.Config{})
	h.store.SetQueueAuthorizer(func(string, string) bool { panic("queue authorizer exploded") })
	var c counter
	for _, try := range []struct {
		path, queue, key string
		submit           func() error
	}{
		{"Submit", workers.DefaultQueue, "k", func() error {
			_, err := rt.Submit(h.ctx, "k", c.fn, alice)
			return err
		}},
		{"SubmitSequential", "reports", "k-seq", func() error {
			_, err := rt.SubmitSequential(h.ctx, "reports", "k-seq", c.fn, alice)
			return err
		}},
	} {
		err := try.submit()
		var ae *workers.AuthorizationError
		if !errors.Is(err, workers.ErrUnauthorized) || !errors.As(err, &ae) || ae.Queue != try.queue {
			h.t.Errorf("%s under a panicking queue authorizer: error %v, want an *AuthorizationError for queue %q", try.path, err, try.queue)
		}
		id, _ := workers.ScopedTaskKey(try.key, alice)
		h.wantMissing(id)
	}

	sys := h.submit(rt, "sys", c.fn, workers.System) // System is not asked
	h.wantEnded(h.settled(rt, sys.ID), sys.RunID, workers.StatusCompleted, "", nil)
	h.store.SetQueueAuthorizer(nil)
	ok := h.submit(rt, "k", c.fn, alice)
	h.wantEnded(h.settled(rt, ok.ID), ok.RunID, workers.StatusCompleted, "", nil)
	if n := c.calls.Load(); n != 2 {
		h.t.Errorf("callbacks ran %d times, want 2: the denied submissions must not run", n)
	}
}

func nonWatcherSeesNotFound(h *harness) {
	rt := h.runtime(workers.Config{})
	g := h.gate("secret")
	live := h.submit(rt, "secret", g.fn, alice, global)
	done := h.submit(rt, "private", returns("private"), alice)
	h.wait(g.started, "alice's run to start")
	h.settled(rt, done.ID)

	const missing = "no-such-task"
	missingSnap, missingStatus := rt.Status(h.ctx, missing, bob)
	missingCancel := rt.Cancel(h.ctx, missing, bob)
	for call, err := range map[string]error{"Status": missingStatus, "Cancel": missingCancel} {
		if !errors.Is(err, workers.ErrNotFound) {
			h.t.Errorf("%s of a missing id: error %v, want ErrNotFound", call, err)
		}
	}
	for _, id := range []string{live.ID, done.ID} {
		snap, err := rt.Status(h.ctx, id, bob)
		if !sameError(err, missingStatus) || !reflect.DeepEqual(snap, missingSnap) {
			h.t.Errorf("Status(%q) for a non-watcher = %+v, %v; want exactly what a missing id gives: %+v, %v", id, snap, err, missingSnap, missingStatus)
		}
		if err := rt.Cancel(h.ctx, id, bob); !sameError(err, missingCancel) {
			h.t.Errorf("Cancel(%q) for a non-watcher: error %v, want exactly what a missing id gives: %v", id, err, missingCancel)
		}
	}
	if ids := listed(h, rt, bob); len(ids) != 0 {
		h.t.Errorf("List for a non-watcher shows %q", ids)
	}

	if rec := h.stored(live.ID); rec.Status != workers.StatusRunning || rec.RunID != live.RunID {
		h.t.Errorf("after the non-watcher's cancel the record is %s under run %q, want RUNNING under %q", rec.Status, rec.RunID, live.RunID)
	}
	if reason := g.task.CancelCause(); reason != nil {
		h.t.Errorf("the non-watcher's Cancel cancelled the run: %v", reason)
	}
	g.open()
	h.wantEnded(h.settled(rt, live.ID), live.RunID, workers.StatusCompleted, "", nil)
}

// sameError reports whether two errors are indistinguishable to a
// caller: both nil, or both with the same message and the same sentinel.
func sameError(a, b error) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Error() == b.Error() && errors.Is(a, workers.ErrNotFound) == errors.Is(b, workers.ErrNotFound)
}
