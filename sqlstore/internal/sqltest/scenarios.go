package sqltest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// scenarios are the multi-process tests RunProcesses runs. A scenario's
// name is also the role its children play.
var scenarios = []scenario{
	{"JoinsFromManyProcessesKeepEveryGrant", joinsParent, joinsChild},
	{"RerunsFromManyProcessesStartOneRun", rerunsParent, rerunsChild},
	{"KilledReplicaRecoveredBySurvivors", killedParent, killedChild},
	{"CancelFromAnotherProcess", cancelParent, cancelChild},
	{"CancelRightAfterStartIsDelivered", earlyCancelParent, earlyCancelChild},
}

// The joins scenario's numbers and names.
const (
	joinProcs     = 4
	joinMinGrants = 20 // per process, at least
	joinKey       = "shared-index"
	joinHolder    = "the-parent"      // the instance that holds the run, by its lease
	joinRun       = joinHolder + ".1" // a run id of that instance
)

// holdLease gives instance a live lease for the scenario's length, so
// that the runs the parent writes for it count as alive.
func holdLease(p *parent, s workers.Store, instance string) {
	if l, ok := s.(workers.Leaser); ok {
		if _, err := l.RenewLease(p.ctx(), instance, waitLimit); err != nil {
			p.t.Fatal(err)
		}
	}
}

func grantee(proc, n int) string { return "p" + strconv.Itoa(proc) + "-u" + strconv.Itoa(n) }

// joinsParent checks that several processes joining one live global
// task at once, each as many owners as its watch authorizer lets in, lose
// no grant. Each child keeps joining until it has seen a grant of every
// other child on the record, so the appends provably interleave.
func joinsParent(p *parent) {
	t, ctx, s := p.t, p.ctx(), p.store()
	holdLease(p, s, joinHolder)
	at := stamp()
	rec := workers.Record{ID: joinKey, RunID: joinRun, Watchers: []string{"owner"}, CreatedAt: at,
		State: workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: at}}
	if err := s.InsertTask(ctx, rec); err != nil {
		t.Fatal(err)
	}
	procs := p.startAll(joinProcs)
	for _, pr := range procs {
		pr.next("ready", 0)
	}
	for _, pr := range procs {
		pr.send("go")
	}
	want := slices.Clone(rec.Watchers)
	for i, pr := range procs {
		n, err := strconv.Atoi(pr.next("granted", 1)[0])
		if err != nil {
			t.Fatal(err)
		}
		for j := range n {
			want = append(want, grantee(i, j))
		}
	}
	for _, pr := range procs {
		pr.wait()
	}
	got, err := s.GetTask(ctx, joinKey)
	if err != nil {
		t.Fatal(err)
	}
	if got.RunID != joinRun || got.Status != workers.StatusRunning {
		t.Errorf("the joins changed the record: run %q, %s; want run %q, RUNNING", got.RunID, got.Status, joinRun)
	}
	if lost := missing(want, got.Watchers); len(lost) > 0 {
		t.Errorf("%d of %d grants were lost: %q", len(lost), len(want), lost)
	}
	if extra := missing(got.Watchers, want); len(extra) > 0 {
		t.Errorf("watchers nobody granted: %q", extra)
	}
	if len(got.Watchers) != len(want) {
		t.Errorf("the record lists %d watchers for %d distinct grants", len(got.Watchers), len(want))
	}
}

func joinsChild(c *child, s workers.Store) {
	t := c.t
	s.SetWatchAuthorizer(func(string, []string, string) bool { return true })
	rt := c.runtime(s, workers.Config{})
	never := func(context.Context, *workers.Task) (any, error) {
		return nil, errors.New("a join must not start a run")
	}
	c.say("ready")
	c.await("go")
	n := 0
	for seen := false; n < joinMinGrants || !seen; n++ {
		if c.ctx.Err() != nil {
			t.Fatalf("after %d grants, the record still lacks a grant from some other process", n)
		}
		owner := workers.MustOwner(grantee(c.index, n))
		sub, err := rt.Submit(c.ctx, joinKey, never, owner, workers.WithScope(workers.ScopeGlobal))
		if err != nil {
			t.Fatalf("grant %d: Submit: %v", n, err)
		}
		if !sub.Joined || sub.RunID != joinRun {
			t.Fatalf("grant %d: Submit = %+v, want a join of run %q", n, sub, joinRun)
		}
		rec, err := s.GetTask(c.ctx, joinKey)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(rec.Watchers, owner.ID()) {
			t.Fatalf("grant %d: %s joined, and is not among the watchers read back", n, owner.ID())
		}
		seen = true
		for j := range joinProcs {
			mark := "p" + strconv.Itoa(j) + "-"
			if j != c.index && !slices.ContainsFunc(rec.Watchers, func(w string) bool { return strings.HasPrefix(w, mark) }) {
				seen = false
			}
		}
	}
	c.say("granted", n)
	c.shutdown(rt)
}

// The re-runs scenario's numbers and names.
const (
	rerunProcs = 4
	rerunKey   = "nightly-report"
	rerunID    = "alice::" + rerunKey
	rerunOld   = "run-finished-before"
)

// rerunsParent checks that several processes submitting the same
// finished key at once start exactly one run: one child replaces the
// record, and the others find that run live and join it, since it blocks
// until every child has submitted. Only that run's terminal write lands.
func rerunsParent(p *parent) {
	t, ctx, s := p.t, p.ctx(), p.store()
	at := stamp()
	old := workers.Record{ID: rerunID, RunID: rerunOld, Watchers: []string{"alice"}, CreatedAt: at,
		State: workers.State{Status: workers.StatusCompleted, Progress: 100, Attempt: 1,
			Result: json.RawMessage(`{"by":"before"}`), StartedAt: at, CompletedAt: at}}
	if err := s.InsertTask(ctx, old); err != nil {
		t.Fatal(err)
	}
	procs := p.startAll(rerunProcs)
	for _, pr := range procs {
		pr.next("ready", 0)
	}
	for _, pr := range procs {
		pr.send("go")
	}
	winner, run := -1, ""
	for i, pr := range procs {
		args := pr.next("submitted", 2) // run id, joined
		switch {
		case run == "":
			run = args[0]
		case args[0] != run:
			t.Errorf("%s's submission is run %q, another's %q: two live runs of one key", pr.name, args[0], run)
		}
		if args[1] == "false" {
			if winner >= 0 {
				t.Errorf("both %s and %s started a new run", procs[winner].name, pr.name)
			}
			winner = i
		}
	}
	if winner < 0 {
		t.Fatalf("every submission joined run %q; none started it", run)
	}
	if t.Failed() {
		t.FailNow()
	}
	if run == rerunOld {
		t.Fatalf("the submissions joined the finished run %q", rerunOld)
	}
	if got := procs[winner].next("started", 1)[0]; got != run {
		t.Errorf("%s executed run %q, want %q", procs[winner].name, got, run)
	}
	if rec, err := s.GetTask(ctx, rerunID); err != nil || rec.RunID != run || rec.Status != workers.StatusRunning {
		t.Errorf("while the run blocks, GetTask = run %q, %s, %v; want run %q RUNNING", rec.RunID, rec.Status, err, run)
	}
	for _, pr := range procs {
		pr.send("release")
	}
	for i, pr := range procs {
		pr.wait()
		if i != winner && pr.said("started") {
			t.Errorf("%s executed a run too", pr.name)
		}
	}
	got, err := s.GetTask(ctx, rerunID)
	if err != nil {
		t.Fatal(err)
	}
	var res map[string]string
	if err := json.Unmarshal(got.Result, &res); err != nil {
		t.Fatalf("result %s: %v", got.Result, err)
	}
	if got.RunID != run || got.Status != workers.StatusCompleted || res["by"] != "child-"+strconv.Itoa(winner) {
		t.Errorf("final record: run %q, %s, result %s; want run %q COMPLETED by child-%d", got.RunID, got.Status, got.Result, run, winner)
	}
	if !slices.Equal(got.Watchers, []string{"alice"}) {
		t.Errorf("final watchers %q, want [alice]", got.Watchers)
	}
}

func rerunsChild(c *child, s workers.Store) {
	t := c.t
	rt := c.runtime(s, workers.Config{})
	alice := workers.MustOwner("alice")
	release, returned := make(chan struct{}), make(chan struct{})
	c.say("ready")
	c.await("go")
	sub, err := rt.Submit(c.ctx, rerunKey, func(ctx context.Context, task *workers.Task) (any, error) {
		defer close(returned)
		c.say("started", task.RunID())
		select {
		case <-release:
			return map[string]string{"by": c.name()}, nil
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}, alice)
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	if sub.ID != rerunID {
		t.Fatalf("Submit returned id %q, want %q", sub.ID, rerunID)
	}
	c.say("submitted", sub.RunID, sub.Joined)
	c.await("release")
	close(release)
	if !sub.Joined {
		recv(t, returned, "the run's callback returning")
	}
	c.shutdown(rt)
}

// killedLive counts the RUNNING and PENDING records the killed child
// leaves.
const killedLive = 5

// killedParent runs three replicas: it kills one with SIGKILL while its
// runs execute and a queue item waits behind one of them, and checks that
// the survivors' recovery loops (and a runtime the parent starts) recover,
// once the dead replica's lease has expired and with no manual call,
// exactly the records the dead process left PENDING or RUNNING: FAILED,
// as abandoned, with no other field of them and no other record changed,
// and their keys runnable again. The survivors' own runs, live all along,
// are never recovered, however many rounds the loops make.
func killedParent(p *parent) {
	t, ctx, s := p.t, p.ctx(), p.store()
	at := stamp().Add(-time.Hour)
	for _, rec := range []workers.Record{
		{ID: "carol::done", RunID: "run-c1", Watchers: []string{"carol", "dave"}, CreatedAt: at,
			State: workers.State{Status: workers.StatusCompleted, Progress: 100, Attempt: 1,
				Result: json.RawMessage(`{"rows":7}`), StartedAt: at, CompletedAt: at.Add(time.Minute)}},
		{ID: "carol::failed", RunID: "run-c2", Queue: "exports", Watchers: []string{"carol"}, CreatedAt: at,
			State: workers.State{Status: workers.StatusFailed, Progress: 30, Attempt: 3, Error: "disk full",
				StartedAt: at, CompletedAt: at.Add(2 * time.Minute)}},
		{ID: "carol::cancelled", RunID: "run-c3", Watchers: []string{"carol"}, CreatedAt: at,
			State: workers.State{Status: workers.StatusCancelled, Progress: 60, Attempt: 1, Error: "Cancelled by user",
				StartedAt: at, CompletedAt: at.Add(3 * time.Minute)}},
		{ID: "nightly-vacuum", RunID: "run-s1", CreatedAt: at,
			State: workers.State{Status: workers.StatusCancelled, Error: "Cancelled by worker shutdown", CompletedAt: at}},
	} {
		if err := s.InsertTask(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	pr := p.start(0)
	live := pr.next("ready", killedLive)
	survivors := []*proc{p.start(1), p.start(2)}
	var kept []string
	for _, sv := range survivors {
		kept = append(kept, sv.next("ready", killedKept)...)
	}
	before := records(t, ctx, s)
	for _, id := range live {
		if st := before[id].Status; st != workers.StatusRunning && st != workers.StatusPending {
			t.Fatalf("the child reported %q live, and the store says %q", id, st)
		}
	}
	killed := stamp()
	pr.kill()
	if diffs := diffAll(before, records(t, ctx, s)); len(diffs) > 0 {
		t.Fatalf("records changed between the child's report and its death: %q", diffs)
	}

	rt := p.runtime(s, workers.Config{LeaseInterval: killedLease})
	if err := rt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the recovery loops end the dead child's records", func() (bool, error) {
		recs := records(t, ctx, s)
		for _, id := range live {
			if !recs[id].Status.Terminal() {
				return false, nil
			}
		}
		return true, nil
	})
	t.Logf("recovered %v after the kill (lease TTL %v, interval %v)", time.Since(killed), 5*killedLease, killedLease)
	// Twenty more rounds of every loop: the survivors keep their runs.
	for range 20 {
		time.Sleep(killedLease) // not a wait for a condition: rounds of the loops
		recs := records(t, ctx, s)
		for _, id := range kept {
			if recs[id].Status != workers.StatusRunning {
				t.Fatalf("the live survivor's %s is %s, want RUNNING", id, recs[id].Status)
			}
		}
	}
	for _, sv := range survivors {
		sv.send("stop")
	}
	for _, sv := range survivors {
		sv.wait()
	}
	after := records(t, ctx, s)
	if len(after) != len(before) {
		t.Errorf("%d records before recovery, %d after", len(before), len(after))
	}
	zombies := 0
	for _, id := range slices.Sorted(maps.Keys(before)) {
		b, a := before[id], after[id]
		if slices.Contains(kept, id) {
			continue // the survivors' runs, ended by their own shutdown
		}
		if b.Status.Terminal() {
			if d := diffRecords(b, a); len(d) > 0 {
				t.Errorf("recovery changed finished record %s: %s", id, strings.Join(d, "; "))
			}
			continue
		}
		zombies++
		if !slices.Contains(live, id) {
			t.Errorf("%s was %s, and the dead child did not own it", id, b.Status)
		}
		snap, err := rt.Status(ctx, id, workers.System)
		if err != nil {
			t.Fatal(err)
		}
		if a.Status != workers.StatusFailed || !errors.Is(snap.Err(), workers.ErrAbandoned) {
			t.Errorf("%s after recovery: %s, %v; want FAILED, abandoned", id, a.Status, snap.Err())
		}
		if a.CompletedAt.Before(killed) {
			t.Errorf("%s after recovery: completed at %v, before the kill at %v", id, a.CompletedAt, killed)
		}
		want := b
		want.Status, want.Error, want.Cause, want.CompletedAt = a.Status, a.Error, a.Cause, a.CompletedAt
		if d := diffRecords(want, a); len(d) > 0 {
			t.Errorf("recovery of %s changed more than its outcome: %s", id, strings.Join(d, "; "))
		}
	}
	if zombies != killedLive {
		t.Errorf("%d records were live before recovery, want the child's %d", zombies, killedLive)
	}
	if n, err := rt.RecoverZombies(ctx); n != 0 || err != nil {
		t.Errorf("a second recovery = %d, %v; want 0, nil", n, err)
	}

	// The recovered key is no longer blocked: it runs again.
	alice := workers.MustOwner("alice")
	sub, err := rt.Submit(ctx, "block-0", func(context.Context, *workers.Task) (any, error) {
		return map[string]bool{"again": true}, nil
	}, alice)
	if err != nil || sub.Joined || sub.RunID == before[sub.ID].RunID {
		t.Fatalf("re-submitting a recovered key = %+v, %v; want a new run", sub, err)
	}
	eventually(t, "the re-run completes", func() (bool, error) {
		snap, err := rt.Status(ctx, sub.ID, alice)
		return snap.Status == workers.StatusCompleted, err
	})
}

// killedLease is the lease interval of the killed scenario's runtimes:
// the child's lease expires five of them after the kill.
const killedLease = 200 * time.Millisecond

// killedKept counts the runs each surviving replica keeps live.
const killedKept = 2

func killedChild(c *child, s workers.Store) {
	if c.index > 0 {
		survivorChild(c, s)
		return
	}
	t := c.t
	rt := c.runtime(s, workers.Config{LeaseInterval: killedLease})
	alice, bob := workers.MustOwner("alice"), workers.MustOwner("bob")
	blocked := func(progress int) workers.Func {
		return func(ctx context.Context, task *workers.Task) (any, error) {
			task.SetProgress(progress)
			<-ctx.Done() // until the kill; or Shutdown, if the parent vanished
			return nil, context.Cause(ctx)
		}
	}
	submit := func(queue, key string, fn workers.Func, who workers.Owner, opts ...workers.SubmitOption) string {
		var sub workers.Submission
		var err error
		if queue == "" {
			sub, err = rt.Submit(c.ctx, key, fn, who, opts...)
		} else {
			sub, err = rt.SubmitSequential(c.ctx, queue, key, fn, who, opts...)
		}
		if err != nil {
			t.Fatalf("submit %s: %v", key, err)
		}
		return sub.ID
	}
	done := submit("", "done-before-the-kill", func(context.Context, *workers.Task) (any, error) {
		return map[string]bool{"ok": true}, nil
	}, alice)
	want := map[string]workers.Status{done: workers.StatusCompleted}
	progress := map[string]int{} // what the running callbacks set
	var live []string
	for i := range 3 {
		id := submit("", "block-"+strconv.Itoa(i), blocked(10*(i+1)), alice, workers.WithWatchers(bob))
		want[id], progress[id] = workers.StatusRunning, 10*(i+1)
		live = append(live, id)
	}
	running := submit("exports", "export-1", blocked(50), bob)
	waiting := submit("exports", "export-2", blocked(0), bob)
	want[running], want[waiting], progress[running] = workers.StatusRunning, workers.StatusPending, 50
	live = append(live, running, waiting)
	// Until the records say so too: the runs' progress is written a
	// moment after they set it (Config.ProgressInterval), and no write
	// may land between the report below and the kill.
	eventually(t, "every task is where the scenario wants it, in its record too", func() (bool, error) {
		for id, st := range want {
			snap, err := rt.Status(c.ctx, id, workers.System)
			if err != nil || snap.Status != st {
				return false, err
			}
			rec, err := s.GetTask(c.ctx, id)
			if err != nil || rec.Status != st || rec.Progress != progress[id] && st == workers.StatusRunning {
				return false, err
			}
		}
		return true, nil
	})
	c.say("ready", strings.Join(live, " "))
	c.read() // the parent kills this process while it waits here
	t.Errorf("stdin closed: the parent is gone without killing this process")
}

// survivorChild is a replica that survives the kill: it starts its
// loops, keeps killedKept runs live until the parent says stop, and shuts
// down.
func survivorChild(c *child, s workers.Store) {
	t := c.t
	// No grace at shutdown: the runs wait for nothing but their cancel.
	// Only the killed child's lease must end soon; a survivor's is
	// longer than the default five intervals, so that on a loaded
	// machine a slow renewal does not cost it its runs, which is not
	// what the scenario is about.
	rt := c.runtime(s, workers.Config{LeaseInterval: killedLease, LeaseTTL: 15 * killedLease, ShutdownGrace: -1})
	if err := rt.Start(c.ctx); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range killedKept {
		sub, err := rt.Submit(c.ctx, "survivor-"+strconv.Itoa(c.index)+"-"+strconv.Itoa(i), func(ctx context.Context, _ *workers.Task) (any, error) {
			<-ctx.Done()
			return nil, context.Cause(ctx)
		}, workers.MustOwner("erin"))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sub.ID)
	}
	eventually(t, "the survivor's runs start", func() (bool, error) {
		for _, id := range ids {
			snap, err := rt.Status(c.ctx, id, workers.System)
			if err != nil || snap.Status != workers.StatusRunning {
				return false, err
			}
		}
		return true, nil
	})
	c.say("ready", strings.Join(ids, " "))
	if cmd := c.read(); cmd != "stop" {
		t.Fatalf("read %q from the parent, want stop", cmd)
	}
	c.shutdown(rt)
}

// cancelKey is the task the cancel scenario's child runs.
const cancelKey = "long-export"

// cancelParent checks that a process that did not submit a task serves
// its status and its cancel, with the same authorization as the process
// that runs it. The cancel lands in the record at once and reaches the
// callback in the child with no configuration: through the store's
// notices where it has them, its sync loop otherwise. The callback
// returns a result anyway, and that late write is fenced out.
func cancelParent(p *parent) {
	t, ctx, s := p.t, p.ctx(), p.store()
	rt := p.runtime(s, workers.Config{})
	alice, bob, mallory := workers.MustOwner("alice"), workers.MustOwner("bob"), workers.MustOwner("mallory")
	pr := p.start(0)
	args := pr.next("running", 2)
	id, run := args[0], args[1]

	for _, who := range []workers.Owner{alice, bob} {
		snap, err := rt.Status(ctx, id, who)
		if err != nil {
			t.Fatalf("Status as %s: %v", who.ID(), err)
		}
		// Progress is stored with a run's transitions and by its sync
		// loop, so another process reads 0 or the value set.
		if snap.ID != id || snap.RunID != run || snap.Status != workers.StatusRunning || snap.Attempt != 1 ||
			snap.StartedAt.IsZero() || !snap.CompletedAt.IsZero() || snap.Error != "" || snap.Result != nil ||
			snap.Queue != "" || snap.WatcherCount != 2 || (snap.Progress != 0 && snap.Progress != 60) {
			t.Errorf("Status as %s from another process = %+v; want run %q RUNNING, attempt 1, 2 watchers", who.ID(), snap, run)
		}
	}
	if _, err := rt.Status(ctx, id, mallory); !errors.Is(err, workers.ErrNotFound) {
		t.Errorf("Status as a foreign owner: %v, want ErrNotFound", err)
	}
	if err := rt.Cancel(ctx, id, mallory); !errors.Is(err, workers.ErrNotFound) {
		t.Errorf("Cancel as a foreign owner: %v, want ErrNotFound", err)
	}
	if rec, err := s.GetTask(ctx, id); err != nil || rec.Status != workers.StatusRunning {
		t.Fatalf("after a foreign owner's cancel: %s, %v; want RUNNING", rec.Status, err)
	}

	cancelAt := time.Now()
	if err := rt.Cancel(ctx, id, alice); err != nil {
		t.Fatalf("Cancel as the owner, from another process: %v", err)
	}
	snap, err := rt.Status(ctx, id, alice)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Status != workers.StatusCancelled || snap.Error != "Cancelled by user" ||
		!errors.Is(snap.Err(), workers.ErrCancelled) || snap.RunID != run || snap.CompletedAt.IsZero() {
		t.Errorf("right after the cancel: %+v; want run %q CANCELLED by user", snap, run)
	}
	if err := rt.Cancel(ctx, id, bob); !errors.Is(err, workers.ErrFinished) {
		t.Errorf("a second cancel: %v, want ErrFinished", err)
	}
	cancelled, err := s.GetTask(ctx, id)
	if err != nil {
		t.Fatal(err)
	}

	interrupted := pr.next("interrupted", 2)
	if got, want := interrupted[0], word(workers.ErrCancelled); got != want {
		t.Errorf("the callback's context was cancelled with %s, want %s", got, want)
	}
	if at, err := strconv.ParseInt(interrupted[1], 10, 64); err != nil {
		t.Fatal(err)
	} else if latency := time.Unix(0, at).Sub(cancelAt); !isNotifier(s) {
		t.Logf("cancel to callback, across processes, by the sync loop: %v", latency)
		if limit := pollingSync + noticeLimit; latency > limit {
			t.Errorf("the cancel reached the callback after %v, want within the sync interval (%v) and some slack", latency, pollingSync)
		}
	} else {
		// Same host, same clock: the child's timestamp is comparable.
		t.Logf("cancel to callback, across processes, by a notice: %v", latency)
		if latency > noticeLimit {
			t.Errorf("the cancel reached the callback after %v, want within %v", latency, noticeLimit)
		}
	}
	pr.send("release")
	if got := pr.next("final", 1)[0]; got != string(workers.StatusCancelled) {
		t.Errorf("the running process reads the task back as %s, want CANCELLED", got)
	}
	pr.wait()
	final, err := s.GetTask(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if d := diffRecords(cancelled, final); len(d) > 0 {
		t.Errorf("the run's own terminal write landed on the cancelled record: %s", strings.Join(d, "; "))
	}
}

func cancelChild(c *child, s workers.Store) {
	t := c.t
	rt := c.runtime(s, workers.Config{})
	alice, bob := workers.MustOwner("alice"), workers.MustOwner("bob")
	release, returned := make(chan struct{}), make(chan struct{})
	sub, err := rt.Submit(c.ctx, cancelKey, func(ctx context.Context, task *workers.Task) (any, error) {
		defer close(returned)
		task.SetProgress(60)
		c.say("running", task.ID(), task.RunID())
		<-ctx.Done()
		c.say("interrupted", word(context.Cause(ctx)), time.Now().UnixNano())
		<-release // a callback that finishes its work regardless
		return map[string]string{"by": c.name()}, nil
	}, alice, workers.WithWatchers(bob))
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	if cmd := c.read(); cmd != "release" {
		t.Fatalf("read %q from the parent, want release", cmd)
	}
	close(release)
	recv(t, returned, "the callback returning")
	c.shutdown(rt) // waits for the run's terminal write
	snap, err := rt.Status(c.ctx, sub.ID, alice)
	if err != nil {
		t.Fatal(err)
	}
	c.say("final", snap.Status)
}

// word renders an error as one word for a message.
func word(err error) string {
	if err == nil {
		return "nil"
	}
	return strings.ReplaceAll(err.Error(), " ", "_")
}

// records returns every record in s by id.
func records(t testing.TB, ctx context.Context, s workers.Store) map[string]workers.Record {
	t.Helper()
	recs, err := s.ListTasks(ctx, workers.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	m := make(map[string]workers.Record, len(recs))
	for _, r := range recs {
		m[r.ID] = r
	}
	return m
}

// diffAll describes how two sets of records differ.
func diffAll(a, b map[string]workers.Record) []string {
	var out []string
	for _, id := range slices.Sorted(maps.Keys(a)) {
		r, ok := b[id]
		if !ok {
			out = append(out, id+": gone")
			continue
		}
		for _, d := range diffRecords(a[id], r) {
			out = append(out, id+": "+d)
		}
	}
	for id := range b {
		if _, ok := a[id]; !ok {
			out = append(out, id+": appeared")
		}
	}
	return out
}

// diffRecords names every field in which a and b differ. Watchers are a
// set; times compare as instants.
func diffRecords(a, b workers.Record) []string {
	var out []string
	field := func(name string, equal bool, x, y any) {
		if !equal {
			out = append(out, fmt.Sprintf("%s %v -> %v", name, x, y))
		}
	}
	wa, wb := slices.Sorted(slices.Values(a.Watchers)), slices.Sorted(slices.Values(b.Watchers))
	field("ID", a.ID == b.ID, a.ID, b.ID)
	field("RunID", a.RunID == b.RunID, a.RunID, b.RunID)
	field("Queue", a.Queue == b.Queue, a.Queue, b.Queue)
	field("Watchers", slices.Equal(wa, wb), wa, wb)
	field("CreatedAt", a.CreatedAt.Equal(b.CreatedAt), a.CreatedAt, b.CreatedAt)
	field("Status", a.Status == b.Status, a.Status, b.Status)
	field("Progress", a.Progress == b.Progress, a.Progress, b.Progress)
	field("Attempt", a.Attempt == b.Attempt, a.Attempt, b.Attempt)
	field("Result", bytes.Equal(a.Result, b.Result), string(a.Result), string(b.Result))
	field("Error", a.Error == b.Error, a.Error, b.Error)
	field("StartedAt", a.StartedAt.Equal(b.StartedAt), a.StartedAt, b.StartedAt)
	field("CompletedAt", a.CompletedAt.Equal(b.CompletedAt), a.CompletedAt, b.CompletedAt)
	return out
}

// missing returns the elements of want that got lacks.
func missing(want, got []string) []string {
	var out []string
	for _, w := range want {
		if !slices.Contains(got, w) {
			out = append(out, w)
		}
	}
	return out
}

// stamp is the time now as the stores keep it: UTC, to the microsecond.
func stamp() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }
