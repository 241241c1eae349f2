package workers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// shutdownSlack is how long past its context's end Shutdown may take to
// give up: store calls it makes or waits for are cut off then. A write
// of its own in a store call that ignores its context is waited for one
// slack more.
const shutdownSlack = 100 * time.Millisecond

// Shutdown stops the runtime in the manner of http.Server.Shutdown: it
// stops intake, lets the runs in flight finish for a grace period, then
// cancels what remains and waits until every run has settled or ctx
// ends. In order, it:
//
//  1. closes the runtime to submissions (submit calls return ErrClosed
//     from then on, and so do those still waiting for the instance
//     lease), stops every sequential queue fetching, and admission
//     dispatching (see Limits), and records each item that never
//     started, queued or waiting for a slot, CANCELLED with the shutdown
//     message: up to 16 such writes at once, alongside the steps below,
//     so that a long backlog does not take the time the runs in flight
//     are given;
//  2. waits, until the grace point (see 3), for submissions already
//     registering; one that registers later is cancelled at once;
//  3. lets callbacks in flight run until the grace point (see
//     Config.ShutdownGrace: by default three quarters of the time ctx
//     leaves), then cancels those still running with ErrShutdown; a run
//     waiting out a retry backoff, with no callback in flight, begins no
//     other attempt: it is cancelled at once;
//  4. waits until every run has settled and its terminal record is
//     written, or ctx ends; then stops the background loops and, if
//     everything settled, releases the instance lease (a release in a
//     store call that ignores its context is let go after 200 ms, and
//     left to end by itself).
//
// What a cancelled run records is its own doing: COMPLETED if its
// callback returns a result anyway, FAILED if it panics, CANCELLED with
// "Cancelled by worker shutdown" if it returns an error after its
// context ended.
// Shutdown holds no lock while it waits. Do not call it from inside a
// task's callback: it would wait for that callback.
//
// Shutdown returns by ctx's deadline plus a small constant, even over a
// store that hangs: every store call made for it, or on a run's behalf, is
// cut off then. It returns nil when everything settled, and otherwise a
// *ShutdownError that counts what was left and names its tasks, wrapping
// ctx.Err() when ctx ended (when it did not, the store refused the
// records' writes, or an earlier Shutdown or a Reset gave them up): runs
// whose callbacks still execute (they keep their handles, and release
// them when they return; each then makes one try, of at most 5 seconds,
// at writing its outcome, and its record stays live if
// that fails; if another runtime's recovery ended it meanwhile, the
// observers hear that end), submissions still registering and queue items
// still being recorded (each in a store call that ignores its context),
// and records that could not be written in time (a queue item still
// PENDING, whose write gave up or had not begun, and then never begins;
// a run still RUNNING). Such records belong to this runtime's
// instance: once its lease expires (it is no longer renewed), any
// runtime's recovery ends them as abandoned; over a store without leases,
// RecoverZombies does. The writes given up at the cutoff are logged
// with Config.Logger in one line, which counts them, by kind, and names
// a few; the error names them (see ShutdownError.UnwrittenIDs). An
// already-done ctx means "do not wait". Calling Shutdown again waits
// again for what is left. A runtime cannot be started again after
// Shutdown.
//
// A nil ctx bounds nothing, and is no way to say "wait forever" (pass
// context.Background for that): Shutdown refuses it with
// ErrInvalidOption before doing anything, and the runtime stays open.
func (rt *Runtime[S]) Shutdown(ctx context.Context) error {
	if err := checkContext(ctx); err != nil {
		return err
	}
	// Past ctx's end plus the slack, every store call is cut off.
	returned := make(chan struct{})
	stopCut := context.AfterFunc(ctx, func() {
		timer := time.NewTimer(shutdownSlack)
		defer timer.Stop()
		select {
		case <-timer.C:
			rt.endLife(ErrClosed)
		case <-returned:
		}
	})
	defer func() {
		close(returned)
		stopCut()
	}()
	grace := rt.gracePoint(ctx)

	// Queues and admission stop as the intake closes, not once the
	// submissions still registering are in: a slot freed meanwhile must
	// not start a waiting task. One of those submissions that queues or
	// waits later is cancelled at once (see dispatch).
	submitting := []<-chan struct{}{rt.gate.close()}
	var backlog []*Task
	if rt.adm != nil {
		// First: a slot freed while the queues drain must start nothing.
		// A queue item waiting for a slot is woken to cancel itself.
		backlog = rt.adm.drain()
	}
	queues, queued := rt.emptyQueues((*queue).drain)
	backlog = append(backlog, queued...)
	// The backlog is recorded beside the grace period, not before it: a
	// long one must not take the time the runs in flight are given.
	abandoned := make(chan struct{})
	go func() {
		defer close(abandoned)
		rt.abandon(rt.life, backlog)
	}()
	// A submission that is slow to register (its store call waits on a
	// lock, say) does not put off the grace point: the runs in flight
	// are cancelled then all the same, and it, once in, cancels its own.
	graceCtx, cancel := context.WithDeadline(ctx, grace)
	defer cancel()
	waitAll(graceCtx, submitting)

	// The backlog's items are in flight too, but are counted apart, once
	// their writes end (see below).
	inflight := rt.runs.all()
	inBacklog := make(map[*Task]struct{}, len(backlog))
	for _, t := range backlog {
		inBacklog[t] = struct{}{}
	}
	done := make([]<-chan struct{}, 0, len(inflight)+len(queues))
	for _, t := range inflight {
		if _, ok := inBacklog[t]; !ok {
			done = append(done, t.doneChan())
		}
	}
	waitAll(graceCtx, done)
	for _, t := range inflight {
		t.cancel(ErrShutdown)
	}
	// The runs left are counted at the end, from their state then (see
	// leftBehind); the wait for them is the same.
	runsLeft := waitAll(ctx, done)
	// Runners and queue processors end once their runs have settled: they
	// are counted only when no run is left, or each unsettled run would
	// count twice (see below for runs that settle after this wait).
	ends := make([]<-chan struct{}, 0, len(queues)+1)
	for _, q := range queues {
		ends = append(ends, q.exited)
	}
	ends = append(ends, rt.runners.stop())
	open := 0
	if runsLeft == 0 {
		open = rt.waitEnding(ctx, ends)
	}

	rt.mu.Lock()
	loops := rt.loops.halt()
	rt.mu.Unlock()
	waits := make([]<-chan struct{}, len(loops))
	for i, l := range loops {
		waits[i] = l
	}
	// Halted loops return at once, unless a store call ignores its
	// context.
	open += rt.waitEnding(ctx, waits)
	// The backlog's writes end by the cutoff (ctx's end plus the slack),
	// with every store call: what they could not write is counted below,
	// among the unwritten records, with the items whose writes had not
	// begun by then. A write in a store call that ignores its context is
	// not waited for once the cutoff is a slack behind: its item is
	// counted below, as left executing.
	if waitAll(rt.life, []<-chan struct{}{abandoned}) > 0 {
		timer := time.NewTimer(shutdownSlack)
		select {
		case <-abandoned:
		case <-timer.C:
		}
		timer.Stop()
	}
	// A submission still inside, its store call ignoring its context, is
	// a goroutine executing too: it may yet register a run.
	if waitAll(ctx, submitting) > 0 {
		open += rt.gate.count()
	}
	// One that registered since the runs were listed (the wait for the
	// intake ran out first) has a run that list missed.
	open += waitAll(ctx, rt.lateRuns(inflight))

	se := rt.leftBehind(inflight, inBacklog)
	open += se.Executing
	if runsLeft > 0 && !slices.ContainsFunc(inflight, func(t *Task) bool { return !t.isSettled() }) {
		// The runs left at the wait have settled since: their runners and
		// queue processors end now, and are waited for until the cutoff.
		open += waitAll(rt.life, ends)
	}
	// The lease is released once, by the Shutdown that settled
	// everything, in the runtime's life, or, once an earlier Shutdown's
	// cutoff ended that, within this one's ctx.
	within := rt.life
	if within.Err() != nil {
		within = ctx
	}
	if l, ok := any(rt.store).(Leaser); ok && open == 0 && se.Unwritten == 0 && rt.lease.held.Load() &&
		within.Err() == nil && rt.lease.released.CompareAndSwap(false, true) {
		rt.releaseLease(within, l)
	}
	if open == 0 && se.Unwritten == 0 {
		rt.endLife(ErrClosed)
		rt.logCutoff(cutoffAtShutdown, true)
		return nil
	}
	// Without ctx's error, nothing cut this Shutdown short: the store
	// refused those writes, or an earlier Shutdown's cutoff, or a Reset,
	// gave them up. The runtime's life, ended by such a cutoff, says
	// nothing of this call.
	rt.endLife(ErrClosed)
	// After the life's end: a write still in flight that gives up at it
	// meanwhile is in this line, and one that gives up later logs its own.
	rt.logCutoff(cutoffAtShutdown, true)
	se.Executing, se.Err = open, ctx.Err()
	return se
}

// waitEnding is waitAll for goroutines just told to end (runners, queue
// processors, loops): when ctx has ended already, they get until the
// cutoff (ctx's end plus the slack), so that an idle runtime told not to
// wait does not count one as left running for the instant it takes to
// return.
func (rt *Runtime[S]) waitEnding(ctx context.Context, chans []<-chan struct{}) int {
	if ctx.Err() != nil {
		ctx = rt.life
	}
	return waitAll(ctx, chans)
}

// releaseLease releases the instance lease, in a call within ctx cut
// off after shutdownSlack; a store call that ignores its context is
// waited for one slack more, and then left to end by itself: the lease
// expires anyway.
func (rt *Runtime[S]) releaseLease(ctx context.Context, l Leaser) {
	released := make(chan struct{})
	go func() {
		defer close(released)
		release, cancel := context.WithTimeout(ctx, shutdownSlack)
		defer cancel()
		if err := l.ReleaseLease(release, rt.instance); err != nil {
			rt.cfg.Logger.Info("workers: releasing the lease failed; it expires by itself, and no run of this instance is left", "instance", rt.instance, "err", err)
		}
	}()
	timer := time.NewTimer(2 * shutdownSlack)
	defer timer.Stop()
	select {
	case <-released:
	case <-timer.C:
		rt.cfg.Logger.Info("workers: the store did not answer the lease's release; it expires by itself, and no run of this instance is left", "instance", rt.instance)
	}
}

// leftBehind counts and names, from their state now, what Shutdown
// leaves: among inflight (the runs Shutdown listed, less the backlog),
// the runs still executing, and those inside a write of their own record
// (the store hangs, or fails), which gives up at the cutoff: an outcome,
// or a start or a retry, before which no callback is in flight; among
// the backlog's items (inBacklog), those in an abandon write, in a store
// call that ignores its context, as executing, and, past the cutoff,
// those whose abandon writes never began, which it gives up here, so that
// none begins after Shutdown returns; and every write the runtime gave
// up. It looks under the lock the writes give up under, so a write that
// gives up meanwhile is counted once. ExecutingIDs also names the runs
// registered since the list that are not settled (counted apart). Each
// list is sorted and names a task once.
func (rt *Runtime[S]) leftBehind(inflight []*Task, inBacklog map[*Task]struct{}) *ShutdownError {
	se := &ShutdownError{}
	rt.left.mu.Lock()
	se.Unwritten = rt.left.n
	se.UnwrittenIDs = slices.Clone(rt.left.ids)
	seen := make(map[*Task]struct{}, len(inflight)+len(inBacklog))
	for t := range inBacklog {
		seen[t] = struct{}{}
		switch {
		case t.isSettled(), t.has(runGaveUp):
			// Ended, or counted among the writes given up.
		case !t.has(runAbandonBegun) && rt.life.Err() != nil:
			// Its abandon write has not begun, and the cutoff is past: it
			// is given up here, and never begins (see beginAbandon).
			rt.left.addCut(opAbandon, t, nil) // no try: nothing to log on its own
			se.Unwritten++
			se.UnwrittenIDs = append(se.UnwrittenIDs, t.ID())
		default:
			// In its abandon write: a store call that ignores its
			// context past the cutoff.
			se.Executing++
			se.ExecutingIDs = append(se.ExecutingIDs, t.ID())
		}
	}
	for _, t := range inflight {
		if _, queued := inBacklog[t]; queued {
			continue
		}
		seen[t] = struct{}{}
		switch settled := t.isSettled(); {
		case settled, t.has(runGaveUp):
			// Ended, or counted among the writes given up.
		case t.has(runWriting):
			// Inside a write of its own record: its outcome, or a start
			// or a retry, before which no callback is in flight.
			se.Unwritten++
			se.UnwrittenIDs = append(se.UnwrittenIDs, t.ID())
		default:
			se.Executing++
			se.ExecutingIDs = append(se.ExecutingIDs, t.ID())
		}
	}
	rt.left.mu.Unlock()
	for _, t := range rt.runs.all() {
		if _, ok := seen[t]; !ok && !t.isSettled() {
			se.ExecutingIDs = append(se.ExecutingIDs, t.ID()) // registered late, counted apart
		}
	}
	slices.Sort(se.ExecutingIDs)
	slices.Sort(se.UnwrittenIDs)
	se.ExecutingIDs, se.UnwrittenIDs = slices.Compact(se.ExecutingIDs), slices.Compact(se.UnwrittenIDs)
	return se
}

// maxLeftIDs bounds the ids of records left unwritten that a runtime
// keeps to name in a ShutdownError; its counts go on beyond it.
const maxLeftIDs = 1000

// leftIDs counts the writes a runtime gave up, and keeps the ids of
// their records (see Runtime.giveUp).
type leftIDs struct {
	mu  sync.Mutex
	n   int      // guarded by mu: writes given up
	ids []string // guarded by mu: their ids, at most maxLeftIDs

	cut       cutTally // guarded by mu: the writes given up at a cutoff, not yet logged
	cutLogged bool     // guarded by mu: Shutdown logged its cutoff's line (see Runtime.cutShort)
}

// add counts the write of t as given up. l.mu is held.
func (l *leftIDs) add(t *Task) {
	t.mark(runGaveUp)
	if l.n++; len(l.ids) < maxLeftIDs {
		l.ids = append(l.ids, t.ID())
	}
}

// addCut is add for a write of op given up at a cutoff, with err, its
// last try's error (nil if it made none): it is tallied for the line
// that logs them all (see Runtime.logCutoff), unless Shutdown logged
// that line already; addCut then reports that the write is to be logged
// on its own. l.mu is held.
func (l *leftIDs) addCut(op runOp, t *Task, err error) (own bool) {
	l.add(t)
	if l.cutLogged {
		return true
	}
	c := &l.cut
	c.n++
	c.ops[op]++
	if len(c.ids) < shutdownIDsShown {
		c.ids = append(c.ids, t.ID())
	}
	if err != nil && (c.err == nil || cutOffError(c.err) && !cutOffError(err)) {
		c.err = err
	}
	return false
}

// cutOffError reports whether err, a try's error, is that of its
// context's end: the cutoff's own, which says less than a store's.
func cutOffError(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// cutTally sums up the run writes given up at a cutoff, for the one line
// that logs them.
type cutTally struct {
	n   int              // writes given up
	ops [len(runOps)]int // of them, by kind
	ids []string         // the first few of their tasks' ids, at most shutdownIDsShown
	err error            // the first error a try of one of them met, preferably a store's
}

// Messages of the line that logs the run writes given up at a cutoff.
const (
	cutoffAtShutdown = "workers: Shutdown's cutoff passed: run writes given up, their records left for recovery; the ShutdownError it returned counts them and names their tasks"
	cutoffAtReset    = "workers: Reset's context ended: queue items' writes given up, their records left for recovery; the next Shutdown's ShutdownError counts them and names their tasks"
)

// logCutoff logs, in one line at error level, with msg, the run writes
// given up at a cutoff since the last such line, if any were: how many,
// how many of each kind (op), the first few of their tasks' ids, and the
// first error a try of one of them met, one the store returned rather
// than the cutoff's own where one did. final says that the runtime's
// life has ended for good and Shutdown is returning: a write given up
// after this line logs its own (see Runtime.cutShort).
func (rt *Runtime[S]) logCutoff(msg string, final bool) {
	l := &rt.left
	l.mu.Lock()
	c := l.cut
	l.cut = cutTally{}
	if final {
		l.cutLogged = true
	}
	l.mu.Unlock()
	if c.n == 0 {
		return
	}
	ops := make([]any, 0, len(runOps))
	for op, n := range c.ops {
		if n > 0 {
			ops = append(ops, slog.Int(runOps[op].name, n))
		}
	}
	args := []any{"writes", c.n, slog.Group("ops", ops...), "tasks", c.ids}
	if c.err != nil {
		args = append(args, "err", c.err)
	}
	rt.cfg.Logger.Error(msg, args...)
}

// ShutdownError is the error of a Shutdown that left something: runs or
// goroutines still executing, or records of this runtime left live, for
// recovery to end (see Runtime.Shutdown). Match it with errors.As; it
// wraps ctx's error when ctx ended, so errors.Is(err,
// context.DeadlineExceeded) holds then.
type ShutdownError struct {
	// Executing counts the runs and goroutines left executing: callbacks
	// still running, and submissions, queue items or background work in
	// a store call that ignores its context.
	Executing int
	// Unwritten counts the live records of this runtime whose writes
	// were given up: at the cutoff (a queue item still PENDING, the
	// outcome of a run whose callback returned), or when a Reset's ctx
	// ended before its queue items were recorded. They are the writes
	// not known to have landed: one whose store call failed, or was cut
	// off at the cutoff, may have landed all the same (no read tells
	// when the cutoff has passed, or when the read fails too), and its
	// record is then ended already. A run counted in Executing is not
	// counted here as well, though its record shows it live until its
	// callback returns and its outcome lands.
	Unwritten int
	// ExecutingIDs holds the scoped ids of the tasks among Executing whose
	// runs Shutdown knew of (a run, or a queue item still being
	// recorded), sorted.
	ExecutingIDs []string
	// UnwrittenIDs holds the ids of the tasks whose records are left
	// unwritten, as Unwritten counts them, sorted.
	UnwrittenIDs []string
	// Err is ctx's error when ctx ended, and nil when it did not: the
	// store refused the records' writes, or an earlier Shutdown or a
	// Reset gave them up.
	Err error
}

// shutdownIDsShown is how many ids of each kind a ShutdownError's
// message names.
const shutdownIDsShown = 5

func (e *ShutdownError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "workers: shutdown left %d runs or goroutines executing and %d live records of this runtime unwritten", e.Executing, e.Unwritten)
	sep := " ("
	for _, l := range []struct {
		what string
		ids  []string
	}{{"executing", e.ExecutingIDs}, {"unwritten", e.UnwrittenIDs}} {
		if len(l.ids) == 0 {
			continue
		}
		b.WriteString(sep + l.what + ": " + strings.Join(l.ids[:min(len(l.ids), shutdownIDsShown)], ", "))
		if more := len(l.ids) - shutdownIDsShown; more > 0 {
			fmt.Fprintf(&b, " and %d more", more)
		}
		sep = "; "
	}
	if sep != " (" {
		b.WriteString(")")
	}
	if e.Err == nil {
		b.WriteString(": the store refused their writes, or an earlier Shutdown or a Reset gave them up")
	} else {
		b.WriteString(": " + e.Err.Error())
	}
	return b.String()
}

// Unwrap returns Err.
func (e *ShutdownError) Unwrap() error { return e.Err }

// lateRuns returns the done channels of the runs in flight that listed
// does not hold.
func (rt *Runtime[S]) lateRuns(listed []*Task) []<-chan struct{} {
	seen := make(map[*Task]struct{}, len(listed))
	for _, t := range listed {
		seen[t] = struct{}{}
	}
	var late []<-chan struct{}
	for _, t := range rt.runs.all() {
		if _, ok := seen[t]; !ok {
			late = append(late, t.doneChan())
		}
	}
	return late
}

// gracePoint is when Shutdown stops letting callbacks run (see
// Config.ShutdownGrace).
func (rt *Runtime[S]) gracePoint(ctx context.Context) time.Time {
	start := time.Now()
	deadline, ok := ctx.Deadline()
	switch g := rt.cfg.ShutdownGrace; {
	case g < 0 || ctx.Err() != nil:
		return start
	case g > 0 && ok:
		return minTime(start.Add(g), deadline)
	case g > 0:
		return start.Add(g)
	case ok:
		return start.Add(deadline.Sub(start) * 3 / 4)
	}
	return start
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// intake is the runtime's intake. Submissions enter it for the length of
// their registration; Shutdown closes it and waits for those inside.
type intake struct {
	mu     sync.Mutex
	closed bool          // guarded by mu
	inside int           // guarded by mu
	idle   chan struct{} // guarded by mu: made by close, closed when inside reaches 0

	// shutCtx ends at the first close, and shut is its Done channel: a
	// submission's wait for the lease, and its renewal, end with it.
	shutCtx context.Context
	endShut context.CancelFunc
	shut    <-chan struct{}
}

func (g *intake) init() {
	g.shutCtx, g.endShut = context.WithCancel(context.Background())
	g.shut = g.shutCtx.Done()
}

// bind returns ctx, ended also when the gate closes (cause ErrClosed),
// and the function that releases it.
func (g *intake) bind(ctx context.Context) (context.Context, func()) {
	c, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(g.shutCtx, func() { cancel(ErrClosed) })
	return c, func() { stop(); cancel(nil) }
}

// enter admits a submission, or reports false once the gate is closed.
func (g *intake) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.inside++
	return true
}

// leave ends a submission admitted by enter.
func (g *intake) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.inside--; g.inside == 0 && g.idle != nil {
		close(g.idle)
		g.idle = nil
	}
}

// count returns the number of submissions inside.
func (g *intake) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inside
}

// isClosed reports whether close was called.
func (g *intake) isClosed() bool {
	select {
	case <-g.shut:
		return true
	default:
		return false
	}
}

// close closes the gate and returns a channel closed once no submission
// is inside.
func (g *intake) close() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.closed = true
		g.endShut()
	}
	if g.inside == 0 {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	if g.idle == nil {
		g.idle = make(chan struct{})
	}
	return g.idle // every Shutdown waits on the same channel
}

// emptyQueues takes the waiting items out of every queue with take, and
// returns the queues and the items. The queues include those retired as
// new ones were made whose processors may not have ended yet (empty,
// they give take nothing), for Shutdown to wait for them.
func (rt *Runtime[S]) emptyQueues(take func(*queue) []*Task) ([]*queue, []*Task) {
	rt.mu.RLock()
	queues := append(slices.Collect(maps.Values(rt.queues)), rt.retiring...)
	rt.mu.RUnlock()
	var items []*Task
	for _, q := range queues {
		items = append(items, take(q)...)
	}
	return queues, items
}

// waitAll waits until every channel is closed or ctx ends, and returns
// how many are still open. Channels already closed count as settled even
// when ctx is already done.
func waitAll(ctx context.Context, chans []<-chan struct{}) int {
	open := 0
	for _, ch := range chans {
		select {
		case <-ch:
			continue
		default:
		}
		if ctx.Err() == nil {
			select {
			case <-ch:
				continue
			case <-ctx.Done():
			}
		}
		select {
		case <-ch:
		default:
			open++
		}
	}
	return open
}

// abandon records queue items that will never run CANCELLED, each with
// its first cause (the shutdown's, unless a Cancel, say, came first), each
// write fenced on the run id its item carries from registration, and
// settles them. Each write retries while life lives: the runtime's life,
// which Shutdown's cutoff ends, or a shorter one (Reset's). It must not
// be called with a queue lock held.
func (rt *Runtime[S]) abandon(life context.Context, items []*Task) {
	if len(items) == 0 {
		return
	}
	at := now()
	for _, t := range items {
		t.cancel(ErrShutdown) // a cause it has already stays
	}
	var wg sync.WaitGroup
	fanOut(&wg, items, func(t *Task) {
		t.mark(runFinishing)
		if rt.beginAbandon(life, t) {
			var st State
			rt.endState(t, &st, rt.cancelOutcome(t), at)
			rt.writeWithin(life, opAbandon, t, StatusPending, &st, nil)
		}
		rt.settle(t)
	})
	wg.Wait()
}

// beginAbandon reports whether the abandon write of queue item t may
// begin, and marks it begun if so: not when Shutdown, past its cutoff,
// counted the write as given up before it began (see leftBehind), nor
// once life, the bound of the write's tries, has ended, when its first
// try would fail at once: it is given up then without one, at the cost
// of a count, so that a long backlog left at the cutoff costs Shutdown
// no store call each. The decisions are made under the lock leftBehind
// counts under, so the item is counted either as in its write or as
// given up, and no write of it begins after that count.
func (rt *Runtime[S]) beginAbandon(life context.Context, t *Task) bool {
	rt.left.mu.Lock()
	defer rt.left.mu.Unlock()
	switch {
	case t.has(runGaveUp):
		return false
	case life.Err() != nil:
		rt.left.addCut(opAbandon, t, nil) // no try: nothing to log on its own
		return false
	}
	t.mark(runAbandonBegun)
	return true
}

// endNow ends runs that never start, each cancelled already, up to
// abandonWriters at once, on goroutines that end with the last:
// execute records each one's cause, fenced on its run, and settles it.
// Shutdown waits for them as for every run in flight.
func (rt *Runtime[S]) endNow(items []*Task) {
	fanOut(new(sync.WaitGroup), items, rt.execute)
}

// fanOut calls f with each of items on up to abandonWriters goroutines,
// which wg counts, and returns at once. Writes made at once go together
// where a store batches concurrent writes (group commit), so a long
// backlog is recorded in a few statements, by a bounded number of
// goroutines.
func fanOut(wg *sync.WaitGroup, items []*Task, f func(*Task)) {
	var next atomic.Int64
	for range min(len(items), abandonWriters) {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(len(items)); i = next.Add(1) - 1 {
				f(items[i])
			}
		})
	}
}

// abandonWriters bounds the goroutines of fanOut.
const abandonWriters = 16

// Reset is for tests: it drops the runtime's live state without draining.
// It records waiting queue items, and tasks waiting for a slot under
// Config.Limits, CANCELLED as Shutdown does, cancels every run in flight
// with ErrShutdown without waiting for it, forgets every run handle (a
// run registered while it does so may keep its own), and clears the
// store's records if the store is volatile (it implements
// RecordClearer). It never deletes durable records. Another runtime
// sharing the cleared store hears of it (see RecordClearer): its runs
// waiting for their turn end at once, with ErrDeleted, and give their
// waiting places back. The runtime stays open; runs still executing
// settle on their own, and a later Shutdown waits for them. Once it has
// cleared the records, such a run reports its end to the observers when
// its callback returns, CANCELLED as deleted (CauseDeleted), its record
// being gone; otherwise a Cancel or a recovery that ends its record
// reports it. Since their handles are forgotten, a RecoverZombies after
// a Reset over a durable store fails them even while they execute.
//
// ctx bounds the writes of the waiting items' records, which retry while
// the store fails: once it ends, those not made are given up, their
// records left for recovery and counted by a later Shutdown (they are
// logged in one line, as at Shutdown's cutoff), and Reset
// returns ctx's cause, after doing the rest. A nil ctx is refused with
// ErrInvalidOption, before anything is done.
func (rt *Runtime[S]) Reset(ctx context.Context) error {
	if err := checkContext(ctx); err != nil {
		return err
	}
	_, waiting := rt.emptyQueues((*queue).take)
	if rt.adm != nil {
		waiting = append(waiting, rt.adm.takeWaiting()...)
	}
	// Their writes end with ctx, if the runtime lives that long.
	life, stop := context.WithCancelCause(ctx)
	stopLife := context.AfterFunc(rt.life, func() { stop(context.Cause(rt.life)) })
	rt.abandon(life, waiting)
	stopLife()
	stop(nil)
	rt.logCutoff(cutoffAtReset, false)

	var err error
	if ctx.Err() != nil {
		err = context.Cause(ctx)
	}
	cleared := false
	if rc, ok := any(rt.store).(RecordClearer); ok {
		cerr := rc.ClearRecords(ctx)
		cleared = cerr == nil
		err = cmp.Or(err, cerr)
	}
	inflight := rt.runs.forget()
	for _, t := range inflight {
		if !cleared {
			// Its end is no longer this runtime's to report: a Cancel
			// or a recovery that finds no handle reports it. With the
			// records cleared, none will: the run's own write finds
			// its record gone, and the run reports its end itself,
			// deleted.
			t.mark(runEndSeen)
		}
		t.cancel(ErrShutdown)
	}
	// Waits and streams that followed the forgotten runs, whose records
	// may be gone, read them again.
	rt.bells.ringAll()
	if rt.hub.n.Load() > 0 {
		rt.hub.resync()
	}
	return err
}

// RecoverZombies ends, FAILED as abandoned, every PENDING or RUNNING
// record whose run is not alive, and returns how many it ended. Such a
// record was left by a process that died, by a runtime that was dropped
// without Shutdown, or by a Shutdown that gave up; nothing will ever
// finish it. Each write is fenced on the run id and status read, so a run
// registered meanwhile is never touched, and several recoverers at once
// are harmless. Submissions never join such a record either way: register
// replaces it.
//
// A run of this runtime is alive while the runtime holds its handle. Over
// a store that implements Leaser, a run of another instance is alive
// while that instance's lease is: recovery is then safe anywhere, and
// Start and the recovery loop (Config.RecoverInterval) run it in every
// replica. Over a store without leases, every other runtime's run counts
// as dead: call it only where the other processes are known to be gone
// (at the startup of a single instance, with Config.RecoverZombies).
//
// A record it cannot end (its write fails) does not stop it: it goes on
// with the others, and returns the first such error with its count. A
// write that reports an error is checked against the record: one that
// landed all the same counts as ended. A nil ctx is refused with
// ErrInvalidOption, before any record is read.
func (rt *Runtime[S]) RecoverZombies(ctx context.Context) (int, error) {
	if err := checkContext(ctx); err != nil {
		return 0, err
	}
	return rt.recoverRuns(ctx, true, false)
}

// Cleanup deletes terminal records that completed more than olderThan
// ago and returns how many it deleted. The cleanup scheduler calls it
// every Config.CleanupInterval with Config.Retention. A negative
// olderThan, or a nil ctx, is ErrInvalidOption.
func (rt *Runtime[S]) Cleanup(ctx context.Context, olderThan time.Duration) (int, error) {
	if err := checkContext(ctx); err != nil {
		return 0, err
	}
	if olderThan < 0 {
		return 0, fmt.Errorf("%w: negative age %v", ErrInvalidOption, olderThan)
	}
	return rt.store.DeleteFinished(ctx, now().Add(-olderThan))
}
