package workers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// loops are a runtime's background goroutines: lease renewal, recovery,
// cleanup, sync and the notice listener. Each watches ctx and closes its
// done channel when it returns; Shutdown ends ctx and waits for them.
// Every field is guarded by the runtime's mu.
type loops struct {
	ctx    context.Context
	stop   context.CancelFunc
	done   []chan struct{}
	halted bool // set by halt: no loop starts after it
}

// goroutine starts f on a goroutine of its own, unless the loops were
// halted; rt.mu is held.
func (l *loops) goroutine(f func(ctx context.Context)) {
	if l.halted {
		return
	}
	if l.ctx == nil {
		l.ctx, l.stop = context.WithCancel(context.Background())
	}
	// The goroutines that ended are not waited for: a runtime that
	// starts one per lost lease (endAbandonedHere) keeps no trace of it.
	l.done = slices.DeleteFunc(l.done, func(d chan struct{}) bool {
		select {
		case <-d:
			return true
		default:
			return false
		}
	})
	done := make(chan struct{})
	l.done = append(l.done, done)
	go func() {
		defer close(done)
		// Started from a caller's goroutine, whose profiler labels
		// (pprof.Do, a tenant's) it would keep for the runtime's life.
		pprof.SetGoroutineLabels(context.Background())
		f(l.ctx)
	}()
}

// every starts a loop that calls f every interval until the loops stop;
// a zero interval starts nothing. rt.mu is held.
func (l *loops) every(interval time.Duration, f func(context.Context)) {
	if interval <= 0 {
		return
	}
	l.goroutine(func(ctx context.Context) {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if ctx.Err() != nil {
					return // a tick that raced the stop
				}
				f(ctx)
			}
		}
	})
}

// halt stops the loops and returns what to wait for; rt.mu is held.
func (l *loops) halt() []chan struct{} {
	l.halted = true
	if l.stop != nil {
		l.stop()
	}
	return l.done
}

// leaseState is this instance's lease over a Leaser store.
type leaseState struct {
	held     atomic.Bool // the lease was taken and the loops started: the fast path of ensureLease
	released atomic.Bool // Shutdown released it: a later Shutdown does not again

	// turn is held by the one renewal in flight, by the renewal loop or a
	// submission; a channel of capacity 1, so that a submission waiting
	// for it can give up when its context ends.
	turn chan struct{}

	// base is the start of the clock until counts on: until is the
	// monotonic time, in nanoseconds since base, at which the lease last
	// renewed ends, and 0 while none is known to be held. A run registers
	// before until without asking the store; after it, its submission
	// renews the lease first.
	base  time.Time
	until atomic.Int64
	epoch atomic.Uint64 // counts the times the lease was found lost; bumped before the runs are abandoned
	tries atomic.Uint64 // renewals answered, by the store or by their timeout

	// abandoned is the epoch of the last loss of the lease whose runs
	// may have records left to end (0: none), set when the lease is found
	// lost, and cleared once no run abandoned then is left here, or a
	// pass ended their records (see endAbandonedHere); ending is held by
	// the pass that ends their records.
	abandoned atomic.Uint64
	ending    atomic.Bool

	// failing is set while the last renewal answered failed, as lastErr
	// says, for Ready to read without the turn.
	failing atomic.Bool
	// asked is the lease clock's reading when the renewal in flight
	// was sent, 0 while none is: Ready reads it without the turn, to
	// tell a store that does not answer.
	asked atomic.Int64

	// Guarded by turn.
	quiet   bool  // the renewal made is Ready's, whose failure its caller is told, not the log
	took    bool  // a renewal has succeeded: the lease was taken
	lost    bool  // no lease is held: none was taken yet, or it was found lost since the last renewal
	lastErr error // the error of the last renewal answered, nil if it succeeded
	partial bool  // the last renewal's maker gave up before its answer was whole (see renewWhileLost)
}

// clock is the lease's monotonic clock reading at t.
func (ls *leaseState) clock(t time.Time) int64 { return int64(t.Sub(ls.base)) }

// now is clock(time.Now()), read more cheaply: time.Since, given a time
// with a monotonic reading, reads only the monotonic clock, where
// time.Now reads the wall clock too (in a synctest bubble both read the
// bubble's clock).
func (ls *leaseState) now() int64 { return int64(time.Since(ls.base)) }

// errRenewalCutOff is the cause of a renewal's own deadline.
var errRenewalCutOff = errors.New("workers: lease renewal cut off")

// errRetriesTimeUp marks the error of a renewal retried on a lost
// connection that the retries' end cut off (see renewWhileLost).
var errRetriesTimeUp = errors.New("workers: the lease renewal's retries ran out of time")

// take waits for the lease's turn, or for ctx to end (see ctxErr), or
// for shut to close (ErrClosed).
func (ls *leaseState) take(ctx context.Context, shut <-chan struct{}) error {
	select {
	case ls.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctxErr(ctx)
	case <-shut:
		return ErrClosed
	}
}

func (ls *leaseState) give() { <-ls.turn }

// ensureLease takes this instance's lease before its first run is
// registered, and starts the loops that keep runs in step with the store
// and need no Start: lease renewal, the notice listener and the sync loop,
// each where the store and Config call for it.
func (rt *Runtime[S]) ensureLease(ctx context.Context) error {
	if rt.lease.held.Load() {
		return nil
	}
	if rt.cfgErr != nil {
		return rt.cfgErr // no loop starts on a Config it cannot run with
	}
	if err := rt.lease.take(ctx, rt.gate.shut); err != nil {
		return err
	}
	defer rt.lease.give()
	if rt.lease.held.Load() {
		return nil
	}
	l, leased := any(rt.store).(Leaser)
	if leased {
		// A take that lost its connection is made again, as a
		// submission's renewal is: no lease is held yet.
		if err := rt.renewWhileLost(ctx, func(until time.Time) error { return rt.renewUnlessShut(ctx, l, until) }); err != nil {
			switch {
			case ctx.Err() != nil:
				return ctx.Err() // the caller's: the lease was never in question
			case rt.gate.isClosed():
				return ErrClosed // Shutdown began, and stopped the take's retries
			}
			return leaseError("taking", err)
		}
	}
	rt.mu.Lock()
	if leased {
		rt.loops.goroutine(func(ctx context.Context) { rt.renewLease(ctx, l) })
	}
	if n, ok := any(rt.store).(Notifier); ok {
		rt.loops.goroutine(func(ctx context.Context) { rt.listen(ctx, n) })
	}
	rt.loops.every(rt.cfg.SyncInterval, rt.syncRuns)
	rt.loops.every(rt.cfg.ProgressInterval, rt.shareProgress)
	rt.loops.every(queueReapInterval, rt.reapQueues)
	rt.mu.Unlock()
	rt.lease.held.Store(true)
	return nil
}

// leaseForRun is ensureLease for a submission about to register a run:
// a run is registered only under a lease this runtime knows to be live.
// Once the last renewal's LeaseTTL has passed, or the lease was found
// lost, the submission renews it itself, or fails with the renewal's
// error and registers nothing; submissions that wait while a renewal is
// in flight share its answer, so a store that is down costs them one
// call between them. It returns the lease's epoch, for dispatch to see
// whether the lease was found lost while the run registered.
func (rt *Runtime[S]) leaseForRun(ctx context.Context) (uint64, error) {
	if err := rt.ensureLease(ctx); err != nil {
		return 0, err
	}
	ls := &rt.lease
	// The epoch is read before the lease's end: a loss declared between
	// the two reads then shows at dispatch.
	epoch := ls.epoch.Load()
	if h := rt.hooks.Load(); h != nil && h.leaseRead != nil {
		h.leaseRead()
	}
	if rt.leaser == nil || ls.now() < ls.until.Load() {
		return epoch, nil
	}
	seen := ls.tries.Load()
	// Shutdown waits for the submissions inside: this one stops waiting
	// for a renewal in flight once Shutdown has begun.
	if err := ls.take(ctx, rt.gate.shut); err != nil {
		return 0, err
	}
	defer ls.give()
	switch {
	case ls.now() < ls.until.Load():
		// renewed while this submission waited
	case ls.tries.Load() != seen && ls.lastErr != nil && !ls.partial:
		return 0, leaseError("renewing", ls.lastErr)
	default:
		if err := rt.renewWhileLost(ctx, func(until time.Time) error { return rt.renewUnlessShut(ctx, rt.leaser, until) }); err != nil {
			switch {
			case ctx.Err() != nil:
				return 0, ctx.Err()
			case rt.gate.isClosed():
				return 0, ErrClosed // Shutdown began: as for any submission after it
			}
			return 0, leaseError("renewing", err)
		}
	}
	return ls.epoch.Load(), nil
}

// renewWhileLost makes a renewal with renew, and makes it again, as a
// registering write is (registerWrite), while it fails because the store
// lost or could not open its connection, or its database refused writes
// for now (ErrUnavailable), and the lease is
// lost, within ctx and until Shutdown begins; the caller holds the
// lease's turn. A renewal fails that way with the lease lost only after
// its end passed, and its failure then declared the lease lost (see
// renew), so whether a lost try landed makes no difference: the next
// renewal takes the lease anew, whatever it reports. A renewal that
// fails while the lease lives is not made again here: the lease has
// intervals to spare, and a lost try that landed would make the retry's
// answer say the lease was extended when it may have been taken anew.
//
// The retries take at most what is left of one LeaseInterval from the
// first try's start, each cut off by its end (renew's until), so that
// they add no more than an interval to a renewal; a retry so cut off
// reports the lost connection it was made for.
//
// The first call that takes the lease takes it through it (no lease is
// held yet), submissions that find the lease's end passed renew through
// it, and so does the loop once the lease is lost; submissions waiting meanwhile
// share the outcome, unless its maker gave up on it (its context ended,
// or Shutdown began) before it was whole: they then renew themselves.
func (rt *Runtime[S]) renewWhileLost(ctx context.Context, renew func(until time.Time) error) error {
	ls := &rt.lease
	first := time.Now()
	err := renew(time.Time{})
	backoff := registerBackoff
	for range registerRetries {
		if !errors.Is(err, ErrUnavailable) || !ls.lost {
			break
		}
		wait, until := jitter(backoff), first.Add(rt.cfg.LeaseInterval)
		if time.Until(until) <= wait || !sleepUnless(ctx, wait, rt.gate.shut) || !time.Now().Before(until) {
			break
		}
		backoff *= 2
		lost := err
		if err = renew(until); errors.Is(err, errRetriesTimeUp) {
			err, ls.lastErr = lost, lost
			break
		}
	}
	ls.partial = ctx.Err() != nil || rt.gate.isClosed()
	return err
}

// leaseError says what failed of taking or renewing the lease; ErrClosed
// (Shutdown began) goes as it is, as for any submission after it.
func leaseError(doing string, err error) error {
	if err == ErrClosed {
		return err
	}
	return fmt.Errorf("workers: %s the instance lease: %w", doing, err)
}

// renewIfFailing renews the lease, for Ready, when it lives but the last
// renewal answered failed: the store may be down, or refuse writes, and
// every submission then fails at its insert though the lease has
// intervals to spare. Ready answers what this renewal meets, from the
// first renewal that failed on, instead of nil until the lease may have
// ended. As a submission's renewal, it shares the answer of one made
// while it waited for the turn.
func (rt *Runtime[S]) renewIfFailing(ctx context.Context) error {
	ls := &rt.lease
	if rt.leaser == nil {
		return nil
	}
	if asked := ls.asked.Load(); asked != 0 {
		if d := time.Duration(ls.now() - asked); d > rt.cfg.LeaseInterval {
			return fmt.Errorf("workers: renewing the instance lease: the store has not answered for %v: %w", d.Round(time.Millisecond), ErrUnavailable)
		}
	}
	if !ls.failing.Load() {
		return nil
	}
	seen := ls.tries.Load()
	if err := ls.take(ctx, rt.gate.shut); err != nil {
		return err
	}
	defer ls.give()
	switch {
	case !ls.failing.Load():
		return nil // renewed while this call waited
	case ls.tries.Load() != seen && !ls.partial:
		return leaseError("renewing", ls.lastErr)
	}
	// The loop logs its renewals' failures, one an interval; a probe's
	// are its caller's to report.
	ls.quiet = true
	err := rt.renewUnlessShut(ctx, rt.leaser, time.Time{})
	ls.quiet = false
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return leaseError("renewing", err)
	}
	return nil
}

// renewUnlessShut is renew for a caller outside the loops: a submission,
// or a first Wait or Watch. Shutdown's start cuts its call off, and it
// then returns ErrClosed.
func (rt *Runtime[S]) renewUnlessShut(ctx context.Context, l Leaser, until time.Time) error {
	if rt.gate.isClosed() {
		// Shutdown has begun: a call made now would only be cut off, and
		// bind cuts off after the call has started.
		return ErrClosed
	}
	c, release := rt.gate.bind(ctx)
	defer release()
	err := rt.renew(c, l, until)
	if err != nil && ctx.Err() == nil && rt.gate.isClosed() {
		return ErrClosed
	}
	return err
}

// renewLease renews the lease every LeaseInterval until ctx ends. It
// also wakes at the lease's earliest end, if that comes before the next
// renewal (renewals fail, or one, the take say, answered late): the lease
// is then lost on time.
func (rt *Runtime[S]) renewLease(ctx context.Context, l Leaser) {
	ls := &rt.lease
	tick := time.NewTicker(rt.cfg.LeaseInterval)
	defer tick.Stop()
	end := time.NewTimer(time.Hour)
	end.Stop()
	if until := ls.until.Load(); until != 0 {
		end.Reset(max(time.Duration(until-ls.now()), 0))
	}
	defer end.Stop()
	for {
		due := false
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			due = true
		case <-end.C:
		}
		if ls.take(ctx, nil) != nil {
			return
		}
		if due {
			// renew logs a failure, and loses the lease past its end.
			_ = rt.renewWhileLost(ctx, func(until time.Time) error { return rt.renew(ctx, l, until) })
		} else {
			rt.loseLeaseIfEnded()
		}
		held := !ls.lost && ls.took
		abandoned := ls.abandoned.Load() // read with the turn: a loss since sets another
		if until := ls.until.Load(); !ls.lost && until != 0 {
			end.Reset(max(time.Duration(until-ls.now()), 0))
		} else {
			end.Stop()
		}
		ls.give()
		if held && abandoned != 0 {
			rt.endAbandonedHere(abandoned)
		}
	}
}

// endAbandonedHere ends, as recovery does, the records of this runtime's
// runs abandoned with a lost lease whose callbacks go on, once the lease
// is held again, over a runtime that was not started (Start's recovery
// loop ends them otherwise): no other instance ends them under the live
// lease, and they would stay live for as long as the callbacks ignore
// their contexts. The pass runs on a goroutine of the loops', one at a
// time, so that the renewals do not wait for it.
func (rt *Runtime[S]) endAbandonedHere(abandoned uint64) {
	rt.mu.RLock()
	started := rt.started
	rt.mu.RUnlock()
	if started {
		return
	}
	// A run whose end was reported (by such a pass, say) needs none.
	if !slices.ContainsFunc(rt.runs.all(), func(t *Task) bool { return errors.Is(t.cause(), ErrAbandoned) && !t.has(runEndSeen) }) {
		rt.lease.abandoned.CompareAndSwap(abandoned, 0) // unless the lease was lost again since
		return
	}
	if !rt.lease.ending.CompareAndSwap(false, true) {
		return
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.loops.halted {
		rt.lease.ending.Store(false)
		return
	}
	rt.loops.goroutine(func(ctx context.Context) {
		defer rt.lease.ending.Store(false)
		_, err := rt.recoverRuns(ctx, false, true)
		switch {
		case err == nil:
			// Every live record of a run abandoned then is ended: the
			// runs left (their records ended or moved on elsewhere, a
			// peer's recovery say) need no other pass.
			rt.lease.abandoned.CompareAndSwap(abandoned, 0)
		case ctx.Err() == nil:
			rt.cfg.Logger.Error("workers: ending abandoned runs failed", "err", err)
		}
	})
}

// renewalCutOff is the error of a renewal that bound cut off: what is
// left of a lease is rarely a round duration, so it is said to the
// millisecond (to the microsecond under one).
func renewalCutOff(bound time.Duration, err error) error {
	if bound >= time.Millisecond {
		bound = bound.Round(time.Millisecond)
	} else {
		bound = bound.Round(time.Microsecond)
	}
	return fmt.Errorf("workers: the store did not answer a lease renewal within %v (%v)", bound, err)
}

// renew renews the lease once; the caller holds its turn. When the store
// says the lease had expired, or a renewal fails past the earliest end
// of the last one that succeeded (LeaseTTL after that one was sent),
// the instance may have been
// declared dead and its runs recovered by another: the lease is lost,
// and every run is cancelled with ErrAbandoned, its late writes fenced
// out wherever a recovery got there first. The runs are abandoned once
// per loss: none registers until a renewal succeeds again.
//
// A slow renewal may take what is left of the lease, and no more: a call
// that hangs is cut off by the lease's end, so a stalled store cannot
// hide that the lease ran out. Once it has run out, a renewal (which
// creates a new lease) gets one interval. The first, which takes the
// lease, gets a whole LeaseTTL: a cold connection may be slow. A retry
// on a lost connection (see renewWhileLost) is cut off at until, if that
// comes first, and its error then wraps errRetriesTimeUp; a zero until
// sets no such end.
func (rt *Runtime[S]) renew(ctx context.Context, l Leaser, until time.Time) error {
	ls := &rt.lease
	// Past the lease's end, which the loop may not have found yet (a
	// submission's renewal came first), the lease is lost before this
	// renewal, which may take an interval, begins.
	rt.loseLeaseIfEnded()
	sent := time.Now()
	bound := rt.cfg.LeaseTTL // the first, which takes the lease
	if ls.took {
		// What is left of the lease, counted from the start of the last
		// renewal that landed: the store may have set its end that
		// early, and a peer may recover the runs from then on.
		bound = time.Duration(ls.until.Load() - ls.clock(sent))
		if bound <= 0 {
			bound = rt.cfg.LeaseInterval
		}
	}
	retryEnds := !until.IsZero() && until.Sub(sent) < bound
	if retryEnds {
		bound = until.Sub(sent)
	}
	call, cancel := context.WithTimeoutCause(ctx, bound, errRenewalCutOff)
	ls.asked.Store(max(ls.clock(sent), 1))
	defer ls.asked.Store(0) // deferred: a store's panic leaves no renewal in flight
	extended, err := l.RenewLease(call, rt.instance, rt.cfg.LeaseTTL)
	cutOff := context.Cause(call) == errRenewalCutOff
	cancel()
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return err // the caller gave up: the call says nothing of the store
	case cutOff && retryEnds:
		err = fmt.Errorf("%w (%v)", errRetriesTimeUp, renewalCutOff(bound, err))
	case cutOff:
		// The bound's deadline, not the caller's: not
		// context.DeadlineExceeded, which the caller would take for its
		// own.
		err = renewalCutOff(bound, err)
	}
	defer ls.tries.Add(1)
	ls.lastErr = err
	ls.failing.Store(err != nil)
	if err != nil {
		if !ls.quiet {
			rt.cfg.Logger.Error("workers: lease renewal failed", "instance", rt.instance, "err", err)
		}
		rt.loseLeaseIfEnded()
		return err
	}
	if !extended && !ls.lost {
		rt.loseLease("the lease had expired")
	}
	// The store set the expiry at some point during the call: the lease
	// is counted from the call's start, the earliest that allows, by the
	// loop and by the runs that register alike. A renewal whose answer
	// comes late leaves the next one less time: one that hangs is cut
	// off, and the lease lost, when the lease may have ended by the
	// store's clock, before a peer may recover a run still executing.
	ls.took, ls.lost = true, false
	ls.until.Store(ls.clock(sent) + int64(rt.cfg.LeaseTTL))
	return nil
}

// loseLeaseIfEnded loses the lease if it is held and past the earliest
// end of the last renewal that landed, from when another instance may
// recover the runs; the caller holds the lease's turn.
func (rt *Runtime[S]) loseLeaseIfEnded() {
	ls := &rt.lease
	if until := ls.until.Load(); !ls.lost && until != 0 && ls.now() >= until {
		rt.loseLease("the lease could not be renewed before its end")
	}
}

// loseLease records that the lease is lost, and why, and abandons every
// run; the caller holds the lease's turn. The epoch is bumped before the
// runs are listed: a run whose handle the list missed was published
// after it, and its dispatch sees the new epoch.
func (rt *Runtime[S]) loseLease(why string) {
	ls := &rt.lease
	ls.lost = true
	ls.until.Store(0)
	ls.abandoned.Store(ls.epoch.Add(1))
	if h := rt.hooks.Load(); h != nil && h.leaseLost != nil {
		h.leaseLost()
	}
	rt.logAbandon(why)
	rt.abandonRuns()
}

// logAbandon logs that the lease was lost, and why.
func (rt *Runtime[S]) logAbandon(why string) {
	rt.cfg.Logger.Error("workers: instance lease lost; abandoning its runs", "instance", rt.instance, "why", why)
}

// abandonRuns cancels every run of this runtime with ErrAbandoned; a run
// it cancelled before keeps its cause.
//
// Runs that have not begun record the abandon now, not when their turn
// comes: the callbacks ahead of them, holding a queue or the slots under
// Limits, may never return, and a record left PENDING behind them would
// be joined by submissions of its key as a run that will never start.
func (rt *Runtime[S]) abandonRuns() {
	for _, t := range rt.runs.all() {
		t.cancel(ErrAbandoned)
	}
	_, waiting := rt.emptyQueues((*queue).takeCancelled)
	if rt.adm != nil {
		waiting = append(waiting, rt.adm.takeCancelled()...)
	}
	rt.endNow(waiting)
}

// alive reports whether a live record's run is alive: held by this
// runtime, and not cancelled, if it is one of its runs, and otherwise run
// by an instance whose lease is live. A run of this runtime that was
// cancelled (abandoned with a lost lease, or cancelled while the store
// failed) is ending, whatever its record says until its write lands: a
// submission replaces it rather than join it. Another instance's lease
// is asked of the store each time, never of an earlier answer: a lease
// may end at any moment, and a submission that joined a run whose lease
// had ended would wait for an end that only recovery writes. Over a
// store without leases another runtime's run is taken for alive.
func (rt *Runtime[S]) alive(ctx context.Context, rec *Record) (bool, error) {
	inst := InstanceOf(rec.RunID)
	if inst == rt.instance {
		t := rt.handle(rec.ID, rec.RunID)
		return t != nil && t.cause() == nil, nil
	}
	l, ok := any(rt.store).(Leaser)
	if !ok {
		return true, nil
	}
	live, err := liveInstances(ctx, l)
	if err != nil {
		return false, err
	}
	_, ok = live[inst]
	return ok, nil
}

// liveInstances reads the instances whose lease is live.
func liveInstances(ctx context.Context, l Leaser) (map[string]struct{}, error) {
	ids, err := l.LiveInstances(ctx)
	if err != nil {
		return nil, err
	}
	set := make(map[string]struct{}, len(ids))
	for _, id := range ids {
		set[id] = struct{}{}
	}
	return set, nil
}

// recoverRuns ends, FAILED as abandoned, every live record whose run is
// not alive, and returns how many it ended. A run of this runtime is
// alive while it holds its handle, unless it was abandoned with a lost
// lease: its callback may ignore its context for ever, and once the
// lease is back no other instance would end its record, which its own
// late write, fenced out then, would have ended the same way. One whose
// callback has returned is left to its own write of its end (see
// runFinishing), which retries until it lands: that end may be the
// callback's outcome, decided before the lease was lost. A run of
// another instance is alive while that instance's lease is live, over a
// Leaser store. Over a store without
// leases, manual recovery takes every other runtime's run for dead, and
// the loop never runs. Each write is fenced on the run id and status
// read, so several recoverers at once are harmless, and a run registered
// since the read is never touched. A record that cannot be ended (its
// write fails, or is cut off) does not hold back the ones after it: the
// pass goes on, and returns the first such error with its count.
//
// ownOnly narrows the pass to this runtime's own runs (see
// endAbandonedHere).
func (rt *Runtime[S]) recoverRuns(ctx context.Context, manual, ownOnly bool) (int, error) {
	l, leased := any(rt.store).(Leaser)
	if !leased && !manual {
		return 0, nil
	}
	// Each call of the loop's is bounded by StoreTimeout; those of a
	// manual recovery, by its caller's ctx.
	call := func(f func(context.Context) error) error {
		if manual {
			return f(ctx)
		}
		return rt.boundedCall(ctx, f)
	}
	var recs []Record
	err := call(func(ctx context.Context) (err error) {
		recs, err = rt.store.ListTasks(ctx, Filter{Statuses: []Status{StatusPending, StatusRunning}})
		return err
	})
	if err != nil {
		return 0, err
	}
	// The live instances are read after the list: every listed run was
	// registered under its instance's lease, so an instance missing
	// from a later read has lost that lease. Read first, they would miss
	// an instance that took its lease and registered a run in between.
	var live map[string]struct{}
	if leased {
		err = call(func(ctx context.Context) (err error) {
			live, err = liveInstances(ctx, l)
			return err
		})
		if err != nil {
			return 0, err
		}
	}
	o := causeOutcome(ErrAbandoned)
	ts := now()
	n := 0
	var failed error // the first write that failed
	for _, rec := range recs {
		if ctx.Err() != nil {
			// The loop halted, or a manual caller gave up, with records
			// left to end.
			if failed == nil {
				failed = ctx.Err()
			}
			break
		}
		inst := InstanceOf(rec.RunID)
		own := inst == rt.instance
		if !own && ownOnly {
			continue
		}
		if !own && leased {
			if _, ok := live[inst]; ok {
				continue // its instance holds a live lease
			}
		}
		st := endOfStored(&rec, o, ts)
		ok := false
		end := func(ctx context.Context) (err error) {
			ok, err = rt.store.TransitionTask(ctx, rec.ID, rec.RunID, []Status{rec.Status}, st)
			return err
		}
		var held *Task // this runtime's run, abandoned, still executing
		if own {
			// Under the task's lock, a registration's insert and the
			// publishing of its handle are one step: a run registered
			// since the list is either seen live here or has another id.
			// The wait for the lock shares the write's bound: a
			// registration of the id whose store calls hang holds it.
			err = call(func(ctx context.Context) error {
				h, err := rt.keys.lock(ctx, rec.ID)
				if err != nil {
					return fmt.Errorf("wait for the task's lock, which a registration of it holds: %w", err)
				}
				defer h.unlock()
				t := rt.handle(rec.ID, rec.RunID)
				if t != nil && (!errors.Is(t.cause(), ErrAbandoned) || t.has(runFinishing)) {
					return nil // alive, or writing its own end
				}
				if t != nil {
					// A Watch that finds the record moved on (a re-run
					// elsewhere, once this write landed) waits for the
					// end this pass reports.
					rt.holdCancelling(t)
					returned := false
					defer func() {
						if !returned {
							// The store panicked: the pass goes no
							// further, and drops the hold here.
							rt.dropCancelling(t, rec.ID, false)
						}
					}()
					held = t
					err := end(ctx)
					returned = true
					return err
				}
				return end(ctx)
			})
		} else {
			err = call(end)
		}
		if err != nil && !errors.Is(err, ErrNotFound) && ctx.Err() == nil {
			// The write may have landed all the same (a lost
			// acknowledgement): the record then holds its end, which no
			// later pass lists, so it is counted and reported now.
			var cur Record
			if call(func(ctx context.Context) (err error) {
				cur, err = rt.store.GetTask(ctx, rec.ID)
				return err
			}) == nil && wrote(&cur, rec.RunID, &st) {
				ok, err = true, nil
			}
		}
		if err != nil && !errors.Is(err, ErrNotFound) {
			// A row lock a stuck transaction holds, say: the next pass
			// tries it again, and the records after it go on now.
			if failed == nil {
				failed = fmt.Errorf("end %s's abandoned run: %w", rec.ID, err)
			}
			if held != nil {
				rt.dropCancelling(held, rec.ID, false)
			}
			continue
		}
		if ok {
			n++
			// A run still executing here reports the end its record
			// holds when its own write is fenced out, unless this
			// report comes first: its observers hear of one end, after
			// any change of the live run they are hearing of (reportEnd).
			rt.reportEnd(held, change{kind: changeRecovered, id: rec.ID, runID: rec.RunID, queue: rec.Queue, task: held, created: rec.CreatedAt, state: st})
		}
		if held != nil {
			rt.dropCancelling(held, rec.ID, ok)
		}
	}
	return n, failed
}

// listen follows a Notifier store's notices until ctx ends: each wakes
// the Waits on its task, and a notice about a run this runtime executes
// that says another process ended or replaced it has the run checked
// against its record. Listen retries its own connection; should it fail
// outright, listen tries again after a pause, the sync loop standing in
// meanwhile.
func (rt *Runtime[S]) listen(ctx context.Context, n Notifier) {
	checks := make(chan struct{}, 1)
	var mu sync.Mutex
	pending := make(map[string]struct{}) // guarded by mu: ids to check
	all := false                         // guarded by mu: check every run
	rt.mu.Lock()
	rt.loops.goroutine(func(ctx context.Context) {
		// After a resync, every run waiting for its turn is read too: a
		// notice of its cancel may be among those lost. They may be
		// many (a long queue), so they are read one at a time between
		// the checks notices ask for, which never wait for more than one
		// of those reads; a later resync starts them again.
		var unchecked []*Task
		for {
			if len(unchecked) > 0 {
				select {
				case <-ctx.Done():
					return
				case <-checks:
				default:
					t := unchecked[0]
					unchecked[0], unchecked = nil, unchecked[1:]
					if t.cause() == nil && rt.isWaiting(t) {
						rt.checkWaiting(ctx, t)
					}
					if len(unchecked) == 0 {
						rt.resynced()
					}
					continue
				}
			} else {
				select {
				case <-ctx.Done():
					return
				case <-checks:
				}
			}
			mu.Lock()
			ids, everything := pending, all
			pending, all = make(map[string]struct{}), false
			mu.Unlock()
			rt.checkRuns(ctx, ids, everything)
			if everything {
				unchecked = rt.waitingRuns()
				if len(unchecked) == 0 {
					rt.resynced()
				}
			}
		}
	})
	rt.mu.Unlock()
	changed := func(c Change) {
		if c.Resync {
			rt.listening.Store(true) // it listens (again): see waitFallback
		}
		gap := rt.hub.heard(c)
		if rt.hub.n.Load() > 0 && !rt.ownNotice(c) {
			rt.hub.remote(c, gap)
		}
		if c.Resync {
			rt.ends.resync()
			rt.bells.ringAll()
			mu.Lock()
			all = true
			mu.Unlock()
		} else {
			if c.Status == "" || c.Status.Terminal() || InstanceOf(c.RunID) != rt.instance {
				// Before looking for its run: see checkRegistered. A
				// notice of another instance's run may be a cancel and a
				// re-run coalesced into one.
				rt.ends.note(c.ID)
			}
			if c.Status != StatusPending && c.Status != StatusRunning {
				rt.bells.ring(c.ID)
			} else {
				rt.bells.ringMoved(c.ID, c.RunID) // a live record of the run a Wait read ends no Wait
			}
			if !rt.endedElsewhere(c) {
				return
			}
			mu.Lock()
			pending[c.ID] = struct{}{}
			mu.Unlock()
		}
		select {
		case checks <- struct{}{}:
		default:
		}
	}
	for {
		err := n.Listen(context.WithValue(ctx, originKey{}, rt.instance), changed)
		// Not listening: Waits and Watches of this runtime's runs, which
		// counted on notices, poll again until the next Resync.
		rt.listening.Store(false)
		rt.bells.ringAll()
		rt.hub.wakeWatches()
		if ctx.Err() != nil {
			return
		}
		rt.cfg.Logger.Error("workers: listening for store notices failed", "err", err)
		if !sleep(ctx, rt.cfg.LeaseInterval) {
			return
		}
	}
}

// endNoticeRing is how many notices of ends endNotices remembers.
const endNoticeRing = 1024

// endNotices remembers the ids of the latest notices that may say a run
// ended elsewhere (its record ended, deleted, or moved to a run another
// instance minted, which a notice of its end coalesced into the re-run's
// may say alone), so that a run that registers while one comes can tell
// whether it may be its own (see Runtime.checkRegistered). A notice is
// noted before the listener looks for its run; a registration reads seq
// before its registering write and looks in the notes once its run is
// published, so that a notice of the run's end is either noted in
// between or finds the run.
type endNotices struct {
	seq atomic.Uint64 // notices noted, ever; a Resync counts for more than the ring holds
	mu  sync.Mutex
	ids [endNoticeRing]string // guarded by mu: notice i's id at i % endNoticeRing
}

// note remembers a notice that may say id's run ended.
func (n *endNotices) note(id string) {
	n.mu.Lock()
	n.ids[n.seq.Load()%endNoticeRing] = id
	n.seq.Add(1)
	n.mu.Unlock()
}

// resync notes a Resync: notices may have been lost, of any id.
func (n *endNotices) resync() {
	n.mu.Lock()
	n.seq.Add(endNoticeRing + 1)
	n.mu.Unlock()
}

// since reports whether a notice that may say id's run ended was noted
// since seq was from: one of id's, a Resync, or more than the ring
// remembers.
func (n *endNotices) since(from uint64, id string) bool {
	if n.seq.Load() == from {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	to := n.seq.Load()
	if to-from > endNoticeRing {
		return true
	}
	for i := from; i < to; i++ {
		if n.ids[i%endNoticeRing] == id {
			return true
		}
	}
	return false
}

// ownNotice reports whether notice c is of a write this runtime made and
// already published to its subscribers.
func (rt *Runtime[S]) ownNotice(c Change) bool {
	if c.Resync || c.RunID == "" {
		return false
	}
	t := rt.handle(c.ID, c.RunID)
	if t == nil {
		return false
	}
	r := t.run.Load()
	if r == nil {
		return false // nothing was published
	}
	v := r.view.Load()
	return v != nil && v.Status == c.Status
}

// endedElsewhere reports whether notice c may say that a run executing
// here was ended or replaced by someone else: the record moved to another
// run, or to a terminal status this runtime did not write.
//
// The run may hold its id's handle, or, over a MemStore, have lost it with
// its record, replaced by another runtime.
func (rt *Runtime[S]) endedElsewhere(c Change) bool {
	for _, t := range rt.runs.ofID(c.ID) {
		if t.cause() != nil || t.has(runFinishing) {
			continue
		}
		if (c.RunID != "" && c.RunID != t.RunID()) || c.Status == "" || c.Status.Terminal() {
			return true
		}
	}
	return false
}

// resynced tells a test that the checks after a resync are done.
func (rt *Runtime[S]) resynced() {
	if h := rt.hooks.Load(); h != nil && h.resynced != nil {
		h.resynced()
	}
}

// waitingRuns returns the runs waiting for their turn (see isWaiting).
func (rt *Runtime[S]) waitingRuns() []*Task {
	runs := rt.runs.all()
	waiting := runs[:0]
	for _, t := range runs {
		if t.cause() == nil && rt.isWaiting(t) {
			waiting = append(waiting, t)
		}
	}
	clear(runs[len(waiting):])
	return waiting
}

// syncRuns is the sync loop's work (see Config.SyncInterval): it stores
// progress and checks every run against its record.
func (rt *Runtime[S]) syncRuns(ctx context.Context) { rt.checkRuns(ctx, nil, true) }

// checkRuns syncs the runs executing here whose ids are in ids, or all
// of them when all is set. Runs waiting for their turn (in a queue, or
// under Config.Limits) are checked only if ids names them, on a notice:
// the sync loop's timed pass leaves them, however many, to end at their
// turn, and the listener reads them apart after a resync. A run a
// notice names is read even while a write holds it (the sync loop's
// pass skips it), since the notice may be the only word of a cancel
// made elsewhere. A progress write is built from the state the run last
// wrote, under the run's state lock, so it never undoes a newer write of
// the run's own (a retry's attempt number, say); a run is cancelled only
// while it still holds that its last write left it RUNNING, so a run that
// has just finished is left alone.
func (rt *Runtime[S]) checkRuns(ctx context.Context, ids map[string]struct{}, all bool) {
	var runs []*Task
	if all {
		runs = rt.runs.all()
	} else {
		runs = rt.runs.matching(ids) // in proportion to the notices, not to the runs held here
	}
	for _, t := range runs {
		if ctx.Err() != nil {
			return // the loops were halted: Shutdown waits for this one
		}
		_, named := ids[t.ID()]
		rt.checkRun(ctx, t, named)
	}
}

// checkRun is checkRuns's step for run t, named by a notice (or by a
// Cancel that found its record gone) if named is set.
func (rt *Runtime[S]) checkRun(ctx context.Context, t *Task, named bool) {
	if t.cause() != nil {
		return // ending already: its final write carries its state
	}
	switch p := rt.syncProgress(t); p {
	case progressIdle, progressBusy:
		if named && rt.isWaiting(t) {
			rt.checkWaiting(ctx, t)
			return
		}
		if p == progressIdle || !named {
			return // not started yet, finished, or busy until the next pass
		}
		// A notice names it while a write holds it: a progress
		// write of shareProgress, say, which a cancel made elsewhere
		// fences out without a word, so that the notice is the only
		// one. Its record is read now, and the run cancelled once
		// that write is done.
	case progressStored:
		return // still this run's and RUNNING
	}
	if h := rt.hooks.Load(); h != nil && h.syncRead != nil {
		h.syncRead()
	}
	rec, cause := rt.endedBy(ctx, t)
	if cause == nil {
		return
	}
	// The run was RUNNING by its own account at the progress check,
	// so it has a state. If its own end landed since, that write
	// reported it, and the record holds it: nothing more to do.
	r := t.run.Load()
	if t.has(runWriting) && rt.leaveEndToWriter(t, &rec) {
		return
	}
	r.writeMu.Lock()
	running, started := r.running(), r.last.startedAt
	if running {
		t.cancel(cause)
	}
	r.writeMu.Unlock()
	if !running {
		return
	}
	// The run's own outcome will be fenced out: the end its record
	// already holds is the run's finished event.
	if end, ok := endOf(t, &rec); ok {
		rt.reportEnd(t, end)
	} else {
		rt.reportMoved(t, started, cause)
	}
}

// reportMoved follows the finding that run t's record has moved past it
// (a re-run elsewhere, a delete) with no end of t's to report: the
// streams that may show t read the record again, and say Gone of a run
// they showed and can no longer follow to its end. Observers, who heard
// of the run and may hold something open for it (a span), hear of its
// end, once, with cause: CANCELLED as superseded (ErrSuperseded), the
// record having moved on to another run, or as deleted (ErrDeleted), the
// record being gone, unless an earlier pass kept an end of the run's
// that its write or settle reports (see leaveEndToWriter). started is
// when the run started, or zero if it did not. The Waits on t's id read the
// record again too: one that read t's record waits for no event of t's
// (see fallbackPoll), and ends now on a record deleted, rather than when
// the run's callback returns.
//
// The cause reported is the one t's context keeps when it is one of
// those two, the first to land: a record found deleted may have been
// re-created since by a newer run, whose registration here cancelled t
// as superseded before the finding could (see publish), and a record
// found moved on may have been deleted first, when t was cancelled as
// deleted.
func (rt *Runtime[S]) reportMoved(t *Task, started time.Time, cause error) {
	rt.bells.ring(t.ID())
	if rt.hub.n.Load() > 0 {
		rt.hub.reread(t.ID(), t.watcherList())
	}
	if len(rt.cfg.Observers) > 0 && !t.has(runEndSeen|runEndKept) {
		if c := t.cause(); errors.Is(c, ErrSuperseded) || errors.Is(c, ErrDeleted) {
			cause = c
		}
		c := change{kind: changeReplaced, id: t.ID(), runID: t.RunID(), queue: t.opts.queue, task: t}
		causeOutcome(cause).apply(&c.state, now())
		c.state.StartedAt, c.state.Attempt = started, t.Attempt()
		rt.reportEnd(t, c)
	}
}

// leaveEndToWriter is checkRuns's step for run t, found ended by
// another writer (rec) while the run tries a write of its own, which may
// retry for as long as the store fails: the pass does not wait for it.
// The write will not land over that end (an outcome, or a retry, is
// fenced out); if it does not, it reports the end rec holds, kept in
// Runtime.found. (A retry that landed before the end was written leaves
// the run going: a later pass cancels it.) It reports false when the
// write ended meanwhile, for checkRuns to go on as if there had been
// none; the end kept is then reported at most once (runEndSeen).
func (rt *Runtime[S]) leaveEndToWriter(t *Task, rec *Record) bool {
	if h := rt.hooks.Load(); h != nil && h.keepEnd != nil {
		h.keepEnd()
	}
	var kept *change
	if end, ok := endOf(t, rec); ok {
		kept = &end
		rt.found.Store(t, kept)
		t.mark(runEndKept)
	}
	// The write clears runWriting, then looks for runEndKept, both in
	// the flags: if runWriting is still set here, the write sees the end.
	if t.has(runWriting) {
		return true
	}
	// The write ended meanwhile, and the run may have settled: checkRuns
	// goes on itself, and leaves nothing of its own kept. (An end another
	// pass kept stays, for the write or settle.)
	if kept != nil {
		rt.found.CompareAndDelete(t, kept)
	}
	return false
}

// readRecord reads the record of task id, within Config.StoreTimeout.
func (rt *Runtime[S]) readRecord(ctx context.Context, id string) (rec Record, err error) {
	err = rt.boundedCall(ctx, func(ctx context.Context) error {
		rec, err = rt.store.GetTask(ctx, id)
		return err
	})
	return rec, err
}

// endedBy reads t's record and returns it with the cause t's context is
// to be cancelled with if the record says t's run is over: it was ended
// (the cause its record keeps), replaced (ErrSuperseded) or deleted
// (ErrDeleted) by someone else. It returns a nil cause while the record
// is still t's and live, and when the read fails.
func (rt *Runtime[S]) endedBy(ctx context.Context, t *Task) (Record, error) {
	rec, err := rt.readRecord(ctx, t.ID())
	if err != nil && !errors.Is(err, ErrNotFound) && ctx.Err() == nil {
		rt.logRunError("workers: sync read failed", opProgress, t, err)
	}
	if cause := overBy(t, &rec, err); cause != nil || err != nil {
		return rec, cause
	}
	// Still the run's, and live: a join made through another runtime,
	// whose notice may be why it was read, is known here from now on
	// (QueueStatus, say, answers from what the run knows).
	t.learnWatchers(rec.Watchers)
	return rec, nil
}

// overBy returns the cause run t's context is to be cancelled with if
// rec, its id's record as a read returned it with err, says the run is
// over: the cause its end keeps (ErrSuperseded if it keeps none),
// ErrSuperseded when the record is another run's, ErrDeleted when it is
// gone. It returns nil while the record is still t's and live, and when
// the read failed.
func overBy(t *Task, rec *Record, err error) error {
	switch {
	case errors.Is(err, ErrNotFound):
		return ErrDeleted
	case err != nil:
		return nil
	case rec.RunID != t.RunID():
		return ErrSuperseded
	case rec.Status.Terminal():
		return cmp.Or(causeOf(rec.Cause, rec.Error), ErrSuperseded)
	}
	return nil
}

// checkWaiting checks a run waiting for its turn (see isWaiting) on a
// notice that someone else may have ended or replaced it. If they did,
// its context is cancelled as a local Cancel would, so that under
// Config.Limits it frees its owner's waiting place now, and the end the
// record holds is reported here now, not when its turn comes: a task
// waiting for a slot is taken out and ended, and a queue item ends
// without running, dropped with the queue's other cancelled items or
// when its turn comes (see endWaiting).
func (rt *Runtime[S]) checkWaiting(ctx context.Context, t *Task) {
	rec, cause := rt.endedBy(ctx, t)
	if cause == nil {
		return
	}
	t.cancel(cause)
	if end, ok := endOf(t, &rec); ok {
		rt.reportEnd(t, end) // its own end will be fenced out
	} else {
		rt.reportMoved(t, time.Time{}, cause)
	}
	rt.endWaiting(t)
}

// isWaiting reports whether run t waits for its turn: a queue item that
// has not begun, or a run waiting for a slot under Config.Limits.
func (rt *Runtime[S]) isWaiting(t *Task) bool {
	if t.adm != nil {
		return rt.adm.isWaiting(t.adm)
	}
	return t.opts.queue != "" && !t.begun()
}

// shareWriters bounds the progress writes a pass of shareProgress makes
// at once: enough for a store's group commit to combine them, so that a
// pass over thousands of runs takes a few commits, not one each.
const shareWriters = 16

// shareProgress writes the progress of the runs whose callbacks changed
// it since their last write (see Config.ProgressInterval), up to
// shareWriters at once (one at a time over a MemStore, which waits on
// nothing). A run busy with a write of its own, or whose write failed,
// is queued again for the next pass.
func (rt *Runtime[S]) shareProgress(ctx context.Context) {
	var runs []*Task
	alone := rt.mem != nil && !rt.mem.othersListen(rt.instance) // nobody else reads the store
	rt.hub.shares.drain(runShared, func(t *Task) {
		if !alone {
			runs = append(runs, t)
		}
	})
	var next atomic.Int64
	share := func() {
		for {
			i := int(next.Add(1) - 1)
			if i >= len(runs) {
				return
			}
			t := runs[i]
			if ctx.Err() != nil || t.cause() != nil {
				continue // ending: its final write carries its progress
			}
			if s := rt.syncProgress(t); s == progressBusy || s == progressFailed {
				rt.hub.share(t)
			}
		}
	}
	writers := min(shareWriters, len(runs))
	if rt.mem != nil {
		writers = min(1, writers)
	}
	var wg sync.WaitGroup
	for range writers - 1 {
		wg.Go(share)
	}
	share()
	wg.Wait()
}

// progressSync is what syncProgress found of a run, and did.
type progressSync uint8

const (
	progressIdle      progressSync = iota // not begun, or its last write left it not RUNNING
	progressBusy                          // writing on its own: skipped
	progressUnchanged                     // RUNNING, its progress already stored
	progressStored                        // RUNNING, and its changed progress stored now
	progressFenced                        // the write found the record not this run's RUNNING one
	progressFailed                        // the write failed: the progress is still to store
)

// syncProgress stores t's live progress if it changed since the run's
// last write. It builds the write from its last state within one hold of
// its writeMu, so no write of the run's own can land in between; a run
// busy with a write of its own is skipped. A progress write is tried
// once: the next sync, or the next pass of shareProgress, stores it if
// this one fails.
func (rt *Runtime[S]) syncProgress(t *Task) progressSync {
	r := t.run.Load()
	if r == nil {
		return progressIdle
	}
	if !r.writeMu.TryLock() {
		return progressBusy
	}
	if !r.running() {
		r.writeMu.Unlock()
		return progressIdle
	}
	p := t.Progress()
	if p == int(r.last.progress) {
		r.writeMu.Unlock()
		return progressUnchanged
	}
	st := r.last.state()
	st.Progress = p
	// The write carries the runtime's life, as the run's own writes do,
	// and with it this instance as its origin (see MemStore.Listen).
	var ok bool
	err := rt.boundedCall(rt.life, func(ctx context.Context) (err error) {
		ok, err = rt.store.TransitionTask(ctx, t.ID(), t.RunID(), fromRunning, st)
		return err
	})
	if ok {
		r.last.progress = int32(p)
	}
	r.writeMu.Unlock()
	switch {
	case ok:
		if t.has(runProgressFailing) {
			t.flags.And(^runProgressFailing)
		}
		rt.emit(&change{kind: changeProgress, id: t.ID(), runID: t.RunID(), queue: t.opts.queue, task: t, state: st})
		return progressStored
	case err != nil && !errors.Is(err, ErrNotFound):
		// Logged once until a write lands: a store that stays down
		// would otherwise log every run at every pass.
		if t.claim(runProgressFailing) {
			rt.logRunError("workers: progress write failed", opProgress, t, err)
		}
		return progressFailed
	}
	return progressFenced
}
