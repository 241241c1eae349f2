package sqltest

import (
	"context"
	"strconv"
	"time"

	"github.com/taskgate/workers"
)

// noticeLimit bounds how long a cancel may take to reach a callback in
// another process once a store's notice can carry it: tens of
// milliseconds, with room for a loaded test machine.
const noticeLimit = time.Second

// pollingSync is the runtime's default SyncInterval over a store that
// leases but does not notify (workers.Config.SyncInterval).
const pollingSync = 2 * time.Second

// earlyCancelParent checks that a cancel written right after a runtime's
// Start, before its notice listener could hear it, still reaches the
// callback: over a notifying store the child holds its Listen back until
// the cancel has committed, so only the Resync that Listen sends once it
// listens can deliver it (the child has no sync loop). Over a store that
// does not notify, the child's sync loop delivers it within its interval.
func earlyCancelParent(p *parent) {
	t, ctx, s := p.t, p.ctx(), p.store()
	rt := p.runtime(s, workers.Config{})
	pr := p.start(0)
	id := pr.next("running", 1)[0]
	if err := rt.Cancel(ctx, id, workers.MustOwner("alice")); err != nil {
		t.Fatalf("Cancel from another process: %v", err)
	}
	cancelAt := time.Now()
	pr.send("listen")
	args := pr.next("interrupted", 2)
	if args[0] != word(workers.ErrCancelled) {
		t.Errorf("the callback's context was cancelled with %s, want %s", args[0], word(workers.ErrCancelled))
	}
	if at, err := strconv.ParseInt(args[1], 10, 64); err != nil {
		t.Fatal(err)
	} else if latency := time.Unix(0, at).Sub(cancelAt); latency > noticeLimit {
		t.Errorf("the cancel reached the callback %v after the listener was let start, want within %v", latency, noticeLimit)
	}
	if got := pr.next("final", 1)[0]; got != string(workers.StatusCancelled) {
		t.Errorf("the running process reads the task back as %s, want CANCELLED", got)
	}
	pr.wait()
}

func earlyCancelChild(c *child, s workers.Store) {
	t := c.t
	store, open, cfg := s, func() {}, workers.Config{}
	if _, ok := s.(workers.Notifier); ok {
		g := gatedListen(s)
		store, open = g, g.openListen
	} else {
		cfg.SyncInterval = 20 * time.Millisecond
	}
	rt := c.runtime(store, cfg)
	if err := rt.Start(c.ctx); err != nil {
		t.Fatal(err)
	}
	alice := workers.MustOwner("alice")
	returned := make(chan struct{})
	sub, err := rt.Submit(c.ctx, cancelKey, func(ctx context.Context, task *workers.Task) (any, error) {
		defer close(returned)
		c.say("running", task.ID())
		<-ctx.Done()
		c.say("interrupted", word(context.Cause(ctx)), time.Now().UnixNano())
		return nil, context.Cause(ctx)
	}, alice)
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	c.await("listen")
	open()
	recv(t, returned, "the callback returning")
	c.shutdown(rt)
	snap, err := rt.Status(c.ctx, sub.ID, alice)
	if err != nil {
		t.Fatal(err)
	}
	c.say("final", snap.Status)
}

// isNotifier reports whether s sends notices between processes.
func isNotifier(s workers.Store) bool {
	_, ok := s.(workers.Notifier)
	return ok
}
