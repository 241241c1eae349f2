package storetest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// The owners the runtime cases act for.
var (
	alice = workers.MustOwner("alice")
	bob   = workers.MustOwner("bob")
	carol = workers.MustOwner("carol")
)

// global submits a key into the global scope.
var global = workers.WithScope(workers.ScopeGlobal)

// pollInterval is how often a wait re-checks its condition when no write
// through the recorder has woken it first.
const pollInterval = 10 * time.Millisecond

// testRuntime is the runtime every case builds: over the Store interface,
// so that the recorder can stand in front of any store.
type testRuntime = workers.Runtime[workers.Store]

// harness is what a runtime case works with: the store under test, the
// runtimes it builds over that store, and the gates its callbacks block
// on. It is used from the case's body only, on the watchdog's goroutine;
// callbacks, which run on the runtime's goroutines, report with t.Error.
type harness struct {
	su  *suite
	t   *testing.T
	ctx context.Context // the watchdog's: cancelled when the case runs out of time

	store workers.Store // the store under test; the case's direct calls use it
	rec   workers.Store // the same store behind a recorder, as the runtimes see it
	log   *writeLog

	runtimes []*testRuntime // every runtime built; teardown shuts them down
	gates    []*gate        // every gate made; teardown opens them
	over     atomic.Bool    // set when teardown is done; the runtimes' logger goes quiet
}

// withRuntime adapts a runtime case body to the case table. It runs body
// under the watchdog with a harness over the store, and tears the harness
// down when body returns or gives up: it opens every gate, so that no
// callback is left blocked, and shuts every runtime down, so that no
// goroutine outlives the case.
func withRuntime(body func(h *harness)) func(*suite, *testing.T, workers.Store) {
	return func(su *suite, t *testing.T, s workers.Store) {
		su.within(t, func(ctx context.Context) {
			log := newWriteLog()
			h := &harness{su: su, t: t, ctx: ctx, store: s, rec: observe(s, log), log: log}
			defer h.teardown()
			body(h)
		})
	}
}

func (h *harness) teardown() {
	for _, g := range h.gates {
		g.open()
	}
	// h.ctx may have ended already; the drain gets a bound of its own.
	ctx, cancel := context.WithTimeout(context.Background(), h.su.timeout)
	defer cancel()
	for _, rt := range h.runtimes {
		if err := rt.Shutdown(ctx); err != nil {
			h.t.Errorf("teardown: Shutdown: %v", err)
		}
	}
	h.over.Store(true)
}

// fatalf reports a failure and ends the case. The body runs on the
// watchdog's goroutine, where t.Fatal must not be called, so fatalf
// reports with t.Errorf and leaves with runtime.Goexit, which runs the
// deferred teardown just as t.Fatal would. Call it from the case body
// only, never from a callback.
func (h *harness) fatalf(format string, args ...any) {
	h.t.Helper()
	h.t.Errorf(format, args...)
	runtime.Goexit()
}

// must ends the case if err is not nil.
func (h *harness) must(err error, format string, args ...any) {
	h.t.Helper()
	if err != nil {
		h.fatalf("%s: %v", fmt.Sprintf(format, args...), err)
	}
}

// runtime returns a new runtime over the store, which teardown shuts
// down. Unless cfg names a logger, every error the runtime logs (a store
// write on a run's behalf that failed) fails the case.
func (h *harness) runtime(cfg workers.Config) *testRuntime {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(failHandler{h: h})
	}
	rt := workers.NewRuntime(h.rec, cfg)
	h.runtimes = append(h.runtimes, rt)
	return rt
}

// shutdown shuts rt down and ends the case unless every run settled.
func (h *harness) shutdown(rt *testRuntime) {
	h.t.Helper()
	h.must(rt.Shutdown(h.ctx), "Shutdown")
}

// wait blocks until ch is closed, and ends the case if it runs out of
// time first.
func (h *harness) wait(ch <-chan struct{}, what string) {
	h.t.Helper()
	select {
	case <-ch:
	case <-h.ctx.Done():
		h.fatalf("gave up waiting for %s: the case ran out of time", what)
	}
}

// poll calls cond until it reports true, and reports whether it did
// before the case ran out of time. It re-checks after every write a
// runtime makes through the recorder, and every pollInterval besides;
// the watchdog's context is its deadline, so it never waits longer than
// the suite's Timeout.
func (h *harness) poll(cond func() bool) bool {
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		woken := h.log.changed()
		if cond() {
			return true
		}
		select {
		case <-woken:
		case <-tick.C:
		case <-h.ctx.Done():
			return false
		}
	}
}

// eventually polls cond and ends the case if it never holds.
func (h *harness) eventually(what string, cond func() bool) {
	h.t.Helper()
	if !h.poll(cond) {
		h.fatalf("gave up waiting for %s: the case ran out of time", what)
	}
}

// submit submits fn as key on the async path, ending the case on an error.
func (h *harness) submit(rt *testRuntime, key string, fn workers.Func, auth workers.TaskAuthority, opts ...workers.SubmitOption) workers.Submission {
	h.t.Helper()
	sub, err := rt.Submit(h.ctx, key, fn, auth, opts...)
	h.must(err, "Submit(%q) for %v", key, auth)
	return sub
}

// submitSeq submits fn as key on the sequential queue, ending the case
// on an error.
func (h *harness) submitSeq(rt *testRuntime, queue, key string, fn workers.Func, auth workers.TaskAuthority, opts ...workers.SubmitOption) workers.Submission {
	h.t.Helper()
	sub, err := rt.SubmitSequential(h.ctx, queue, key, fn, auth, opts...)
	h.must(err, "SubmitSequential(%q, %q) for %v", queue, key, auth)
	return sub
}

// status returns rt's snapshot of id as auth sees it, ending the case on
// an error.
func (h *harness) status(rt *testRuntime, id string, auth workers.TaskAuthority) workers.Snapshot {
	h.t.Helper()
	snap, err := rt.Status(h.ctx, id, auth)
	h.must(err, "Status(%q) for %v", id, auth)
	return snap
}

// settled waits until the task id is terminal and returns its snapshot.
func (h *harness) settled(rt *testRuntime, id string) workers.Snapshot {
	h.t.Helper()
	var snap workers.Snapshot
	if !h.poll(func() bool {
		snap = h.status(rt, id, workers.System)
		return snap.Status.Terminal()
	}) {
		h.fatalf("gave up waiting for task %q to end: it is still %s", id, snap.Status)
	}
	return snap
}

// stored returns the store's record for id, ending the case if there is
// none.
func (h *harness) stored(id string) workers.Record {
	h.t.Helper()
	r, err := h.store.GetTask(h.ctx, id)
	h.must(err, "GetTask(%q)", id)
	return r
}

// insert stores recs directly, ending the case if the store refuses one.
func (h *harness) insert(recs ...workers.Record) {
	h.t.Helper()
	for _, r := range recs {
		h.must(h.store.InsertTask(h.ctx, r), "setup: InsertTask(%q)", r.ID)
	}
}

// wantStored fails the case unless the store holds want for want.ID.
func (h *harness) wantStored(want workers.Record) {
	h.t.Helper()
	if d := diff(h.stored(want.ID), want); d != "" {
		h.t.Errorf("the store's record %q changed:%s", want.ID, d)
	}
}

// wantMissing fails the case unless the store has no record for id.
func (h *harness) wantMissing(id string) {
	h.t.Helper()
	if _, err := h.store.GetTask(h.ctx, id); !errors.Is(err, workers.ErrNotFound) {
		h.t.Errorf("GetTask(%q): error %v, want ErrNotFound", id, err)
	}
}

// wantEnded fails the case unless snap is in status under runID, with a
// completion time, the recorded message msg (unless msg is ""), and an
// Err that is nil for COMPLETED, and otherwise an error matching cause
// (any error, if cause is nil).
func (h *harness) wantEnded(snap workers.Snapshot, runID string, status workers.Status, msg string, cause error) {
	h.t.Helper()
	if snap.Status != status || snap.RunID != runID {
		h.t.Errorf("task %q is %s under run %q, want %s under run %q", snap.ID, snap.Status, snap.RunID, status, runID)
	}
	if msg != "" && snap.Error != msg {
		h.t.Errorf("task %q recorded the message %q, want %q", snap.ID, snap.Error, msg)
	}
	switch err := snap.Err(); {
	case status == workers.StatusCompleted && err != nil:
		h.t.Errorf("task %q: Snapshot.Err() = %v, want nil", snap.ID, err)
	case status != workers.StatusCompleted && err == nil:
		h.t.Errorf("task %q: Snapshot.Err() = nil for a %s task", snap.ID, snap.Status)
	case cause != nil && !errors.Is(err, cause):
		h.t.Errorf("task %q: Snapshot.Err() = %v, want an error matching %v", snap.ID, err, cause)
	}
	if snap.CompletedAt.IsZero() {
		h.t.Errorf("task %q is %s without a completion time", snap.ID, snap.Status)
	}
}

// returns is a callback that returns v at once.
func returns(v any) workers.Func {
	return func(context.Context, *workers.Task) (any, error) { return v, nil }
}

// counter is a callback that counts its calls.
type counter struct{ calls atomic.Int32 }

func (c *counter) fn(context.Context, *workers.Task) (any, error) {
	c.calls.Add(1)
	return "counted", nil
}

// gate is a callback the case controls. It signals when it starts, and
// returns its result when the case opens it or, unless it is stubborn,
// its context's cause when its context ends first.
type gate struct {
	result   any
	stubborn bool // it ignores its context, as a callback stuck in a blocking call does

	started chan struct{} // closed when the callback starts
	release chan struct{} // closed by open
	ran     chan struct{} // closed when the callback returns

	// task is written before started is closed, and cause before ran is
	// closed; each is read only after.
	task  *workers.Task
	cause error // the context's cause when the callback returned; nil if it had not ended

	startOnce, openOnce, ranOnce sync.Once
}

// gate returns a gate that returns result when opened, or its context's
// cause when that ends first. Teardown opens it.
func (h *harness) gate(result any) *gate {
	g := &gate{result: result, started: make(chan struct{}), release: make(chan struct{}), ran: make(chan struct{})}
	h.gates = append(h.gates, g)
	return g
}

// stubbornGate returns a gate that ignores its context: it returns result
// only when opened.
func (h *harness) stubbornGate(result any) *gate {
	g := h.gate(result)
	g.stubborn = true
	return g
}

func (g *gate) fn(ctx context.Context, t *workers.Task) (any, error) {
	g.startOnce.Do(func() {
		g.task = t
		close(g.started)
	})
	defer g.ranOnce.Do(func() {
		if ctx.Err() != nil {
			g.cause = context.Cause(ctx)
		}
		close(g.ran)
	})
	if g.stubborn {
		<-g.release
		return g.result, nil
	}
	select {
	case <-g.release:
		return g.result, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// open releases the callback; opening twice is harmless.
func (g *gate) open() { g.openOnce.Do(func() { close(g.release) }) }

// transitionCall is one TransitionTask call a runtime made, as the
// recorder saw it return.
type transitionCall struct {
	id, runID string
	from      []workers.Status
	next      workers.Status
	ok        bool
	err       error
}

// writeLog is what the recorder saw, and the signal that wakes waits.
type writeLog struct {
	mu     sync.Mutex
	calls  []transitionCall // guarded by mu
	change chan struct{}    // guarded by mu: closed, and replaced, after every write
}

func newWriteLog() *writeLog { return &writeLog{change: make(chan struct{})} }

// note records c, if not nil, and wakes every waiter.
func (l *writeLog) note(c *transitionCall) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c != nil {
		l.calls = append(l.calls, *c)
	}
	close(l.change)
	l.change = make(chan struct{})
}

// changed returns a channel closed by the next write.
func (l *writeLog) changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.change
}

// find returns the first call match accepts.
func (l *writeLog) find(match func(*transitionCall) bool) (transitionCall, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.calls {
		if match(&l.calls[i]) {
			return l.calls[i], true
		}
	}
	return transitionCall{}, false
}

// terminalWrite waits until the run runID has asked the store for a
// terminal transition, and returns that call as the store answered it.
func (h *harness) terminalWrite(runID, what string) transitionCall {
	h.t.Helper()
	var c transitionCall
	h.eventually(what, func() bool {
		var ok bool
		c, ok = h.log.find(func(c *transitionCall) bool { return c.runID == runID && c.next.Terminal() })
		return ok
	})
	return c
}

// recorder is the store as a case's runtimes see it: every call goes
// through to the store under test unchanged, and each write is noted in
// the log once it returns, so that a case can wait for a run's write
// instead of sleeping.
type recorder struct {
	workers.Store
	log *writeLog
}

// observe returns s behind a recorder noting into log. The recorder has
// exactly the optional capabilities of s, so that a runtime over it
// behaves as over s: it forwards workers.Leaser and workers.Notifier
// untouched, and notes workers.RecordClearer's writes. A new optional
// interface needs forwarding here too.
func observe(s workers.Store, log *writeLog) workers.Store {
	r := recorder{Store: s, log: log}
	l, isL := s.(workers.Leaser)
	n, isN := s.(workers.Notifier)
	_, isC := s.(workers.RecordClearer)
	c := clearing{r}
	switch {
	case isL && isN && isC:
		return struct {
			recorder
			workers.Leaser
			workers.Notifier
			clearing
		}{r, l, n, c}
	case isL && isN:
		return struct {
			recorder
			workers.Leaser
			workers.Notifier
		}{r, l, n}
	case isL && isC:
		return struct {
			recorder
			workers.Leaser
			clearing
		}{r, l, c}
	case isN && isC:
		return struct {
			recorder
			workers.Notifier
			clearing
		}{r, n, c}
	case isL:
		return struct {
			recorder
			workers.Leaser
		}{r, l}
	case isN:
		return struct {
			recorder
			workers.Notifier
		}{r, n}
	case isC:
		return struct {
			recorder
			clearing
		}{r, c}
	}
	return r
}

// clearing forwards workers.RecordClearer for a recorder, noting it.
type clearing struct{ r recorder }

func (c clearing) ClearRecords(ctx context.Context) error {
	defer c.r.log.note(nil)
	return c.r.Store.(workers.RecordClearer).ClearRecords(ctx)
}

func (r recorder) InsertTask(ctx context.Context, rec workers.Record) error {
	defer r.log.note(nil)
	return r.Store.InsertTask(ctx, rec)
}

func (r recorder) SetTask(ctx context.Context, rec workers.Record) error {
	defer r.log.note(nil)
	return r.Store.SetTask(ctx, rec)
}

func (r recorder) ReplaceTask(ctx context.Context, rec workers.Record, prevRunID string) error {
	defer r.log.note(nil)
	return r.Store.ReplaceTask(ctx, rec, prevRunID)
}

func (r recorder) TransitionTask(ctx context.Context, id, runID string, from []workers.Status, next workers.State) (bool, error) {
	ok, err := r.Store.TransitionTask(ctx, id, runID, from, next)
	r.log.note(&transitionCall{id: id, runID: runID, from: slices.Clone(from), next: next.Status, ok: ok, err: err})
	return ok, err
}

func (r recorder) AddWatcher(ctx context.Context, id, runID, watcher string) (bool, error) {
	defer r.log.note(nil)
	return r.Store.AddWatcher(ctx, id, runID, watcher)
}

func (r recorder) DeleteFinished(ctx context.Context, cutoff time.Time) (int, error) {
	defer r.log.note(nil)
	return r.Store.DeleteFinished(ctx, cutoff)
}

// failHandler is the runtimes' logger: it fails the case on every
// warning or error but those of the application's own code (a callback
// that panics or calls runtime.Goexit, an authorizer that panics), since
// the runtime otherwise logs only the store errors no caller sees (a
// write on a run's behalf, a cleanup) and a conforming store causes none.
type failHandler struct {
	h     *harness
	attrs []slog.Attr
}

func (f failHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (f failHandler) Handle(_ context.Context, r slog.Record) error {
	if f.h.over.Load() {
		return nil // a run the teardown could not settle; the case has failed already
	}
	if slices.Contains(applicationFaults, r.Message) {
		return nil // logged with its stack: the application's fault, not the store's
	}
	var b strings.Builder
	b.WriteString(r.Message)
	for _, a := range f.attrs {
		fmt.Fprintf(&b, " %v", a)
	}
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %v", a)
		return true
	})
	f.h.t.Errorf("the runtime logged: %s", b.String())
	return nil
}

// applicationFaults are the messages the runtime logs of the
// application's own code.
var applicationFaults = []string{
	"workers: task panicked",
	"workers: task called runtime.Goexit",
	"workers: the queue authorizer panicked; the submission is denied",
	"workers: the watch authorizer panicked; the submission is denied",
}

func (f failHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return failHandler{h: f.h, attrs: append(slices.Clip(f.attrs), attrs...)}
}

func (f failHandler) WithGroup(string) slog.Handler { return f }
