package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/taskgate/workers"
)

// ErrInjected is the error a [Rule] without an Err of its own makes a
// store call return. The runtime treats it as it treats a dropped
// connection: a transient error, after which the write may have landed.
var ErrInjected = errors.New("storetest: injected store fault")

// Op names a store method, for a [Rule] to select and for the counts of
// [Faults].
type Op string

// The methods a faulty store can fail: those of [workers.Store] and of
// the optional capabilities it passes through.
const (
	OpGetTask        Op = "GetTask"
	OpInsertTask     Op = "InsertTask"
	OpSetTask        Op = "SetTask"
	OpReplaceTask    Op = "ReplaceTask"
	OpTransitionTask Op = "TransitionTask"
	OpAddWatcher     Op = "AddWatcher"
	OpListTasks      Op = "ListTasks"
	OpDeleteFinished Op = "DeleteFinished"
	OpClearRecords   Op = "ClearRecords"  // workers.RecordClearer
	OpRenewLease     Op = "RenewLease"    // workers.Leaser
	OpReleaseLease   Op = "ReleaseLease"  // workers.Leaser
	OpLiveInstances  Op = "LiveInstances" // workers.Leaser
	OpListen         Op = "Listen"        // workers.Notifier
)

// Fault is what a [Rule] does to a call it selects.
type Fault uint8

const (
	// FailBefore returns the rule's error without calling the inner
	// store: the write never lands.
	FailBefore Fault = iota + 1
	// FailAfter calls the inner store, discards what it returned, and
	// returns the rule's error: the write has landed, but its caller is
	// told it failed (a commit whose acknowledgement was lost).
	FailAfter
	// Hang blocks the call until its context ends, and then returns the
	// context's error without calling the inner store, or until
	// [Faults.Release], and then goes on to the inner store: a database
	// that froze and resumed.
	Hang
	// Delay waits the rule's Delay, or until the context ends (returning
	// its error), and then calls the inner store.
	Delay
	// HangAfter calls the inner store, and then blocks until the call's
	// context ends, and returns the context's error, or until
	// [Faults.Release], and returns what the inner store returned: a
	// database that committed the write and froze before it answered.
	HangAfter
)

func (f Fault) String() string {
	switch f {
	case FailBefore:
		return "fail-before"
	case FailAfter:
		return "fail-after"
	case Hang:
		return "hang"
	case Delay:
		return "delay"
	case HangAfter:
		return "hang-after"
	}
	return fmt.Sprintf("Fault(%d)", uint8(f))
}

// Call is one store call as a [Rule] sees it. Only the fields of the
// method called are set; pointers point at the call's own arguments and
// must be treated as read-only.
type Call struct {
	Op Op  // the method called
	N  int // this call's number among the calls of Op, from 1

	ID       string           // the task id, for the methods that take one
	RunID    string           // TransitionTask's and AddWatcher's run id; ReplaceTask's prevRunID
	From     []workers.Status // TransitionTask's from list
	Next     *workers.State   // TransitionTask's next state
	Record   *workers.Record  // InsertTask's, SetTask's and ReplaceTask's record
	Filter   *workers.Filter  // ListTasks' filter
	Watcher  string           // AddWatcher's watcher
	Instance string           // RenewLease's and ReleaseLease's instance
	TTL      time.Duration    // RenewLease's ttl
}

// Rule selects store calls and the fault each suffers. Every field that
// is set must match; a zero Rule with a Fault fails every call.
type Rule struct {
	Op    Op               // the method; "" selects every method
	Nth   int              // when positive, only the Nth call of Op (or of every method, with no Op)
	Match func(*Call) bool // when set, only the calls it accepts
	Times int              // when positive, the rule fires that many times and then stops

	Fault Fault         // what the selected calls suffer
	Err   error         // the error FailBefore and FailAfter return; defaults to ErrInjected
	Delay time.Duration // Delay's wait
}

// Faults is the fault schedule of one or more stores wrapped by
// [Faulty]: its rules, the calls counted per method, and the calls hung
// now. Its zero value has no rules and is ready to use. It is safe for
// concurrent use.
//
// Rules are tried in the order they were added; the first that selects a
// call decides its fault, and a call no rule selects goes through
// untouched. A Rule's Match runs with the schedule's lock held, one call
// at a time, so it may use state of its own without locking (a seeded
// *rand.Rand, say), but must not call the store. A schedule is
// reproducible to the extent that the calls reach it in a reproducible
// order: concurrent callers make the order, not the schedule.
type Faults struct {
	mu       sync.Mutex
	rules    []*ruleState  // guarded by mu
	calls    map[Op]int    // guarded by mu
	injected map[Op]int    // guarded by mu
	total    int           // guarded by mu: calls of every method
	release  chan struct{} // guarded by mu: closed by Release, then replaced
	hung     int           // guarded by mu: calls hung now
	changed  chan struct{} // guarded by mu: closed, and replaced, at every injection
}

type ruleState struct {
	Rule
	fired int
}

// Add appends r to the schedule and returns the func that removes it.
// A rule with no Fault is refused with a panic: it is a bug in the test.
func (f *Faults) Add(r Rule) (remove func()) {
	if r.Fault < FailBefore || r.Fault > HangAfter {
		panic("storetest: Rule without a valid Fault")
	}
	rs := &ruleState{Rule: r}
	f.mu.Lock()
	f.rules = append(f.rules, rs)
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		for i, x := range f.rules {
			if x == rs {
				f.rules = append(f.rules[:i:i], f.rules[i+1:]...)
				return
			}
		}
	}
}

// Clear removes every rule; calls already hung stay hung until
// [Faults.Release] or their context's end.
func (f *Faults) Clear() {
	f.mu.Lock()
	f.rules = nil
	f.mu.Unlock()
}

// Heal removes every rule and releases every hung call: the store works
// again.
func (f *Faults) Heal() {
	f.Clear()
	f.Release()
}

// Release lets every call hung now go on: a [Hang] call to the inner
// store, a [HangAfter] call back to its caller with the inner store's
// answer. Calls that hang later wait for the next Release.
func (f *Faults) Release() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.release != nil {
		close(f.release)
		f.release = nil
	}
}

// Calls returns how many calls of op reached the faulty store, faulted
// or not.
func (f *Faults) Calls(op Op) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

// Injected returns how many calls of op suffered a fault; with op "", of
// every method.
func (f *Faults) Injected(op Op) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if op == "" {
		n := 0
		for _, c := range f.injected {
			n += c
		}
		return n
	}
	return f.injected[op]
}

// Hung returns how many calls are hung now.
func (f *Faults) Hung() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hung
}

// WaitInjected blocks until at least n faults have been injected into
// calls of op (of every method, with op ""), or ctx ends, and returns
// ctx's error then. A test waits with it for a fault to have happened
// instead of sleeping.
func (f *Faults) WaitInjected(ctx context.Context, op Op, n int) error {
	for {
		f.mu.Lock()
		got := 0
		for o, c := range f.injected {
			if op == "" || o == op {
				got += c
			}
		}
		if f.changed == nil {
			f.changed = make(chan struct{})
		}
		ch := f.changed
		f.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// decide counts c and returns the rule that selects it, if any.
func (f *Faults) decide(c *Call) (fault Fault, err error, delay time.Duration, release <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.calls == nil {
		f.calls, f.injected = make(map[Op]int), make(map[Op]int)
	}
	f.calls[c.Op]++
	f.total++
	c.N = f.calls[c.Op]
	for _, r := range f.rules {
		if r.Op != "" && r.Op != c.Op {
			continue
		}
		if r.Times > 0 && r.fired >= r.Times {
			continue
		}
		if r.Nth > 0 && ((r.Op != "" && r.Nth != c.N) || (r.Op == "" && r.Nth != f.total)) {
			continue
		}
		if r.Match != nil && !r.Match(c) {
			continue
		}
		r.fired++
		f.injected[c.Op]++
		if f.changed != nil {
			close(f.changed)
			f.changed = nil
		}
		if r.Fault == Hang || r.Fault == HangAfter {
			if f.release == nil {
				f.release = make(chan struct{})
			}
			release = f.release
		}
		return r.Fault, cmpErr(r.Err), r.Delay, release
	}
	return 0, nil, 0, nil
}

func cmpErr(err error) error {
	if err == nil {
		return ErrInjected
	}
	return err
}

// hold blocks a hung call until ctx ends, and returns its error, or
// until release is closed, and returns nil.
func (f *Faults) hold(ctx context.Context, release <-chan struct{}) error {
	f.mu.Lock()
	f.hung++
	f.mu.Unlock()
	select {
	case <-ctx.Done():
	case <-release:
	}
	f.mu.Lock()
	f.hung--
	f.mu.Unlock()
	return ctx.Err()
}

// around runs call, the inner store's method, under the fault the
// schedule picks for c. It returns injected when the fault replaces the
// call's error.
func around(ctx context.Context, f *Faults, c *Call, call func() error) error {
	fault, ferr, delay, release := f.decide(c)
	switch fault {
	case FailBefore:
		return ferr
	case FailAfter:
		_ = call()
		return ferr
	case Hang:
		if err := f.hold(ctx, release); err != nil {
			return err
		}
	case HangAfter:
		err := call()
		if herr := f.hold(ctx, release); herr != nil {
			return herr
		}
		return err
	case Delay:
		timer := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
	}
	return call()
}

// Faulty returns inner behind f's schedule: every call goes to inner
// unless a rule of f selects it. The store returned implements exactly
// the optional capabilities inner implements, of [workers.Leaser],
// [workers.Notifier] and [workers.RecordClearer], so a runtime over it
// behaves as over inner; their calls can be faulted too. Listen can be
// failed or delayed as it starts, not notice by notice. The authorizer
// methods pass through untouched.
//
// Several stores may share one schedule; counts are then kept across
// them.
func Faulty(inner workers.Store, f *Faults) workers.Store {
	core := &faulty{inner: inner, f: f}
	l, isL := inner.(workers.Leaser)
	n, isN := inner.(workers.Notifier)
	c, isC := inner.(workers.RecordClearer)
	fl, fn, fc := faultyLeaser{core, l}, faultyNotifier{core, n}, faultyClearer{core, c}
	switch {
	case isL && isN && isC:
		return struct {
			*faulty
			faultyLeaser
			faultyNotifier
			faultyClearer
		}{core, fl, fn, fc}
	case isL && isN:
		return struct {
			*faulty
			faultyLeaser
			faultyNotifier
		}{core, fl, fn}
	case isL && isC:
		return struct {
			*faulty
			faultyLeaser
			faultyClearer
		}{core, fl, fc}
	case isN && isC:
		return struct {
			*faulty
			faultyNotifier
			faultyClearer
		}{core, fn, fc}
	case isL:
		return struct {
			*faulty
			faultyLeaser
		}{core, fl}
	case isN:
		return struct {
			*faulty
			faultyNotifier
		}{core, fn}
	case isC:
		return struct {
			*faulty
			faultyClearer
		}{core, fc}
	}
	return core
}

// faulty is the Store part of every faulty store.
type faulty struct {
	inner workers.Store
	f     *Faults
}

func (s *faulty) GetTask(ctx context.Context, id string) (rec workers.Record, err error) {
	err = around(ctx, s.f, &Call{Op: OpGetTask, ID: id}, func() error {
		rec, err = s.inner.GetTask(ctx, id)
		return err
	})
	if err != nil {
		return workers.Record{}, err
	}
	return rec, nil
}

func (s *faulty) InsertTask(ctx context.Context, rec workers.Record) error {
	return around(ctx, s.f, &Call{Op: OpInsertTask, ID: rec.ID, Record: &rec}, func() error {
		return s.inner.InsertTask(ctx, rec)
	})
}

func (s *faulty) SetTask(ctx context.Context, rec workers.Record) error {
	return around(ctx, s.f, &Call{Op: OpSetTask, ID: rec.ID, Record: &rec}, func() error {
		return s.inner.SetTask(ctx, rec)
	})
}

func (s *faulty) ReplaceTask(ctx context.Context, rec workers.Record, prevRunID string) error {
	return around(ctx, s.f, &Call{Op: OpReplaceTask, ID: rec.ID, RunID: prevRunID, Record: &rec}, func() error {
		return s.inner.ReplaceTask(ctx, rec, prevRunID)
	})
}

func (s *faulty) TransitionTask(ctx context.Context, id, runID string, from []workers.Status, next workers.State) (ok bool, err error) {
	err = around(ctx, s.f, &Call{Op: OpTransitionTask, ID: id, RunID: runID, From: from, Next: &next}, func() error {
		ok, err = s.inner.TransitionTask(ctx, id, runID, from, next)
		return err
	})
	return ok && err == nil, err
}

func (s *faulty) AddWatcher(ctx context.Context, id, runID, watcher string) (ok bool, err error) {
	err = around(ctx, s.f, &Call{Op: OpAddWatcher, ID: id, RunID: runID, Watcher: watcher}, func() error {
		ok, err = s.inner.AddWatcher(ctx, id, runID, watcher)
		return err
	})
	return ok && err == nil, err
}

func (s *faulty) ListTasks(ctx context.Context, f workers.Filter) (recs []workers.Record, err error) {
	err = around(ctx, s.f, &Call{Op: OpListTasks, Filter: &f}, func() error {
		recs, err = s.inner.ListTasks(ctx, f)
		return err
	})
	if err != nil {
		return nil, err
	}
	return recs, nil
}

func (s *faulty) DeleteFinished(ctx context.Context, cutoff time.Time) (n int, err error) {
	err = around(ctx, s.f, &Call{Op: OpDeleteFinished}, func() error {
		n, err = s.inner.DeleteFinished(ctx, cutoff)
		return err
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

func (s *faulty) QueueAuthorizer() workers.QueueAuthorizer { return s.inner.QueueAuthorizer() }

func (s *faulty) SetQueueAuthorizer(a workers.QueueAuthorizer) { s.inner.SetQueueAuthorizer(a) }

func (s *faulty) WatchAuthorizer() workers.WatchAuthorizer { return s.inner.WatchAuthorizer() }

func (s *faulty) SetWatchAuthorizer(a workers.WatchAuthorizer) { s.inner.SetWatchAuthorizer(a) }

// faultyLeaser passes workers.Leaser through, under the schedule.
type faultyLeaser struct {
	s     *faulty
	inner workers.Leaser
}

func (l faultyLeaser) RenewLease(ctx context.Context, instance string, ttl time.Duration) (extended bool, err error) {
	err = around(ctx, l.s.f, &Call{Op: OpRenewLease, Instance: instance, TTL: ttl}, func() error {
		extended, err = l.inner.RenewLease(ctx, instance, ttl)
		return err
	})
	return extended && err == nil, err
}

func (l faultyLeaser) ReleaseLease(ctx context.Context, instance string) error {
	return around(ctx, l.s.f, &Call{Op: OpReleaseLease, Instance: instance}, func() error {
		return l.inner.ReleaseLease(ctx, instance)
	})
}

func (l faultyLeaser) LiveInstances(ctx context.Context) (ids []string, err error) {
	err = around(ctx, l.s.f, &Call{Op: OpLiveInstances}, func() error {
		ids, err = l.inner.LiveInstances(ctx)
		return err
	})
	if err != nil {
		return nil, err
	}
	return ids, nil
}

// faultyNotifier passes workers.Notifier through, under the schedule.
type faultyNotifier struct {
	s     *faulty
	inner workers.Notifier
}

func (n faultyNotifier) Listen(ctx context.Context, changed func(workers.Change)) error {
	return around(ctx, n.s.f, &Call{Op: OpListen}, func() error {
		return n.inner.Listen(ctx, changed)
	})
}

// faultyClearer passes workers.RecordClearer through, under the schedule.
type faultyClearer struct {
	s     *faulty
	inner workers.RecordClearer
}

func (c faultyClearer) ClearRecords(ctx context.Context) error {
	return around(ctx, c.s.f, &Call{Op: OpClearRecords}, func() error {
		return c.inner.ClearRecords(ctx)
	})
}
