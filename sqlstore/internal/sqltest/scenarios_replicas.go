package sqltest

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/taskgate/workers"
)

// The scenarios of several replicas sharing a store: leases, recovery,
// notices and deploys.

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

// The lease-stall scenario's numbers.
const (
	stallRuns  = 3
	stallLease = 100 * time.Millisecond // LeaseInterval of both sides; LeaseTTL is five of them
)

// stallParent checks a replica whose lease renewals stall. While it
// renews, the parent's recovery loop, running all along, never recovers
// its runs, over many rounds. Once its renewals block, its lease expires:
// the parent's loop recovers exactly its runs (FAILED, abandoned), the
// stalled replica cancels its callbacks with ErrAbandoned when it finds
// its lease lost, and their late results are fenced out: the recovered
// records do not change again.
func stallParent(p *parent) {
	t, ctx, s := p.t, p.ctx(), p.store()
	rt := p.runtime(s, workers.Config{LeaseInterval: stallLease})
	if err := rt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	pr := p.start(0)
	ids := make([]string, stallRuns)
	for i := range ids {
		ids[i] = pr.next("running", 1)[0]
	}
	// Six lease lifetimes, and so thirty rounds of the parent's recovery
	// loop, during which the child renews: nothing may be recovered.
	watch := time.NewTicker(10 * time.Millisecond)
	defer watch.Stop()
	for end := time.Now().Add(6 * 5 * stallLease); time.Now().Before(end); <-watch.C {
		for _, id := range ids {
			rec, err := s.GetTask(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if rec.Status != workers.StatusRunning {
				t.Fatalf("a live replica's run was recovered: %s is %s (%s)", id, rec.Status, rec.Error)
			}
		}
	}
	pr.send("stall")
	stalledAt := time.Now()
	eventually(t, "the stalled replica's runs are recovered", func() (bool, error) {
		for _, id := range ids {
			rec, err := s.GetTask(ctx, id)
			if err != nil || rec.Status == workers.StatusRunning {
				return false, err
			}
		}
		return true, nil
	})
	t.Logf("runs recovered %v after the renewals stalled (LeaseTTL %v, RecoverInterval %v)", time.Since(stalledAt), 5*stallLease, stallLease)
	recovered := make(map[string]workers.Record)
	for _, id := range ids {
		rec, err := s.GetTask(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Status != workers.StatusFailed || rec.Cause != workers.CauseAbandoned {
			t.Errorf("%s after recovery: %s %q (cause %s), want FAILED, abandoned", id, rec.Status, rec.Error, rec.Cause)
		}
		recovered[id] = rec
	}
	for range ids {
		if got := pr.next("interrupted", 1)[0]; got != word(workers.ErrAbandoned) {
			t.Errorf("a stalled replica's callback was cancelled with %s, want %s", got, word(workers.ErrAbandoned))
		}
	}
	pr.send("resume")
	pr.wait() // the child has shut down: every late write was tried
	for id, before := range recovered {
		after, err := s.GetTask(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if d := diffRecords(before, after); len(d) > 0 {
			t.Errorf("a late write of the stalled replica landed on %s: %s", id, strings.Join(d, "; "))
		}
	}
}

func stallChild(c *child, s workers.Store) {
	t := c.t
	g := leased(s)
	rt := c.runtime(g, workers.Config{LeaseInterval: stallLease})
	if err := rt.Start(c.ctx); err != nil {
		t.Fatal(err)
	}
	alice := workers.MustOwner("alice")
	returned := make(chan struct{}, stallRuns)
	for i := range stallRuns {
		_, err := rt.Submit(c.ctx, "stall-"+strconv.Itoa(i), func(ctx context.Context, task *workers.Task) (any, error) {
			defer func() { returned <- struct{}{} }()
			c.say("running", task.ID())
			<-ctx.Done()
			c.say("interrupted", word(context.Cause(ctx)))
			// A late result, as a callback that ignores its context
			// would return: it must not land.
			return map[string]string{"late": c.name()}, nil
		}, alice)
		if err != nil {
			t.Fatalf("Submit: %v", err)
		}
	}
	c.await("stall")
	resume := g.stallRenewals()
	for range stallRuns {
		recv(t, returned, "a callback returning")
	}
	c.await("resume")
	resume()
	c.shutdown(rt)
}
