package sqltest

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// The soak scenario, SoakOfRestartsAndCancels: three runtimes, each over
// a store handle of its own, share one database for a few seconds of
// load. Tasks of several kinds (quick, long, with progress, failing,
// timing out, retried, and callbacks that ignore their context for a
// while) are submitted for several owners, on their own or on sequential
// queues; some keys are submitted twice, so that the second submission
// joins the live run or re-runs the finished one. Some tasks are
// cancelled, and some waited for, through a runtime other than the one
// that took them. About every second one runtime is replaced: the new
// one starts, then the old one shuts down with a short bound. If the
// backend has a Fault, it is injected about every 800ms.
//
// At the end every runtime shuts down, a fresh runtime recovers what the
// others left once their leases expire, and the scenario checks that:
// every record is terminal; no run executed the same attempt twice; a
// key was executed by no more runs than the submissions of it that did
// not join one; a record is COMPLETED only if its run's callback returned
// a result (or ignored a shutdown's cancel, which lets it complete); a
// Cancel that returned nil left the record CANCELLED, cancelled by its
// caller with the reason given; and every Wait returned the task's
// terminal record.
//
// The load lasts soakDefault; WORKERS_SOAK_DURATION, a Go duration
// ("1m"), lengthens it for a run by hand. The random choices come from a
// source seeded with the test's name, logged; the timing of the machine
// is not reproducible, so neither is the interleaving.
const soakDurationEnv = "WORKERS_SOAK_DURATION"

const (
	soakDefault  = 5 * time.Second
	soakPace     = 15 * time.Millisecond        // between submissions
	soakRestart  = time.Second                  // between runtime replacements
	soakBound    = 400 * time.Millisecond       // a replaced runtime's Shutdown
	soakFaultGap = 800 * time.Millisecond       // between faults
	soakSettle   = 2 * time.Second              // the final Shutdowns' bound
	soakRecover  = waitLimit + 2*soakLeaseTTL   // the final recovery's bound
	soakLeaseTTL = 2 * time.Second              // the runtimes' lease
	soakStubborn = 200 * time.Millisecond       // least time a stubborn callback runs
	soakLongest  = 1200 * time.Millisecond      // longest a callback runs
	soakQueueSep = "-q"                         // a sequential queue's name is owner+soakQueueSep
	soakFailMsg  = "soak: this task fails"      // a failing callback's error
	soakRetryMsg = "soak: this attempt fails"   // a retried callback's error before its last attempt
	soakReason   = "soak: cancelled on purpose" // a Cancel's reason, with the task's id
)

// soakOwners are the tasks' owners.
var soakOwners = []string{"o0", "o1", "o2", "o3"}

// soakKinds are the kinds of task, drawn uniformly: ok is the commonest.
var soakKinds = []string{"ok", "ok", "ok", "long", "progress", "fail", "timeout", "retry", "stubborn"}

// soakPlan is one submission, drawn before it is made.
type soakPlan struct {
	n       int
	key     string
	kind    string
	owner   workers.Owner
	seq     bool          // on the owner's sequential queue
	twice   bool          // submitted a second time, by another runtime
	slot    int           // the runtime that submits it
	other   int           // the runtime that cancels it or waits for it
	cancel  bool          // cancelled after after
	wait    bool          // waited for
	after   time.Duration // before the cancel, or the second submission
	run     time.Duration // how long the callback works
	timeout time.Duration // for kind timeout
}

// soakExec is what the callbacks of one run did.
type soakExec struct {
	key, kind string
	attempts  []int // every attempt that started, in order
	results   int   // returns of a result with the context still live
	late      bool  // a stubborn return of a result after a shutdown's cancel
	ignored   []error
}

type soakSub struct {
	plan   soakPlan
	id     string
	runID  string
	joined bool
}

type soakCancel struct {
	id, reason string
	by         workers.Owner
	err        error
}

type soakWait struct {
	id   string
	snap workers.Snapshot
	err  error
}

// soakSlot holds the runtime now serving one of the three places.
type soakSlot struct {
	mu sync.Mutex
	rt *workers.Runtime[workers.Store]
}

func (sl *soakSlot) get() *workers.Runtime[workers.Store] {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	return sl.rt
}

type soakRun struct {
	t    *testing.T
	open Opener
	cfg  workers.Config
	ctx  context.Context // ends when the load does

	slots [3]soakSlot

	mu       sync.Mutex
	execs    map[string]*soakExec // by run id
	subs     []soakSub
	subErrs  map[string]int
	cancels  []soakCancel
	waits    []soakWait
	all      []*workers.Runtime[workers.Store] // every runtime started
	restarts int
	faults   int
}

// soakDuration returns how long the load lasts.
func soakDuration(t *testing.T) time.Duration {
	d := soakDefault
	if v := os.Getenv(soakDurationEnv); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a positive Go duration", soakDurationEnv, v)
		}
	}
	return d
}

// soakOfRestartsAndCancels is the soak scenario (see soakDurationEnv);
// fault, if not nil, injects one fault.
func soakOfRestartsAndCancels(t *testing.T, open Opener, fault func(ctx context.Context)) {
	dur := soakDuration(t)
	h := fnv.New64a()
	h.Write([]byte(t.Name()))
	seed := h.Sum64()
	t.Logf("seed %d (from the test's name), load for %v, faults %v", seed, dur, fault != nil)
	r := rand.New(rand.NewPCG(seed, 0))

	s := &soakRun{
		t:    t,
		open: open,
		cfg: workers.Config{
			LeaseInterval:   100 * time.Millisecond,
			LeaseTTL:        soakLeaseTTL,
			RecoverInterval: 200 * time.Millisecond,
			Logger:          slog.New(slog.DiscardHandler),
		},
		execs:   map[string]*soakExec{},
		subErrs: map[string]int{},
	}
	for i := range s.slots {
		rt := s.start(t.Context())
		if rt == nil {
			t.Fatal("the first runtimes did not start")
		}
		s.slots[i].rt = rt
	}

	ctx, stop := context.WithTimeout(t.Context(), dur)
	defer stop()
	s.ctx = ctx
	var load, waits sync.WaitGroup
	restartSeed := r.Uint64()
	load.Go(func() { s.restartEvery(restartSeed) })
	if fault != nil {
		load.Go(func() {
			tick := time.NewTicker(soakFaultGap)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
					fault(ctx)
					s.mu.Lock()
					s.faults++
					s.mu.Unlock()
				}
			}
		})
	}
	tick := time.NewTicker(soakPace)
	for n := 0; ctx.Err() == nil; n++ {
		p := s.plan(r, n)
		load.Go(func() { s.submit(p, &waits) })
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
	tick.Stop()
	load.Wait()

	// Every runtime shuts down, then a fresh one recovers what they left.
	var downs sync.WaitGroup
	for i := range s.slots {
		rt := s.slots[i].get()
		downs.Go(func() { s.shutdown(rt, soakSettle, fmt.Sprintf("runtime %d at the end", i)) })
	}
	downs.Wait()
	rec := s.start(t.Context())
	if rec == nil {
		t.Fatal("the recovering runtime did not start")
	}
	st, closeStore, err := open(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeStore)
	live := []workers.Status{workers.StatusPending, workers.StatusRunning}
	var left []workers.Record // check reports those still live
	tk := time.NewTicker(50 * time.Millisecond)
	deadline := time.NewTimer(soakRecover)
	for done := false; !done; {
		if left, err = st.ListTasks(t.Context(), workers.Filter{Statuses: live}); err == nil && len(left) == 0 {
			break
		}
		select {
		case <-tk.C:
		case <-deadline.C:
			done = true
		}
	}
	tk.Stop()
	deadline.Stop()
	if err != nil {
		t.Fatalf("listing the live records: %v", err)
	}
	recs, err := st.ListTasks(t.Context(), workers.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { waits.Wait(); close(waited) }()
	recv(t, waited, "every Wait returning")

	// Every runtime settles what it still runs, so that no callback
	// outlives the test.
	s.mu.Lock()
	all := slices.Clone(s.all)
	s.mu.Unlock()
	for _, rt := range all {
		downs.Go(func() { s.shutdown(rt, waitLimit, "a runtime after the recovery") })
	}
	downs.Wait()
	s.check(recs)
}

// start opens a store handle and starts a runtime over it, retrying
// until the load ends (or t's context, for the runtimes outside it); it
// returns nil if it could not. Both are closed in t's cleanup.
func (s *soakRun) start(ctx context.Context) *workers.Runtime[workers.Store] {
	t := s.t
	for ctx.Err() == nil {
		st, closeStore, err := s.open(ctx)
		if err != nil {
			t.Logf("open a store: %v", err)
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		t.Cleanup(closeStore)
		rt := workers.NewRuntime(st, s.cfg)
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
			defer cancel()
			_ = rt.Shutdown(ctx) // the scenario's own Shutdowns report
		})
		s.mu.Lock()
		s.all = append(s.all, rt)
		s.mu.Unlock()
		if err := rt.Start(ctx); err != nil {
			t.Logf("start a runtime: %v", err)
			continue
		}
		return rt
	}
	return nil
}

// shutdown shuts rt down within bound; an error is logged, for the
// scenario checks the records, not how long a Shutdown takes.
func (s *soakRun) shutdown(rt *workers.Runtime[workers.Store], bound time.Duration, what string) {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	if err := rt.Shutdown(ctx); err != nil {
		s.t.Logf("%s: Shutdown: %v", what, err)
	}
}

// restartEvery replaces one runtime after another, until the load ends:
// the new one starts before the old one shuts down, as in a rolling
// deploy.
func (s *soakRun) restartEvery(seed uint64) {
	r := rand.New(rand.NewPCG(seed, 1))
	tick := time.NewTicker(soakRestart)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-s.ctx.Done():
			return
		case <-tick.C:
		}
		slot := &s.slots[(i+r.IntN(2))%len(s.slots)]
		rt := s.start(s.ctx)
		if rt == nil {
			return
		}
		slot.mu.Lock()
		old := slot.rt
		slot.rt = rt
		slot.mu.Unlock()
		s.shutdown(old, soakBound, "a replaced runtime")
		s.mu.Lock()
		s.restarts++
		s.mu.Unlock()
	}
}

// plan draws submission n.
func (s *soakRun) plan(r *rand.Rand, n int) soakPlan {
	p := soakPlan{
		n:     n,
		kind:  soakKinds[r.IntN(len(soakKinds))],
		owner: workers.MustOwner(soakOwners[r.IntN(len(soakOwners))]),
		seq:   r.IntN(4) == 0,
		slot:  r.IntN(len(s.slots)),
		after: time.Duration(r.IntN(400)) * time.Millisecond,
		run:   time.Duration(r.Int64N(int64(soakLongest))),
	}
	p.other = (p.slot + 1 + r.IntN(len(s.slots)-1)) % len(s.slots)
	p.key = "soak-" + strconv.Itoa(n) + "-" + p.kind
	switch x := r.IntN(10); {
	case x == 0:
		p.twice = true
	case x < 3:
		p.cancel = true
	case x < 5:
		p.wait = true
	}
	switch p.kind {
	case "ok", "fail", "retry":
		p.run /= 8
	case "progress":
		p.run /= 2
	case "timeout":
		p.timeout = time.Duration(20+r.IntN(80)) * time.Millisecond
	case "stubborn":
		p.run = soakStubborn + p.run/2
	}
	return p
}

// submit makes p's submissions, and its cancel or Wait.
func (s *soakRun) submit(p soakPlan, waits *sync.WaitGroup) {
	sub, ok := s.submitOnce(p, p.slot)
	if !ok {
		return
	}
	switch {
	case p.twice:
		select {
		case <-s.ctx.Done():
			return
		case <-time.After(p.after):
		}
		s.submitOnce(p, p.other)
	case p.cancel:
		select {
		case <-s.ctx.Done():
			return
		case <-time.After(p.after):
		}
		reason := soakReason + " " + sub.id
		err := s.slots[p.other].get().Cancel(s.ctx, sub.id, p.owner, workers.WithReason(reason))
		s.mu.Lock()
		s.cancels = append(s.cancels, soakCancel{id: sub.id, reason: reason, by: p.owner, err: err})
		s.mu.Unlock()
	case p.wait:
		// The Wait outlives the load: it returns once the final
		// recovery has ended every record.
		rt := s.slots[p.other].get()
		waits.Go(func() {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), soakRecover+waitLimit)
			defer cancel()
			snap, err := rt.Wait(ctx, sub.id, p.owner)
			s.mu.Lock()
			s.waits = append(s.waits, soakWait{id: sub.id, snap: snap, err: err})
			s.mu.Unlock()
		})
	}
}

// submitOnce submits p through the runtime of slot; a submission that
// fails is tried again through the next one, under a new key unless p is
// submitted twice, until the load ends.
func (s *soakRun) submitOnce(p soakPlan, slot int) (soakSub, bool) {
	var opts []workers.SubmitOption
	switch p.kind {
	case "retry":
		opts = append(opts, workers.WithRetry(workers.RetryPolicy{MaxAttempts: 3, InitialBackoff: 10 * time.Millisecond}))
	case "timeout":
		opts = append(opts, workers.WithTimeout(p.timeout))
	}
	for try := 0; s.ctx.Err() == nil; try++ {
		rt := s.slots[slot].get()
		var (
			sub workers.Submission
			err error
		)
		if p.seq {
			sub, err = rt.SubmitSequential(s.ctx, p.owner.ID()+soakQueueSep, p.key, s.callback(p), p.owner, opts...)
		} else {
			sub, err = rt.Submit(s.ctx, p.key, s.callback(p), p.owner, opts...)
		}
		if err == nil {
			sb := soakSub{plan: p, id: sub.ID, runID: sub.RunID, joined: sub.Joined}
			s.mu.Lock()
			s.subs = append(s.subs, sb)
			s.mu.Unlock()
			return sb, true
		}
		msg := err.Error()
		if errors.Is(err, workers.ErrClosed) {
			msg = "closed"
		}
		s.mu.Lock()
		s.subErrs[msg]++
		s.mu.Unlock()
		if !p.twice {
			// The failed submission may have left a record: a fresh key
			// keeps this plan's submissions one to a key.
			p.key += "x"
		}
		slot = (slot + 1) % len(s.slots)
	}
	return soakSub{}, false
}

// callback returns p's callback, which reports what it does in s.execs.
func (s *soakRun) callback(p soakPlan) workers.Func {
	return func(ctx context.Context, tk *workers.Task) (any, error) {
		s.mu.Lock()
		e := s.execs[tk.RunID()]
		if e == nil {
			e = &soakExec{key: tk.ID(), kind: p.kind}
			s.execs[tk.RunID()] = e
		}
		e.attempts = append(e.attempts, tk.Attempt())
		s.mu.Unlock()
		// end returns v and err, counting a result returned while ctx
		// is live.
		end := func(v any, err error) (any, error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			if ctx.Err() != nil {
				return nil, context.Cause(ctx)
			}
			if err == nil {
				e.results++
			}
			return v, err
		}
		work := func(d time.Duration) bool {
			timer := time.NewTimer(d)
			defer timer.Stop()
			select {
			case <-timer.C:
				return true
			case <-ctx.Done():
				return false
			}
		}
		switch p.kind {
		case "ok", "long":
			if !work(p.run) {
				return end(nil, context.Cause(ctx))
			}
			return end(p.kind, nil)
		case "progress":
			for i := range 5 {
				if !work(p.run / 5) {
					return end(nil, context.Cause(ctx))
				}
				tk.SetProgress((i + 1) * 20)
			}
			return end("progress", nil)
		case "fail":
			work(p.run)
			return end(nil, errors.New(soakFailMsg))
		case "timeout":
			work(soakLongest)
			return end(nil, context.Cause(ctx))
		case "retry":
			if !work(p.run) {
				return end(nil, context.Cause(ctx))
			}
			if tk.Attempt() < 3 {
				return end(nil, errors.New(soakRetryMsg))
			}
			return end("retried", nil)
		case "stubborn":
			// Works on whatever its context says, and returns a result.
			<-time.After(p.run)
			s.mu.Lock()
			defer s.mu.Unlock()
			if err := context.Cause(ctx); err != nil {
				e.ignored = append(e.ignored, err)
				if errors.Is(err, workers.ErrShutdown) {
					e.late = true
				}
			} else {
				e.results++
			}
			return "stubborn", nil
		}
		panic("unknown kind " + p.kind)
	}
}

// check checks the records recs, read after the recovery, against what
// the scenario did.
func (s *soakRun) check(recs []workers.Record) {
	t := s.t
	s.mu.Lock()
	defer s.mu.Unlock()
	byID := map[string]workers.Record{}
	byStatus := map[string]int{}
	for _, rec := range recs {
		byID[rec.ID] = rec
		byStatus[string(rec.Status)+"/"+string(rec.Cause)]++
		if !rec.Status.Terminal() {
			t.Errorf("%s (run %s) is %s after the recovery", rec.ID, rec.RunID, rec.Status)
		}
	}
	t.Logf("%d submissions, %d records by status/cause %v; %d runs executed; %d restarts, %d faults; submit errors %v",
		len(s.subs), len(recs), byStatus, len(s.execs), s.restarts, s.faults, s.subErrs)
	if len(s.subs) == 0 || len(s.execs) == 0 {
		t.Errorf("the load did nothing: %d submissions, %d runs executed", len(s.subs), len(s.execs))
	}

	// Runs: each started by one submission that did not join, each
	// attempt executed at most once, each key by no more runs than
	// started on it.
	runs := map[string]soakSub{}
	started := map[string]int{} // by key
	for _, sb := range s.subs {
		if sb.joined {
			continue
		}
		if prev, ok := runs[sb.runID]; ok {
			t.Errorf("run %s started by two submissions, of %s and %s", sb.runID, prev.id, sb.id)
		}
		runs[sb.runID] = sb
		started[sb.id]++
	}
	for _, sb := range s.subs {
		if _, ok := byID[sb.id]; !ok {
			t.Errorf("%s: acknowledged, but no record", sb.id)
		}
	}
	executed := map[string]int{} // by key
	for runID, e := range s.execs {
		executed[e.key]++
		want := []int{1}
		if e.kind == "retry" {
			want = []int{1, 2, 3}[:min(len(e.attempts), 3)]
		}
		if !slices.Equal(e.attempts, want) {
			t.Errorf("%s: run %s executed attempts %v, want %v", e.key, runID, e.attempts, want)
		}
	}
	for key, n := range executed {
		if n > started[key] {
			t.Errorf("%s: executed by %d runs, started by %d submissions", key, n, started[key])
		}
	}

	// Outcomes: COMPLETED only with a result.
	for _, rec := range recs {
		if rec.Status != workers.StatusCompleted {
			continue
		}
		e := s.execs[rec.RunID]
		switch {
		case e == nil:
			t.Errorf("%s: COMPLETED by run %s, whose callback never ran", rec.ID, rec.RunID)
		case e.results == 0 && !e.late:
			t.Errorf("%s: COMPLETED by run %s, whose callback returned no result (attempts %v, context ignored with %v)",
				rec.ID, rec.RunID, e.attempts, e.ignored)
		case e.kind == "progress" && rec.Progress != 100:
			t.Errorf("%s: COMPLETED with progress %d", rec.ID, rec.Progress)
		}
	}

	// Cancels that returned nil.
	outcomes := map[string]int{}
	for _, c := range s.cancels {
		switch {
		case c.err == nil:
			outcomes["nil"]++
		case errors.Is(c.err, workers.ErrFinished):
			outcomes["finished"]++
		default:
			outcomes[c.err.Error()]++
		}
		if c.err != nil {
			continue
		}
		rec, ok := byID[c.id]
		if !ok || rec.Status != workers.StatusCancelled || rec.Cause != workers.CauseCancelled ||
			rec.CancelledBy != c.by.ID() || rec.CancelReason != c.reason {
			t.Errorf("Cancel(%s) by %s returned nil, but the record is %s/%s, cancelled by %q with reason %q (error %q)",
				c.id, c.by.ID(), rec.Status, rec.Cause, rec.CancelledBy, rec.CancelReason, rec.Error)
		}
	}
	t.Logf("%d cancels: %v; %d waits", len(s.cancels), outcomes, len(s.waits))

	// Waits from another runtime.
	for _, w := range s.waits {
		rec := byID[w.id]
		switch {
		case w.err != nil:
			t.Errorf("Wait(%s): %v", w.id, w.err)
		case !w.snap.Status.Terminal():
			t.Errorf("Wait(%s) returned a record %s", w.id, w.snap.Status)
		case w.snap.RunID != rec.RunID || w.snap.Status != rec.Status || w.snap.Cause != rec.Cause:
			t.Errorf("Wait(%s) returned run %s %s/%s, the record is run %s %s/%s",
				w.id, w.snap.RunID, w.snap.Status, w.snap.Cause, rec.RunID, rec.Status, rec.Cause)
		}
	}
}
