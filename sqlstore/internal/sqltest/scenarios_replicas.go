package sqltest

import (
	"context"
	"slices"
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

// The three-replicas scenario's numbers.
const (
	replicas        = 3
	replicaRuns     = 2 // per replica
	replicaLease    = 100 * time.Millisecond
	replicaTTL      = 5 * replicaLease // the default LeaseTTL for it
	recoverySlack   = time.Second      // scheduling on a loaded machine
	replicaTaskBase = "replica-"
)

// replicaKey is the key of replica i's run j.
func replicaKey(i, j int) string { return replicaTaskBase + strconv.Itoa(i) + "-" + strconv.Itoa(j) }

// replicasParent runs three replicas with short leases, each running
// callbacks that wait to be released, and kills one with SIGKILL. The
// survivors' recovery loops, with no manual call, end exactly the dead
// replica's runs (FAILED, abandoned) within LeaseTTL plus one
// RecoverInterval (and some slack); no survivor's run is ever touched;
// the dead replica's keys run again; the survivors' runs then complete.
func replicasParent(p *parent) {
	t, ctx, s := p.t, p.ctx(), p.store()
	alice := workers.MustOwner("alice")
	procs := p.startAll(replicas)
	ids := make([][]string, replicas)
	for i, pr := range procs {
		for range replicaRuns {
			ids[i] = append(ids[i], pr.next("running", 1)[0])
		}
	}
	procs[0].kill()
	killedAt := time.Now()
	eventually(t, "the survivors recover the dead replica's runs", func() (bool, error) {
		for i, byReplica := range ids {
			for _, id := range byReplica {
				rec, err := s.GetTask(ctx, id)
				if err != nil {
					return false, err
				}
				if i > 0 && rec.Status != workers.StatusRunning {
					t.Fatalf("a live replica's run was recovered: %s is %s (%s)", id, rec.Status, rec.Error)
				}
				if i == 0 && rec.Status == workers.StatusRunning {
					return false, nil
				}
			}
		}
		return true, nil
	})
	took := time.Since(killedAt)
	t.Logf("the dead replica's runs were recovered %v after SIGKILL (LeaseTTL %v, RecoverInterval %v)", took, replicaTTL, replicaLease)
	if limit := replicaTTL + replicaLease + recoverySlack; took > limit {
		t.Errorf("recovery took %v, want within %v", took, limit)
	}
	for _, id := range ids[0] {
		rec, err := s.GetTask(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Status != workers.StatusFailed || rec.Cause != workers.CauseAbandoned {
			t.Errorf("%s after recovery: %s %q (cause %s), want FAILED, abandoned", id, rec.Status, rec.Error, rec.Cause)
		}
	}
	// The dead replica's keys run again, here.
	rt := p.runtime(s, workers.Config{LeaseInterval: replicaLease})
	for j := range replicaRuns {
		sub, err := rt.Submit(ctx, replicaKey(0, j), func(context.Context, *workers.Task) (any, error) { return "again", nil }, alice)
		if err != nil {
			t.Fatalf("resubmit a recovered key: %v", err)
		}
		if snap, err := rt.Wait(ctx, sub.ID, alice); err != nil || snap.Status != workers.StatusCompleted {
			t.Errorf("a recovered key's new run: %s, %v; want COMPLETED", snap.Status, err)
		}
	}
	for _, pr := range procs[1:] {
		pr.send("release")
	}
	for _, pr := range procs[1:] {
		pr.wait()
	}
	for _, byReplica := range ids[1:] {
		for _, id := range byReplica {
			if rec, err := s.GetTask(ctx, id); err != nil || rec.Status != workers.StatusCompleted {
				t.Errorf("a survivor's run %s: %s, %v; want COMPLETED", id, rec.Status, err)
			}
		}
	}
}

func replicasChild(c *child, s workers.Store) {
	t := c.t
	rt := c.runtime(s, workers.Config{LeaseInterval: replicaLease})
	if err := rt.Start(c.ctx); err != nil {
		t.Fatal(err)
	}
	alice := workers.MustOwner("alice")
	release := make(chan struct{})
	var subs []string
	for j := range replicaRuns {
		sub, err := rt.Submit(c.ctx, replicaKey(c.index, j), func(ctx context.Context, task *workers.Task) (any, error) {
			c.say("running", task.ID())
			select {
			case <-release:
				return c.name(), nil
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		}, alice)
		if err != nil {
			t.Fatalf("Submit: %v", err)
		}
		subs = append(subs, sub.ID)
	}
	c.await("release")
	close(release)
	for _, id := range subs {
		if snap, err := rt.Wait(c.ctx, id, alice); err != nil || snap.Status != workers.StatusCompleted {
			t.Errorf("Wait %s: %s %q, %v; want COMPLETED", id, snap.Status, snap.Error, err)
		}
	}
	c.shutdown(rt)
}

// The rolling-deploy scenario's tasks: how long each works, and the
// grace the old replica's Shutdown gives them.
var deployWork = []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond, time.Second}

const deployGrace = 3 * time.Second

// deployParent plays a rolling deploy. The old replica (the child) runs
// tasks of 0.1 to 1 s and one that would run for ever; the new replica
// (the parent's runtime, its recovery loop running) starts; the old one
// shuts down with a grace of 3 s. Every task that fits the grace ends
// COMPLETED, the endless one CANCELLED by the shutdown, none is lost or
// left live, and the new replica recovers none of the old one's runs
// during its drain.
func deployParent(p *parent) {
	t, ctx, s := p.t, p.ctx(), p.store()
	pr := p.start(0)
	var ids []string
	for range len(deployWork) + 1 {
		ids = append(ids, pr.next("running", 1)[0])
	}
	rt := p.runtime(s, workers.Config{LeaseInterval: replicaLease})
	if err := rt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	pr.send("shutdown")
	if got := pr.next("shutdown", 1)[0]; got != "nil" {
		t.Errorf("the old replica's Shutdown returned %s, want nil", got)
	}
	pr.wait()
	for _, id := range ids {
		rec, err := s.GetTask(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		// The runs started in any order; the key says which task it is.
		i, err := strconv.Atoi(id[strings.LastIndexByte(id, '-')+1:])
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case i < len(deployWork) && (rec.Status != workers.StatusCompleted || rec.Cause != workers.CauseCompleted):
			t.Errorf("a task of %v that fit the grace: %s %q (cause %s), want COMPLETED", deployWork[i], rec.Status, rec.Error, rec.Cause)
		case i == len(deployWork) && (rec.Status != workers.StatusCancelled || rec.Cause != workers.CauseShutdown):
			t.Errorf("the endless task: %s %q (cause %s), want CANCELLED by the shutdown", rec.Status, rec.Error, rec.Cause)
		}
	}
}

func deployChild(c *child, s workers.Store) {
	t := c.t
	rt := workers.NewRuntime(s, workers.Config{LeaseInterval: replicaLease, ShutdownGrace: deployGrace})
	if err := rt.Start(c.ctx); err != nil {
		t.Fatal(err)
	}
	alice := workers.MustOwner("alice")
	work := func(d time.Duration) workers.Func {
		return func(ctx context.Context, task *workers.Task) (any, error) {
			c.say("running", task.ID())
			if d < 0 {
				<-ctx.Done()
				return nil, context.Cause(ctx)
			}
			// The task's work, simulated: it takes d.
			done := time.NewTimer(d)
			defer done.Stop()
			select {
			case <-done.C:
				return d.String(), nil
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		}
	}
	for i, d := range append(slices.Clone(deployWork), -1) {
		if _, err := rt.Submit(c.ctx, "deploy-"+strconv.Itoa(i), work(d), alice); err != nil {
			t.Fatalf("Submit: %v", err)
		}
	}
	c.await("shutdown")
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	c.say("shutdown", word(rt.Shutdown(ctx)))
}
