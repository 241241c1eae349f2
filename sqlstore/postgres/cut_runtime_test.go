package postgres_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"iter"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// cutRuntime returns a cutter, and a runtime over a store whose
// connections it can cut; t's cleanup shuts the runtime down and fails
// t unless that returns cleanly.
func cutRuntime(t *testing.T, cfg workers.Config) (*cutter, *workers.Runtime[*postgres.Store]) {
	t.Helper()
	c, rt, _ := cutRuntimeIn(t, cfg)
	return c, rt
}

// cutRuntimeIn is cutRuntime, returning the scratch schema too.
func cutRuntimeIn(t *testing.T, cfg workers.Config) (*cutter, *workers.Runtime[*postgres.Store], scratch) {
	t.Helper()
	sc := newScratchT(t)
	c := &cutter{}
	ev := &eventLog{}
	cfg.Observers = append(cfg.Observers, ev)
	rt := workers.NewRuntime(sc.cutStore(t, c), cfg)
	events.Store(rt, ev)
	t.Cleanup(func() { events.Delete(rt) })
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := rt.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return c, rt, sc
}

// events holds each runtime's eventLog, by runtime.
var events sync.Map

// eventLog is an observer that keeps the events it hears.
type eventLog struct {
	mu     sync.Mutex
	events []workers.Event
}

func (l *eventLog) Observe(_ context.Context, e workers.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e.Task = nil
	l.events = append(l.events, e)
}

// of returns the events of kind that run runID's observers heard.
func (l *eventLog) of(runID string, kind workers.EventKind) []workers.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []workers.Event
	for _, e := range l.events {
		if e.RunID == runID && e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

// cutKey returns a key no other statement of the test carries.
//
// A key carries no status's name: statements are told apart by those.
func cutKey(name string) string {
	for _, st := range []workers.Status{workers.StatusPending, workers.StatusRunning, workers.StatusCompleted, workers.StatusFailed, workers.StatusCancelled} {
		if strings.Contains(name, string(st)) {
			panic("a key named " + name + " carries a status")
		}
	}
	return "cut-" + name + "-" + strings.ToLower(rand.Text()[:10])
}

// traced wraps match to log the first statement it matches.
func traced(t *testing.T, match func([]byte) bool) func([]byte) bool {
	var once atomic.Bool
	return func(p []byte) bool {
		ok := match(p)
		if ok && once.CompareAndSwap(false, true) {
			t.Logf("cut: %s", printable(p))
		}
		return ok
	}
}

// carrying reports whether a statement's bytes carry every one of parts.
func carrying(parts ...string) func([]byte) bool {
	return func(p []byte) bool {
		for _, s := range parts {
			if !bytes.Contains(p, []byte(s)) {
				return false
			}
		}
		return true
	}
}

// commitAfter matches the first COMMIT written once a statement that
// first matches was written: the end of that statement's transaction.
func commitAfter(first func([]byte) bool) func([]byte) bool {
	var seen atomic.Bool
	return func(p []byte) bool {
		if !seen.Load() {
			if first(p) {
				seen.Store(true)
			}
			return false
		}
		return bytes.Contains(bytes.ToLower(p), []byte("commit"))
	}
}

// counted is a callback, and how many times it was called. Each call
// waits for release (closed, or nil for no wait) or for its context,
// and then returns what result says.
type counted struct {
	calls   atomic.Int32
	started chan struct{} // closed by the first call
	release chan struct{}
	result  func(ctx context.Context) (any, error)
}

func newCounted(release chan struct{}, result func(ctx context.Context) (any, error)) *counted {
	return &counted{started: make(chan struct{}), release: release, result: result}
}

func (c *counted) fn(ctx context.Context, _ *workers.Task) (any, error) {
	if c.calls.Add(1) == 1 {
		close(c.started)
	}
	if c.release != nil {
		select {
		case <-c.release:
		case <-ctx.Done():
		}
	}
	return c.result(ctx)
}

// done is a callback's result: "done".
func done(context.Context) (any, error) { return "done", nil }

// waitStarted waits for c's first call, or fails t after a while.
func (c *counted) waitStarted(t *testing.T) {
	t.Helper()
	select {
	case <-c.started:
	case <-time.After(5 * time.Second):
		t.Fatal("the callback never started")
	}
}

// submitStarted submits calls.fn under key for alice and returns once
// the callback has started.
func submitStarted(t *testing.T, rt *workers.Runtime[*postgres.Store], key string, calls *counted, opts ...workers.SubmitOption) workers.Submission {
	t.Helper()
	sub, err := rt.Submit(t.Context(), key, calls.fn, workers.MustOwner("alice"), opts...)
	if err != nil {
		t.Fatal(err)
	}
	calls.waitStarted(t)
	return sub
}

// ended checks what users see of run sub once it ended: Wait's and
// Status's answers, a Watch that ends with the end, and that the
// callback ran once.
func ended(t *testing.T, rt *workers.Runtime[*postgres.Store], auth workers.TaskAuthority, sub workers.Submission, calls *counted, want workers.Status, cause workers.Cause) workers.Snapshot {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	snap, err := rt.Wait(ctx, sub.ID, auth)
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if snap.RunID != sub.RunID || snap.Status != want || snap.Cause != cause {
		t.Errorf("Wait = run %s %s (%s) %q; want run %s %s (%s)", snap.RunID, snap.Status, snap.Cause, snap.Error, sub.RunID, want, cause)
	}
	st, err := rt.Status(ctx, sub.ID, auth)
	if err != nil || st.RunID != snap.RunID || st.Status != snap.Status || st.Cause != snap.Cause {
		t.Errorf("Status = run %s %s (%s), %v; Wait said run %s %s (%s)", st.RunID, st.Status, st.Cause, err, snap.RunID, snap.Status, snap.Cause)
	}
	var last workers.Snapshot
	for s, err := range rt.Watch(ctx, sub.ID, auth) {
		if err != nil {
			t.Errorf("Watch: %v", err)
			break
		}
		last = s
		if s.Status.Terminal() {
			break
		}
	}
	if last.RunID != sub.RunID || last.Status != want {
		t.Errorf("Watch ended at run %s %s; want run %s %s", last.RunID, last.Status, sub.RunID, want)
	}
	if ev, ok := events.Load(rt); ok {
		log := ev.(*eventLog)
		waitFor(t, func() bool { return len(log.of(sub.RunID, workers.EventFinished)) > 0 })
		if ends := log.of(sub.RunID, workers.EventFinished); len(ends) != 1 || ends[0].Status != want || ends[0].Cause != cause {
			t.Errorf("observers heard of run %s's end %d times (%+v), want once, %s (%s)", sub.RunID, len(ends), ends, want, cause)
		}
		if n := len(log.of(sub.RunID, workers.EventStarted)) + len(log.of(sub.RunID, workers.EventSubmitted)); !sub.Joined && n < 1 {
			t.Errorf("observers heard of run %s's end, never of its submission", sub.RunID)
		}
	}
	if calls != nil {
		if n := calls.calls.Load(); n != 1 {
			t.Errorf("the callback ran %d times, want once", n)
		}
	}
	return snap
}

// cutOnce fails t unless the cutter cut exactly one statement.
func cutOnce(t *testing.T, c *cutter, what string) {
	t.Helper()
	if n := c.cuts.Load(); n != 1 {
		t.Fatalf("%d statements cut, want %s", n, what)
	}
}

// A run's registering write (its insert) that loses its connection,
// before it reached the server or after it committed, is made again:
// Submit registers one run, whose callback runs once and whose record
// ends COMPLETED.
func TestRuntimeCutRegisteringInsert(t *testing.T) {
	testDSN(t)
	for _, before := range []bool{true, false} {
		t.Run(cutPoint(before), func(t *testing.T) {
			c, rt := cutRuntime(t, workers.Config{})
			alice := workers.MustOwner("alice")
			key := cutKey("insert")
			calls := newCounted(nil, done)
			stream := subscribed(t, rt, alice)
			c.cutWrite(traced(t, carrying(key)), before)
			sub, err := rt.Submit(t.Context(), key, calls.fn, alice)
			if err != nil {
				t.Fatalf("Submit, its insert cut: %v", err)
			}
			cutOnce(t, c, "the insert")
			if sub.Joined {
				t.Errorf("Submit joined %s, want a new run", sub.RunID)
			}
			stream(sub, workers.StatusCompleted)
			ended(t, rt, alice, sub, calls, workers.StatusCompleted, workers.CauseCompleted)
		})
	}
}

// A re-run's registering write (the replace of the finished record)
// that loses its connection, before the UPDATE reached the server or
// after the transaction committed, is made again: the re-run registers
// once, and runs once.
func TestRuntimeCutReRunReplace(t *testing.T) {
	testDSN(t)
	for _, before := range []bool{true, false} {
		t.Run(cutPoint(before), func(t *testing.T) {
			c, rt := cutRuntime(t, workers.Config{})
			alice := workers.MustOwner("alice")
			key := cutKey("replace")
			first := newCounted(nil, done)
			sub1, err := rt.Submit(t.Context(), key, first.fn, alice)
			if err != nil {
				t.Fatal(err)
			}
			ended(t, rt, alice, sub1, first, workers.StatusCompleted, workers.CauseCompleted)
			// The replace is the statement that carries the key and the
			// finished run's id.
			replace := carrying(key, sub1.RunID)
			if before {
				c.cutWrite(traced(t, replace), true)
			} else {
				c.cutWrite(traced(t, commitAfter(replace)), false)
			}
			second := newCounted(nil, done)
			stream := subscribed(t, rt, alice)
			sub2, err := rt.Submit(t.Context(), key, second.fn, alice)
			if err != nil {
				t.Fatalf("Submit, its replace cut: %v", err)
			}
			cutOnce(t, c, "the replace")
			if sub2.Joined || sub2.RunID == sub1.RunID {
				t.Errorf("re-run %+v, want a new run after %s", sub2, sub1.RunID)
			}
			stream(sub2, workers.StatusCompleted)
			ended(t, rt, alice, sub2, second, workers.StatusCompleted, workers.CauseCompleted)
		})
	}
}

// A queued run's start (PENDING to RUNNING) that loses its connection is
// made again, and a try that landed is found: the run starts once.
func TestRuntimeCutQueuedStart(t *testing.T) {
	testDSN(t)
	for _, before := range []bool{true, false} {
		t.Run(cutPoint(before), func(t *testing.T) {
			c, rt := cutRuntime(t, workers.Config{})
			alice := workers.MustOwner("alice")
			queue := cutKey("queue")
			release := make(chan struct{})
			blocker := newCounted(release, done)
			if _, err := rt.SubmitSequential(t.Context(), queue, cutKey("blocker"), blocker.fn, alice); err != nil {
				t.Fatal(err)
			}
			blocker.waitStarted(t)
			key := cutKey("queued")
			calls := newCounted(nil, done)
			sub, err := rt.SubmitSequential(t.Context(), queue, key, calls.fn, alice)
			if err != nil {
				t.Fatal(err)
			}
			if snap, err := rt.Status(t.Context(), sub.ID, alice); err != nil || snap.Status != workers.StatusPending {
				t.Fatalf("queued run %s, %v; want PENDING", snap.Status, err)
			}
			check := following(t, rt, alice, sub)
			c.cutWrite(traced(t, carrying(key, string(workers.StatusRunning))), before)
			close(release)
			check(workers.StatusCompleted)
			snap := ended(t, rt, alice, sub, calls, workers.StatusCompleted, workers.CauseCompleted)
			cutOnce(t, c, "the start")
			if snap.Attempt != 1 {
				t.Errorf("attempt %d, want 1", snap.Attempt)
			}
		})
	}
}

// A run's terminal write (its callback's result, its failure, the end of
// its callback after a Cancel) that loses its connection is made again,
// and a try that landed is found: the record ends as the run did, and
// Wait, Status and Watch say so.
func TestRuntimeCutOutcome(t *testing.T) {
	testDSN(t)
	errBad := errors.New("bad input")
	for _, tc := range []struct {
		name   string
		result func(ctx context.Context) (any, error)
		status workers.Status
		cause  workers.Cause
	}{
		{"Completed", done, workers.StatusCompleted, workers.CauseCompleted},
		{"Failed", func(context.Context) (any, error) { return nil, workers.Permanent(errBad) }, workers.StatusFailed, workers.CausePermanent},
	} {
		for _, before := range []bool{true, false} {
			t.Run(tc.name+"/"+cutPoint(before), func(t *testing.T) {
				c, rt := cutRuntime(t, workers.Config{})
				alice := workers.MustOwner("alice")
				key := cutKey("outcome-" + tc.name[:1])
				release := make(chan struct{})
				calls := newCounted(release, tc.result)
				sub := submitStarted(t, rt, key, calls)
				check := following(t, rt, alice, sub)
				c.cutWrite(traced(t, carrying(key, string(tc.status))), before)
				close(release)
				check(tc.status)
				snap := ended(t, rt, alice, sub, calls, tc.status, tc.cause)
				cutOnce(t, c, "the outcome")
				if tc.status == workers.StatusCompleted && string(snap.Result) != `"done"` {
					t.Errorf("result %s, want \"done\"", snap.Result)
				}
				if tc.status == workers.StatusFailed && !strings.Contains(snap.Error, "bad input") {
					t.Errorf("error %q, want the callback's", snap.Error)
				}
			})
		}
	}
}

// A Cancel whose write loses its connection after it committed cancels
// the run and returns nil; one cut before it reached the server returns
// the store's error, cancels nothing, and a Cancel made again does. The
// run's record ends CANCELLED by its canceller either way, and its
// callback runs once.
func TestRuntimeCutCancel(t *testing.T) {
	testDSN(t)
	for _, before := range []bool{true, false} {
		t.Run(cutPoint(before), func(t *testing.T) {
			c, rt := cutRuntime(t, workers.Config{})
			alice := workers.MustOwner("alice")
			key := cutKey("cancel")
			calls := newCounted(make(chan struct{}), func(ctx context.Context) (any, error) { return nil, context.Cause(ctx) })
			sub := submitStarted(t, rt, key, calls)
			check := following(t, rt, alice, sub)
			c.cutWrite(traced(t, carrying(key, string(workers.StatusCancelled))), before)
			err := rt.Cancel(t.Context(), sub.ID, alice, workers.WithReason("cut-reason"))
			cutOnce(t, c, "the cancel's write")
			if before {
				if !errors.Is(err, workers.ErrUnavailable) {
					t.Fatalf("Cancel, its write cut before it was sent: %v, want ErrUnavailable", err)
				}
				if snap, err := rt.Status(t.Context(), sub.ID, alice); err != nil || snap.Status != workers.StatusRunning {
					t.Fatalf("after a Cancel that did not land: %s, %v; want RUNNING", snap.Status, err)
				}
				err = rt.Cancel(t.Context(), sub.ID, alice, workers.WithReason("cut-reason"))
			}
			if err != nil {
				t.Fatalf("Cancel: %v", err)
			}
			check(workers.StatusCancelled)
			snap := ended(t, rt, alice, sub, calls, workers.StatusCancelled, workers.CauseCancelled)
			if snap.CancelledBy != "alice" || snap.CancelReason != "cut-reason" {
				t.Errorf("cancelled by %q for %q, want alice for cut-reason", snap.CancelledBy, snap.CancelReason)
			}
		})
	}
}

// A run's own CANCELLED write, once a Cancel landed, that loses its
// connection is fenced out when made again (the Cancel's record stays):
// the record keeps the Cancel's end.
func TestRuntimeCutCancelledRunsOwnWrite(t *testing.T) {
	testDSN(t)
	for _, before := range []bool{true, false} {
		t.Run(cutPoint(before), func(t *testing.T) {
			c, rt := cutRuntime(t, workers.Config{})
			alice := workers.MustOwner("alice")
			key := cutKey("own-end")
			returned := make(chan struct{})
			calls := newCounted(make(chan struct{}), func(ctx context.Context) (any, error) {
				defer close(returned)
				return nil, context.Cause(ctx)
			})
			sub := submitStarted(t, rt, key, calls)
			// The Cancel's write is the first to carry the key and
			// CANCELLED; the run's own, once its callback returned, the
			// second.
			var seen atomic.Int32
			c.cutWrite(traced(t, func(p []byte) bool {
				return carrying(key, string(workers.StatusCancelled))(p) && seen.Add(1) == 2
			}), before)
			check := following(t, rt, alice, sub)
			if err := rt.Cancel(t.Context(), sub.ID, alice); err != nil {
				t.Fatalf("Cancel: %v", err)
			}
			<-returned
			check(workers.StatusCancelled)
			ended(t, rt, alice, sub, calls, workers.StatusCancelled, workers.CauseCancelled)
			waitFor(t, func() bool { return c.cuts.Load() == 1 })
		})
	}
}

// A join's AddWatcher that loses its connection, before it is sent or
// after it commits, is made again: Submit joins, never starts a run, and
// the live run runs once.
func TestRuntimeCutJoinAddWatcher(t *testing.T) {
	testDSN(t)
	for _, before := range []bool{true, false} {
		t.Run(cutPoint(before), func(t *testing.T) {
			c, rt := cutRuntime(t, workers.Config{})
			rt.Store().SetWatchAuthorizer(func(string, []string, string) bool { return true })
			bob := workers.MustOwner("bob-cut")
			key := cutKey("join")
			release := make(chan struct{})
			calls := newCounted(release, done)
			sub := submitStarted(t, rt, key, calls, workers.WithScope(workers.ScopeGlobal))
			c.cutWrite(traced(t, carrying(sub.RunID, "bob-cut")), before)
			other := newCounted(nil, done)
			joined, err := rt.Submit(t.Context(), key, other.fn, bob, workers.WithScope(workers.ScopeGlobal))
			cutOnce(t, c, "the AddWatcher")
			if err != nil {
				t.Fatalf("a join whose AddWatcher was cut: %v, want it joined (the write made again)", err)
			}
			if !joined.Joined || joined.RunID != sub.RunID {
				t.Fatalf("join = %+v, want run %s joined", joined, sub.RunID)
			}
			check := following(t, rt, bob, sub)
			close(release)
			check(workers.StatusCompleted)
			ended(t, rt, bob, sub, calls, workers.StatusCompleted, workers.CauseCompleted)
			if n := other.calls.Load(); n != 0 {
				t.Errorf("the joiner's callback ran %d times, want never", n)
			}
		})
	}
}

// A lease renewal that loses its connection, before it reached the
// server or after it committed, costs the runtime nothing while the
// lease lives: the next renewal keeps it, and the run under it is not
// abandoned.
func TestRuntimeCutLeaseRenewal(t *testing.T) {
	testDSN(t)
	for _, before := range []bool{true, false} {
		t.Run(cutPoint(before), func(t *testing.T) {
			c, rt, sc := cutRuntimeIn(t, workers.Config{LeaseInterval: 50 * time.Millisecond, LeaseTTL: 2 * time.Second})
			alice := workers.MustOwner("alice")
			key := cutKey("lease")
			release := make(chan struct{})
			calls := newCounted(release, done)
			sub := submitStarted(t, rt, key, calls)
			instance := workers.InstanceOf(sub.RunID)
			c.cutWrite(traced(t, func(p []byte) bool {
				return bytes.Contains(p, []byte(instance)) && !bytes.Contains(p, []byte(key))
			}), before)
			waitFor(t, func() bool { return c.cuts.Load() == 1 })
			// Renewals after the cut: the lease is held again.
			waitFor(t, leaseRenewed(t, sc, instance))
			close(release)
			ended(t, rt, alice, sub, calls, workers.StatusCompleted, workers.CauseCompleted)
			cutOnce(t, c, "the renewal")
		})
	}
}

// leaseRenewed returns a condition that holds once the store holds a
// later end of instance's lease than it holds now.
func leaseRenewed(t *testing.T, sc scratch, instance string) func() bool {
	t.Helper()
	q := `SELECT expires_at FROM "` + sc.schema + `".workers_leases WHERE instance = $1`
	var then time.Time
	if err := sc.pool.QueryRow(t.Context(), q, instance).Scan(&then); err != nil {
		t.Fatal(err)
	}
	return func() bool {
		var until time.Time
		err := sc.pool.QueryRow(t.Context(), q, instance).Scan(&until)
		return err == nil && until.After(then)
	}
}

// A Cleanup whose delete loses its connection says so (ErrUnavailable);
// one made again deletes what is left, and nothing else.
func TestRuntimeCutCleanup(t *testing.T) {
	testDSN(t)
	for _, before := range []bool{true, false} {
		t.Run(cutPoint(before), func(t *testing.T) {
			c, rt := cutRuntime(t, workers.Config{})
			alice := workers.MustOwner("alice")
			key := cutKey("cleanup")
			calls := newCounted(nil, done)
			sub, err := rt.Submit(t.Context(), key, calls.fn, alice)
			if err != nil {
				t.Fatal(err)
			}
			ended(t, rt, alice, sub, calls, workers.StatusCompleted, workers.CauseCompleted)
			live := newCounted(make(chan struct{}), done)
			liveSub, err := rt.Submit(t.Context(), cutKey("live"), live.fn, alice)
			if err != nil {
				t.Fatal(err)
			}
			live.waitStarted(t)
			c.cutWrite(traced(t, carrying(string(workers.StatusCompleted), string(workers.StatusFailed), string(workers.StatusCancelled))), before)
			n, err := rt.Cleanup(t.Context(), 0)
			cutOnce(t, c, "the delete")
			if !errors.Is(err, workers.ErrUnavailable) || n != 0 {
				t.Errorf("Cleanup, its delete cut: %d, %v; want 0, ErrUnavailable", n, err)
			}
			_, err = rt.Status(t.Context(), sub.ID, alice)
			if before != (err == nil) {
				t.Errorf("Status of the finished record after a cut delete: %v", err)
			}
			n, err = rt.Cleanup(t.Context(), 0)
			if want := map[bool]int{true: 1, false: 0}[before]; err != nil || n != want {
				t.Errorf("Cleanup made again: %d, %v; want %d", n, err, want)
			}
			if _, err := rt.Status(t.Context(), sub.ID, alice); !errors.Is(err, workers.ErrNotFound) {
				t.Errorf("Status of the finished record after Cleanup: %v, want ErrNotFound", err)
			}
			if snap, err := rt.Status(t.Context(), liveSub.ID, alice); err != nil || snap.Status != workers.StatusRunning {
				t.Errorf("the live run after Cleanup: %s, %v; want RUNNING", snap.Status, err)
			}
			close(live.release)
			ended(t, rt, alice, liveSub, live, workers.StatusCompleted, workers.CauseCompleted)
		})
	}
}

// printable renders a statement's bytes for a log.
func printable(p []byte) string {
	return strings.Map(func(r rune) rune {
		if r < 32 || r > 126 {
			return '.'
		}
		return r
	}, string(p))
}

// afterWrite matches the first write after one that first matches: the
// execution of a statement whose preparation first matches.
func afterWrite(first func([]byte) bool) func([]byte) bool {
	var seen atomic.Bool
	return func(p []byte) bool {
		if !seen.Load() {
			if first(p) {
				seen.Store(true)
			}
			return false
		}
		return true
	}
}

// The first submission of a runtime takes its instance lease. A take
// that loses its connection, before it reached the server or after it
// committed, is made again, as a registering write is: the submission
// registers its run, which runs once.
func TestRuntimeCutLeaseTake(t *testing.T) {
	testDSN(t)
	for _, before := range []bool{true, false} {
		t.Run(cutPoint(before), func(t *testing.T) {
			c, rt := cutRuntime(t, workers.Config{})
			alice := workers.MustOwner("alice")
			key := cutKey("take")
			calls := newCounted(nil, done)
			// The renewal's statement is prepared on first use: its text
			// goes first, alone, and its execution next.
			renewal := carrying("RETURNING extended")
			if before {
				c.cutWrite(traced(t, renewal), true)
			} else {
				c.cutWrite(traced(t, afterWrite(renewal)), false)
			}
			sub, err := rt.Submit(t.Context(), key, calls.fn, alice)
			cutOnce(t, c, "the take")
			if err != nil {
				t.Fatalf("Submit, its lease's take cut: %v", err)
			}
			ended(t, rt, alice, sub, calls, workers.StatusCompleted, workers.CauseCompleted)
		})
	}
}

// following opens a Wait and a Watch of run sub before a cut, and
// returns a check, for after it, that both end with the run's end:
// Wait with want, and the Watch with want as its last snapshot, after
// which it ends, its snapshots never going back from an end.
func following(t *testing.T, rt *workers.Runtime[*postgres.Store], auth workers.TaskAuthority, sub workers.Submission) func(want workers.Status) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	type waited struct {
		snap workers.Snapshot
		err  error
	}
	wait := make(chan waited, 1)
	go func() {
		snap, err := rt.Wait(ctx, sub.ID, auth)
		wait <- waited{snap, err}
	}()
	stream := subscribed(t, rt, auth)
	next, stop := iter.Pull2(rt.Watch(ctx, sub.ID, auth))
	first, err, ok := next()
	if !ok || err != nil || first.RunID != sub.RunID {
		stop()
		cancel()
		t.Fatalf("Watch's first snapshot: %+v, %v, %v", first, err, ok)
	}
	return func(want workers.Status) {
		t.Helper()
		defer cancel()
		defer stop()
		last := first
		for {
			snap, err, ok := next()
			if !ok {
				break
			}
			if err != nil {
				t.Errorf("Watch after %s: %v", last.Status, err)
				break
			}
			if last.Status.Terminal() {
				t.Errorf("Watch went on after %s with %s", last.Status, snap.Status)
			}
			last = snap
		}
		if last.RunID != sub.RunID || last.Status != want {
			t.Errorf("Watch ended at run %s %s, want run %s %s", last.RunID, last.Status, sub.RunID, want)
		}
		stream(sub, want)
		w := <-wait
		if w.err != nil || w.snap.RunID != sub.RunID || w.snap.Status != want {
			t.Errorf("Wait begun before the cut = run %s %s, %v; want run %s %s", w.snap.RunID, w.snap.Status, w.err, sub.RunID, want)
		}
	}
}

// A Cancel of a queued run, waiting behind another, whose write loses
// its connection after it committed cancels the run and returns nil;
// one cut before it was sent returns the store's error and cancels
// nothing, and the run, at its turn, runs once. Either way the record
// ends as Wait, Status and Watch say, and the callback runs at most once.
func TestRuntimeCutCancelOfAQueuedRun(t *testing.T) {
	testDSN(t)
	for _, before := range []bool{true, false} {
		t.Run(cutPoint(before), func(t *testing.T) {
			c, rt := cutRuntime(t, workers.Config{})
			alice := workers.MustOwner("alice")
			queue := cutKey("queue")
			release := make(chan struct{})
			blocker := newCounted(release, done)
			if _, err := rt.SubmitSequential(t.Context(), queue, cutKey("blocker"), blocker.fn, alice); err != nil {
				t.Fatal(err)
			}
			blocker.waitStarted(t)
			key := cutKey("waiting")
			calls := newCounted(nil, done)
			sub, err := rt.SubmitSequential(t.Context(), queue, key, calls.fn, alice)
			if err != nil {
				t.Fatal(err)
			}
			check := following(t, rt, alice, sub)
			c.cutWrite(traced(t, carrying(key, string(workers.StatusCancelled))), before)
			err = rt.Cancel(t.Context(), sub.ID, alice)
			cutOnce(t, c, "the cancel's write")
			want, cause := workers.StatusCancelled, workers.CauseCancelled
			if before {
				if !errors.Is(err, workers.ErrUnavailable) {
					t.Errorf("Cancel, its write cut before it was sent: %v, want ErrUnavailable", err)
				}
				want, cause = workers.StatusCompleted, workers.CauseCompleted
			} else if err != nil {
				t.Errorf("Cancel, its write cut after its commit: %v, want nil", err)
			}
			close(release)
			check(want)
			if before {
				ended(t, rt, alice, sub, calls, want, cause)
			} else {
				ended(t, rt, alice, sub, nil, want, cause)
				if n := calls.calls.Load(); n != 0 {
					t.Errorf("the cancelled run's callback ran %d times", n)
				}
			}
		})
	}
}

// A retry's write (RUNNING, the next attempt) that loses its connection
// is made again: the next attempt runs once, and the record ends
// COMPLETED at that attempt.
func TestRuntimeCutRetry(t *testing.T) {
	testDSN(t)
	for _, before := range []bool{true, false} {
		t.Run(cutPoint(before), func(t *testing.T) {
			c, rt := cutRuntime(t, workers.Config{})
			alice := workers.MustOwner("alice")
			key := cutKey("again")
			release := make(chan struct{})
			var calls *counted
			calls = newCounted(release, func(context.Context) (any, error) {
				if calls.calls.Load() == 1 {
					return nil, errors.New("first attempt")
				}
				return "done", nil
			})
			sub := submitStarted(t, rt, key, calls,
				workers.WithRetry(workers.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, Jitter: workers.NoJitter}))
			check := following(t, rt, alice, sub)
			c.cutWrite(traced(t, carrying(key, string(workers.StatusRunning))), before)
			close(release)
			check(workers.StatusCompleted)
			calls.calls.Add(-1) // the first attempt's call
			snap := ended(t, rt, alice, sub, calls, workers.StatusCompleted, workers.CauseCompleted)
			cutOnce(t, c, "the retry's write")
			if snap.Attempt != 2 {
				t.Errorf("ended at attempt %d, want 2", snap.Attempt)
			}
		})
	}
}

// An attempt that outlives its timeout ends the run at the timeout; its
// terminal write, cut, is made again, and the record ends FAILED with
// CauseTimeout once.
func TestRuntimeCutTimeout(t *testing.T) {
	testDSN(t)
	for _, before := range []bool{true, false} {
		t.Run(cutPoint(before), func(t *testing.T) {
			c, rt := cutRuntime(t, workers.Config{})
			alice := workers.MustOwner("alice")
			key := cutKey("slow")
			returned := make(chan struct{})
			calls := newCounted(make(chan struct{}), func(ctx context.Context) (any, error) {
				defer close(returned)
				return nil, context.Cause(ctx)
			})
			sub := submitStarted(t, rt, key, calls, workers.WithTimeout(300*time.Millisecond))
			check := following(t, rt, alice, sub)
			c.cutWrite(traced(t, carrying(key, string(workers.StatusFailed))), before)
			check(workers.StatusFailed)
			<-returned
			ended(t, rt, alice, sub, calls, workers.StatusFailed, workers.CauseTimeout)
			cutOnce(t, c, "the timeout's write")
		})
	}
}

// subscribed opens a Subscribe stream of auth's tasks before a cut, and
// returns a check, for after it, that the stream follows run sub to its
// end, want: each snapshot of the run in order (never back to a live
// status from an end, nor from RUNNING to PENDING), up to its end.
func subscribed(t *testing.T, rt *workers.Runtime[*postgres.Store], auth workers.TaskAuthority) func(sub workers.Submission, want workers.Status) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	next, stop := iter.Pull2(rt.Subscribe(ctx, auth))
	t.Cleanup(func() {
		stop()
		cancel()
	})
	return func(sub workers.Submission, want workers.Status) {
		t.Helper()
		var seen []workers.Status
		for {
			snap, err, ok := next()
			if !ok || err != nil {
				t.Errorf("Subscribe ended (%v) before run %s's end, having shown %v", err, sub.RunID, seen)
				return
			}
			if snap.RunID != sub.RunID {
				continue
			}
			if n := len(seen); n > 0 && (seen[n-1].Terminal() || seen[n-1] == workers.StatusRunning && snap.Status == workers.StatusPending) {
				t.Errorf("Subscribe showed run %s %s after %v", sub.RunID, snap.Status, seen)
			}
			seen = append(seen, snap.Status)
			if snap.Status.Terminal() {
				if snap.Status != want {
					t.Errorf("Subscribe showed run %s end %s, want %s", sub.RunID, snap.Status, want)
				}
				return
			}
		}
	}
}

// Under Limits, a run that waits for a slot is registered PENDING and
// written RUNNING at its turn. That start, cut, is made again, and the
// run runs once; a Cancel of the waiting run whose write is cut after
// its commit ends it, and it never runs.
func TestRuntimeCutUnderLimits(t *testing.T) {
	testDSN(t)
	for _, op := range []string{"Start", "Cancel"} {
		for _, before := range []bool{true, false} {
			t.Run(op+"/"+cutPoint(before), func(t *testing.T) {
				c, rt := cutRuntime(t, workers.Config{Limits: workers.Limits{MaxRunning: 1}})
				alice := workers.MustOwner("alice")
				release := make(chan struct{})
				blocker := newCounted(release, done)
				if _, err := rt.Submit(t.Context(), cutKey("blocker"), blocker.fn, alice); err != nil {
					t.Fatal(err)
				}
				blocker.waitStarted(t)
				key := cutKey("slot")
				calls := newCounted(nil, done)
				sub, err := rt.Submit(t.Context(), key, calls.fn, alice)
				if err != nil {
					t.Fatal(err)
				}
				if snap, err := rt.Status(t.Context(), sub.ID, alice); err != nil || snap.Status != workers.StatusPending {
					t.Fatalf("waiting run %s, %v; want PENDING", snap.Status, err)
				}
				check := following(t, rt, alice, sub)
				want, cause := workers.StatusCompleted, workers.CauseCompleted
				if op == "Start" {
					c.cutWrite(traced(t, carrying(key, string(workers.StatusRunning))), before)
				} else {
					c.cutWrite(traced(t, carrying(key, string(workers.StatusCancelled))), before)
					err := rt.Cancel(t.Context(), sub.ID, alice)
					switch {
					case before && !errors.Is(err, workers.ErrUnavailable):
						t.Errorf("Cancel, its write cut before it was sent: %v, want ErrUnavailable", err)
					case !before && err != nil:
						t.Errorf("Cancel, its write cut after its commit: %v, want nil", err)
					case !before:
						want, cause = workers.StatusCancelled, workers.CauseCancelled
					}
				}
				close(release)
				check(want)
				if want == workers.StatusCancelled {
					ended(t, rt, alice, sub, nil, want, cause)
					if n := calls.calls.Load(); n != 0 {
						t.Errorf("the cancelled run's callback ran %d times", n)
					}
				} else {
					ended(t, rt, alice, sub, calls, want, cause)
				}
				cutOnce(t, c, "the "+op)
			})
		}
	}
}

// A run's outcome whose row another transaction holds goes alone once
// its batch gives up on the row, and waits for it. Its answer, cut once
// the held row is free and the write committed, is found to have landed
// when the write is made again: the record ends COMPLETED once, and the
// callback ran once.
func TestRuntimeCutLoneOutcomeAfterItsCommit(t *testing.T) {
	testDSN(t)
	c, rt, sc := cutRuntimeIn(t, workers.Config{})
	alice := workers.MustOwner("alice")
	key := cutKey("lone")
	release := make(chan struct{})
	calls := newCounted(release, done)
	sub := submitStarted(t, rt, key, calls)
	check := following(t, rt, alice, sub)
	holder := holdRow(t, sc, sub.ID)
	close(release)
	var pid int32
	waitFor(t, func() bool {
		err := sc.pool.QueryRow(t.Context(), `SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND position($1 in query) > 0 AND starts_with(query, 'UPDATE')`, sc.schema).Scan(&pid)
		return err == nil
	})
	c.cutAnswerOf(pid)
	if err := holder.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	check(workers.StatusCompleted)
	ended(t, rt, alice, sub, calls, workers.StatusCompleted, workers.CauseCompleted)
	cutOnce(t, c, "the lone write")
}

// Shutdown ends a queue item that never started CANCELLED, with
// CauseShutdown. That write, cut, is made again within Shutdown, which
// returns cleanly, and the record ends so; the item's callback never
// runs.
func TestRuntimeCutShutdownsAbandon(t *testing.T) {
	testDSN(t)
	for _, before := range []bool{true, false} {
		t.Run(cutPoint(before), func(t *testing.T) {
			// No grace: the blocker, which returns once cancelled, is
			// cancelled at once.
			c, rt := cutRuntime(t, workers.Config{ShutdownGrace: -1})
			alice := workers.MustOwner("alice")
			queue := cutKey("queue")
			blocker := newCounted(make(chan struct{}), func(ctx context.Context) (any, error) { return nil, context.Cause(ctx) })
			if _, err := rt.SubmitSequential(t.Context(), queue, cutKey("blocker"), blocker.fn, alice); err != nil {
				t.Fatal(err)
			}
			blocker.waitStarted(t)
			key := cutKey("left")
			calls := newCounted(nil, done)
			sub, err := rt.SubmitSequential(t.Context(), queue, key, calls.fn, alice)
			if err != nil {
				t.Fatal(err)
			}
			c.cutWrite(traced(t, carrying(key, string(workers.StatusCancelled))), before)
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			if err := rt.Shutdown(ctx); err != nil {
				t.Errorf("Shutdown: %v", err)
			}
			cutOnce(t, c, "the abandon")
			snap, err := rt.Status(t.Context(), sub.ID, alice)
			if err != nil || snap.Status != workers.StatusCancelled || snap.Cause != workers.CauseShutdown {
				t.Errorf("the item left by Shutdown: %s (%s), %v; want CANCELLED (shutdown)", snap.Status, snap.Cause, err)
			}
			if n := calls.calls.Load(); n != 0 {
				t.Errorf("the item's callback ran %d times, want never", n)
			}
		})
	}
}

// A registering insert that loses its connection as Shutdown begins is
// not made again (Shutdown waits for the submissions in progress): the
// submission fails, its callback never runs, and a record the lost try
// may have left is ended by Shutdown's return, never left live for a
// submission to join.
func TestRuntimeCutRegisteringInsertAsShutdownBegins(t *testing.T) {
	testDSN(t)
	for _, before := range []bool{true, false} {
		t.Run(cutPoint(before), func(t *testing.T) {
			c, rt := cutRuntime(t, workers.Config{})
			alice := workers.MustOwner("alice")
			if err := rt.Ready(t.Context()); err != nil { // the lease, taken
				t.Fatal(err)
			}
			key := cutKey("closing")
			calls := newCounted(nil, done)
			shut := make(chan error, 1)
			insert := carrying(key)
			c.cutWrite(traced(t, func(p []byte) bool {
				if !insert(p) {
					return false
				}
				// Shutdown begins as the insert is sent.
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					shut <- rt.Shutdown(ctx)
				}()
				deadline := time.Now().Add(5 * time.Second)
				for !errors.Is(rt.Ready(context.Background()), workers.ErrClosed) && time.Now().Before(deadline) {
					runtime.Gosched()
				}
				return true
			}), before)
			_, err := rt.Submit(t.Context(), key, calls.fn, alice)
			cutOnce(t, c, "the insert")
			t.Logf("Submit: %v", err)
			if err == nil {
				t.Fatal("Submit, its insert lost as Shutdown began: nil error")
			}
			if err := <-shut; err != nil {
				t.Errorf("Shutdown: %v", err)
			}
			if n := calls.calls.Load(); n != 0 {
				t.Errorf("the callback ran %d times, want never", n)
			}
			id, err := workers.ScopedTaskKey(key, alice)
			if err != nil {
				t.Fatal(err)
			}
			rec, err := rt.Store().GetTask(t.Context(), id)
			switch {
			case before && !errors.Is(err, workers.ErrNotFound):
				t.Errorf("the record of an insert cut before it was sent: %+v, %v; want none", rec, err)
			case !before && (err != nil || !rec.Status.Terminal()):
				t.Errorf("the record of an insert cut after its commit: %s (%s), %v; want it ended", rec.Status, rec.Cause, err)
			case !before:
				t.Logf("record %s (%s) %q", rec.Status, rec.Cause, rec.Error)
			}
		})
	}
}
