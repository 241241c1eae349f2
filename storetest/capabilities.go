package storetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// Cases of the State fields beyond the core ones, of the text rule of
// CheckState, and of the optional capabilities Leaser and Notifier. A
// case of a capability the store lacks skips.

// ended returns a CANCELLED state with every field of how it ended set.
func ended() workers.State {
	return workers.State{
		Status:       workers.StatusCancelled,
		Progress:     40,
		Attempt:      1,
		Error:        "Cancelled by user",
		StartedAt:    at(1),
		CompletedAt:  at(2),
		Cause:        workers.CauseCancelled,
		CancelledBy:  "alice",
		CancelReason: "wrong report — relancé",
		Stack:        "goroutine 7 [running]:\nmain.report(...)\n\t/src/report.go:42 +0x1d",
	}
}

func (*suite) roundTripEndingFields(t *testing.T, s workers.Store) {
	// Through InsertTask.
	r := record("alice::inserted", "run-1")
	r.State = ended()
	insert(t, s, r)
	wantStored(t, s, r)

	// Through TransitionTask, and back to empty through SetTask.
	r2 := record("alice::transitioned", "run-2")
	insert(t, s, r2)
	ok, err := s.TransitionTask(t.Context(), r2.ID, r2.RunID, pendingOnly, ended())
	if err != nil || !ok {
		t.Fatalf("TransitionTask: %v, %v; want true, nil", ok, err)
	}
	r2.State = ended()
	wantStored(t, s, r2)
	r2.State = outcome(workers.StatusFailed, 3)
	r2.Cause = workers.CausePanicked
	r2.Stack = "goroutine 9 [running]:\npanic(...)"
	if err := s.SetTask(t.Context(), r2); err != nil {
		t.Fatalf("SetTask: %v", err)
	}
	wantStored(t, s, r2)

	// Through ReplaceTask, which clears them for the new run.
	r3 := record(r2.ID, "run-3")
	if err := s.ReplaceTask(t.Context(), r3, r2.RunID); err != nil {
		t.Fatalf("ReplaceTask: %v", err)
	}
	wantStored(t, s, r3)
}

// unstorable is text no store need hold: a NUL byte, and invalid UTF-8.
var unstorable = []struct{ name, text string }{
	{"a NUL byte", "bad\x00text"},
	{"invalid UTF-8", "bad\xfftext"},
}

// unstorableWatchers are the watchers CheckWatcher refuses: unstorable
// text, and text longer than a user id.
var unstorableWatchers = append(slices.Clip(unstorable), struct{ name, text string }{
	"more bytes than a user id", strings.Repeat("w", workers.MaxOwnerIDLen+1),
})

// unstorableStates are the states CheckState refuses with ErrInvalidData:
// each text field holding unstorable text, and numbers out of range.
func unstorableStates() []struct {
	name string
	st   workers.State
} {
	fields := []struct {
		name string
		set  func(st *workers.State, text string)
	}{
		{"Error", func(st *workers.State, x string) { st.Error = x }},
		{"CancelledBy", func(st *workers.State, x string) { st.CancelledBy = x }},
		{"CancelReason", func(st *workers.State, x string) { st.CancelReason = x }},
		{"Stack", func(st *workers.State, x string) { st.Stack = x }},
		{"Cause", func(st *workers.State, x string) { st.Cause = workers.Cause(x) }},
	}
	var bad []struct {
		name string
		st   workers.State
	}
	add := func(name string, set func(*workers.State)) {
		st := ended()
		set(&st)
		bad = append(bad, struct {
			name string
			st   workers.State
		}{name, st})
	}
	for _, f := range fields {
		for _, u := range unstorable {
			add(u.name+" in "+f.name, func(st *workers.State) { f.set(st, u.text) })
		}
	}
	add("Progress -1", func(st *workers.State) { st.Progress = -1 })
	add("Progress 101", func(st *workers.State) { st.Progress = 101 })
	add("Attempt -1", func(st *workers.State) { st.Attempt = -1 })
	if over := int64(math.MaxInt32) + 1; int64(int(over)) == over { // not where an int is 32 bits
		add("Attempt 2^31", func(st *workers.State) { st.Attempt = int(over) })
	}
	return bad
}

func (*suite) unstorableRefused(t *testing.T, s workers.Store) {
	kept := record("alice::kept", "run-1")
	kept.State = ended()
	insert(t, s, kept)
	for _, b := range unstorableStates() {
		st := b.st
		call := func(m string) string { return m + " with " + b.name }
		wantErr(t, call("CheckState"), workers.CheckState(st), workers.ErrInvalidData)

		r := record("alice::refused", "run-9")
		r.State = st
		wantErr(t, call("InsertTask"), s.InsertTask(t.Context(), r), workers.ErrInvalidData)
		wantMissing(t, s, r.ID)

		w := kept
		w.State = st
		wantErr(t, call("SetTask"), s.SetTask(t.Context(), w), workers.ErrInvalidData)
		wantErr(t, call("ReplaceTask"), s.ReplaceTask(t.Context(), workers.Record{ID: kept.ID, RunID: "run-2", CreatedAt: epoch, State: st}, kept.RunID), workers.ErrInvalidData)
		for _, from := range [][]workers.Status{allStatuses, nil} {
			ok, err := s.TransitionTask(t.Context(), kept.ID, kept.RunID, from, st)
			if ok {
				t.Errorf("%s from %q reported true", call("TransitionTask"), from)
			}
			wantErr(t, fmt.Sprintf("%s from %q", call("TransitionTask"), from), err, workers.ErrInvalidData)
		}
		wantStored(t, s, kept)
	}
}

func (*suite) doneContextRefused(t *testing.T, s workers.Store) {
	running := record("alice::live", "run-1", "alice")
	old := record("alice::old", "run-1", "alice")
	old.State = ended()
	insert(t, s, running, old)
	done, cancel := context.WithCancel(t.Context())
	cancel()

	r := record("alice::new", "run-1")
	wantErr(t, "InsertTask", s.InsertTask(done, r), context.Canceled)
	wantMissing(t, s, r.ID)
	w := running
	w.State = workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: at(1)}
	wantErr(t, "SetTask", s.SetTask(done, w), context.Canceled)
	wantErr(t, "ReplaceTask", s.ReplaceTask(done, workers.Record{ID: old.ID, RunID: "run-2", CreatedAt: at(2), State: workers.State{Status: workers.StatusPending}}, old.RunID), context.Canceled)
	ok, err := s.TransitionTask(done, running.ID, running.RunID, []workers.Status{workers.StatusPending}, w.State)
	if ok {
		t.Error("TransitionTask with a done context reported true")
	}
	wantErr(t, "TransitionTask", err, context.Canceled)
	ok, err = s.AddWatcher(done, running.ID, running.RunID, "bob")
	if ok {
		t.Error("AddWatcher with a done context reported true")
	}
	wantErr(t, "AddWatcher", err, context.Canceled)
	for _, cutoff := range []time.Time{at(1000), {}, farPast} {
		// A cutoff that can delete nothing too.
		n, err := s.DeleteFinished(done, cutoff)
		if n != 0 {
			t.Errorf("DeleteFinished(%s) with a done context reported %d deleted", show(cutoff), n)
		}
		wantErr(t, "DeleteFinished("+show(cutoff)+")", err, context.Canceled)
	}
	wantStored(t, s, running)
	wantStored(t, s, old)

	if l, ok := s.(workers.Leaser); ok {
		_, err := l.RenewLease(done, "inst-done", time.Minute)
		wantErr(t, "RenewLease", err, context.Canceled)
		if live(t, t.Context(), l, "inst-done") {
			t.Error("RenewLease with a done context made a lease")
		}
	}
}

// leaser returns s as a Leaser, or skips the case.
func leaser(t *testing.T, s workers.Store) workers.Leaser {
	t.Helper()
	l, ok := s.(workers.Leaser)
	if !ok {
		t.Skip("the store does not implement workers.Leaser")
	}
	return l
}

// live reports whether instance is among the live instances.
func live(t *testing.T, ctx context.Context, l workers.Leaser, instance string) bool {
	t.Helper()
	ids, err := l.LiveInstances(ctx)
	if err != nil {
		t.Errorf("LiveInstances: %v", err)
		return false
	}
	return slices.Contains(ids, instance)
}

// renew renews instance's lease and returns extended, failing t on an
// error.
func renew(t *testing.T, ctx context.Context, l workers.Leaser, instance string, ttl time.Duration) bool {
	t.Helper()
	ext, err := l.RenewLease(ctx, instance, ttl)
	if err != nil {
		t.Errorf("RenewLease(%q, %v): %v", instance, ttl, err)
	}
	return ext
}

func (*suite) leaseRenew(t *testing.T, s workers.Store) {
	l := leaser(t, s)
	ctx := t.Context()
	if live(t, ctx, l, "inst-a") {
		t.Error("an instance that never renewed is live")
	}
	if renew(t, ctx, l, "inst-a", time.Minute) {
		t.Error("the first RenewLease reported extended = true; it created the lease")
	}
	if !live(t, ctx, l, "inst-a") {
		t.Error("an instance is not live after RenewLease")
	}
	if !renew(t, ctx, l, "inst-a", time.Minute) {
		t.Error("RenewLease of a live lease reported extended = false")
	}
	if renew(t, ctx, l, "inst-b", time.Minute) {
		t.Error("a second instance's first RenewLease reported extended = true")
	}
	ids, err := l.LiveInstances(ctx)
	if err != nil {
		t.Fatalf("LiveInstances: %v", err)
	}
	if !sameSet(ids, []string{"inst-a", "inst-b"}) {
		t.Errorf("LiveInstances = %q, want inst-a and inst-b", ids)
	}
}

func (*suite) leaseRelease(t *testing.T, s workers.Store) {
	l := leaser(t, s)
	ctx := t.Context()
	renew(t, ctx, l, "inst-a", time.Minute)
	renew(t, ctx, l, "inst-b", time.Minute)
	if err := l.ReleaseLease(ctx, "inst-a"); err != nil {
		t.Fatalf("ReleaseLease: %v", err)
	}
	if live(t, ctx, l, "inst-a") {
		t.Error("a released instance is still live")
	}
	if !live(t, ctx, l, "inst-b") {
		t.Error("releasing one instance's lease ended another's")
	}
	if renew(t, ctx, l, "inst-a", time.Minute) {
		t.Error("RenewLease after ReleaseLease reported extended = true")
	}
	if err := l.ReleaseLease(ctx, "inst-never"); err != nil {
		t.Errorf("ReleaseLease of an instance without a lease: %v, want nil", err)
	}
}

// leaseTTL is the lease the expiry case lets lapse: long enough for a
// renewal round trip to a database, short enough to wait for. It must
// lapse within leaseSlack of its end: the round trips, the polling
// interval and a busy machine's delays, and nowhere near a second ttl.
const (
	leaseTTL   = 300 * time.Millisecond
	leaseSlack = 2 * time.Second
)

func (su *suite) leaseExpiry(t *testing.T, s workers.Store) {
	l := leaser(t, s)
	su.within(t, func(ctx context.Context) {
		renewed := time.Now()
		renew(t, ctx, l, "inst-short", leaseTTL)
		renew(t, ctx, l, "inst-long", time.Hour)
		// The store's clock decides; poll it until the lease lapses,
		// which must be about when the ttl says, not much later: a peer
		// recovers the runs of a lease only once it has lapsed.
		tick := time.NewTicker(leaseTTL / 10)
		defer tick.Stop()
		for live(t, ctx, l, "inst-short") {
			select {
			case <-tick.C:
			case <-ctx.Done():
				t.Errorf("a lease of %v never expired", leaseTTL)
				return
			}
		}
		if late := time.Since(renewed) - leaseTTL; late > leaseSlack {
			t.Errorf("a lease of %v lapsed %v after it was renewed, more than %v late", leaseTTL, time.Since(renewed), leaseSlack)
		}
		if !live(t, ctx, l, "inst-long") {
			t.Error("an unexpired lease is not live")
		}
		if renew(t, ctx, l, "inst-short", time.Minute) {
			t.Error("RenewLease after the lease expired reported extended = true")
		}
		if !live(t, ctx, l, "inst-short") {
			t.Error("RenewLease after expiry did not make the instance live again")
		}
	})
}

func (*suite) leaseTTLRefused(t *testing.T, s workers.Store) {
	l := leaser(t, s)
	for _, ttl := range []time.Duration{0, -time.Second} {
		_, err := l.RenewLease(t.Context(), "inst-a", ttl)
		wantErr(t, "RenewLease with ttl "+ttl.String(), err, workers.ErrInvalidOption)
	}
	if live(t, t.Context(), l, "inst-a") {
		t.Error("a refused RenewLease made the instance live")
	}
}

// notices is what one Listen call heard.
type notices struct {
	mu      sync.Mutex
	got     []workers.Change // guarded by mu
	changed chan struct{}    // guarded by mu: closed, and replaced, at every notice
}

func newNotices() *notices { return &notices{changed: make(chan struct{})} }

func (n *notices) add(c workers.Change) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.got = append(n.got, c)
	close(n.changed)
	n.changed = make(chan struct{})
}

// await waits until cond holds of the notices heard, or ctx ends, and
// reports whether it held.
func (n *notices) await(ctx context.Context, cond func([]workers.Change) bool) bool {
	for {
		n.mu.Lock()
		ok := cond(n.got)
		ch := n.changed
		n.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

func (n *notices) all() []workers.Change {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.got)
}

// notifier returns s as a Notifier, or skips the case.
func notifier(t *testing.T, s workers.Store) workers.Notifier {
	t.Helper()
	n, ok := s.(workers.Notifier)
	if !ok {
		t.Skip("the store does not implement workers.Notifier")
	}
	return n
}

// listening starts a Listen call on s and returns what it hears once its
// first notice, the Resync, came; stop ends it and returns its error.
func listening(t *testing.T, ctx context.Context, n workers.Notifier) (heard *notices, stop func() error) {
	heard = newNotices()
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- n.Listen(lctx, heard.add) }()
	if !heard.await(ctx, func(got []workers.Change) bool { return len(got) > 0 }) {
		t.Error("Listen called nothing before the case ran out of time; want a Resync at once")
	} else if first := heard.all()[0]; !first.Resync {
		t.Errorf("Listen's first notice is %+v, want one with Resync set", first)
	}
	return heard, func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
			t.Error("Listen did not return after its context was cancelled")
			return nil
		}
	}
}

func (su *suite) notifyWrites(t *testing.T, s workers.Store) {
	n := notifier(t, s)
	su.within(t, func(ctx context.Context) {
		heard, stop := listening(t, ctx, n)
		other, stopOther := listening(t, ctx, n)
		writer := s
		if su.peer != nil {
			writer = su.peer(t, s)
		}
		// Each write, and the run and status the record holds after it.
		id := "alice::noticed"
		type step struct {
			runID  string
			status workers.Status
			write  func() error
		}
		transition := func(runID string, from workers.Status, next workers.State) func() error {
			return func() error {
				ok, err := writer.TransitionTask(ctx, id, runID, []workers.Status{from}, next)
				if err == nil && !ok {
					err = errors.New("TransitionTask reported false")
				}
				return err
			}
		}
		steps := []step{
			{"run-1", workers.StatusPending, func() error { return writer.InsertTask(ctx, record(id, "run-1", "alice")) }},
			{"run-1", workers.StatusRunning, transition("run-1", workers.StatusPending, started)},
			{"run-1", workers.StatusCompleted, transition("run-1", workers.StatusRunning, outcome(workers.StatusCompleted, 1))},
			{"run-2", workers.StatusPending, func() error { return writer.ReplaceTask(ctx, record(id, "run-2", "alice"), "run-1") }},
			{"run-2", workers.StatusPending, func() error {
				ok, err := writer.AddWatcher(ctx, id, "run-2", "bob")
				if err == nil && !ok {
					err = errors.New("AddWatcher reported false")
				}
				return err
			}},
			{"run-2", workers.StatusFailed, func() error {
				r := record(id, "run-2")
				r.State = outcome(workers.StatusFailed, 2)
				return writer.SetTask(ctx, r)
			}},
		}
		for i, st := range steps {
			from := [2]int{len(heard.all()), len(other.all())}
			if err := st.write(); err != nil {
				t.Errorf("write %d: %v", i+1, err)
				return
			}
			// Every write's own notice comes: a later write's notice
			// must not stand in for it (a store silent on one kind of
			// write would pass otherwise).
			for j, h := range []*notices{heard, other} {
				if !h.await(ctx, func(got []workers.Change) bool {
					return slices.ContainsFunc(got[from[j]:], func(c workers.Change) bool {
						return c.Resync || c.ID == id && (c.RunID == "" || c.RunID == st.runID) && (c.Status == "" || c.Status == st.status)
					})
				}) {
					t.Errorf("the notice of write %d (run %s, %s) never came; heard %+v", i+1, st.runID, st.status, h.all())
					return
				}
			}
		}
		last := steps[len(steps)-1]
		// index is where a notice falls in the write order: the first step
		// whose run and status it names (a field the store left empty
		// matches any).
		index := func(c workers.Change, from int) int {
			for i := from; i < len(steps); i++ {
				if (c.RunID == "" || c.RunID == steps[i].runID) && (c.Status == "" || c.Status == steps[i].status) {
					return i
				}
			}
			return -1
		}
		for _, h := range []*notices{heard, other} {
			if !h.await(ctx, func(got []workers.Change) bool {
				c := got[len(got)-1]
				return c.ID == id && (c.RunID == "" || c.RunID == last.runID) && (c.Status == "" || c.Status == last.status)
			}) {
				t.Errorf("the notice of the last write never came; heard %+v", h.all())
				continue
			}
			pos := 0
			for _, c := range h.all() {
				if c.Resync || c.ID != id {
					continue
				}
				i := index(c, pos)
				if i < 0 {
					t.Errorf("notice %+v is out of write order (or names a run and status no write left); heard %+v", c, h.all())
					break
				}
				pos = i
			}
		}
		for _, s := range []func() error{stop, stopOther} {
			if err := s(); !errors.Is(err, context.Canceled) {
				t.Errorf("Listen returned %v after its context was cancelled, want context.Canceled", err)
			}
		}
	})
}

func (su *suite) notifyListenEnds(t *testing.T, s workers.Store) {
	n := notifier(t, s)
	su.within(t, func(ctx context.Context) {
		done, cancel := context.WithCancel(ctx)
		cancel()
		if err := n.Listen(done, func(workers.Change) {}); !errors.Is(err, context.Canceled) {
			t.Errorf("Listen with a cancelled context returned %v, want context.Canceled", err)
		}
		_, stop := listening(t, ctx, n)
		if err := stop(); !errors.Is(err, context.Canceled) {
			t.Errorf("Listen returned %v after its context was cancelled, want context.Canceled", err)
		}
		// A write after the listener left must not block or fail.
		if err := s.InsertTask(ctx, record("alice::after", "run-1")); err != nil {
			t.Errorf("InsertTask after the listener left: %v", err)
		}
	})
}
