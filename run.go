package workers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"runtime/pprof"
	"sync/atomic"
	"time"
)

// execute runs t from its start to its terminal record and settles it.
func (rt *Runtime[S]) execute(t *Task) {
	t.begin()
	registered := StatusPending
	if t.startsRegistered {
		registered = StatusRunning
	}
	if t.ctx.Err() != nil {
		// Cancelled before it started (a shutdown, a supersede): record
		// the cause, if the record is still this run's and as it was
		// registered.
		rt.finishCancelled(t, registered, &State{}, nil)
		rt.settle(t)
		return
	}
	var st State
	if t.startsRegistered {
		// Its registering write was its start, which its subscribers saw
		// with the submission: only observers hear of the start again.
		st = t.registeredStart()
		if len(rt.cfg.Observers) > 0 {
			rt.reportLive(t, &change{kind: changeStarted, id: t.ID(), runID: t.RunID(), queue: t.opts.queue, task: t, state: st}, true)
		}
	} else {
		// A run-start is a durable, fenced read: if it does not land,
		// the store no longer says this run is PENDING (it was cancelled
		// or superseded), or the run was cancelled while the store failed
		// and write recorded that instead.
		st = State{Status: StatusRunning, StartedAt: now(), Attempt: 1}
		if !rt.write(opStart, t, StatusPending, &st, nil) || st.Status != StatusRunning {
			rt.settle(t)
			return
		}
	}
	if rt.attempts(t, &st) {
		return // timed out: the callback's goroutine settles the run
	}
	rt.settle(t)
}

// executeInOrder is execute for a queue that runs several items at once:
// it closes begun once the run's start is written, or once it ended
// without starting, so that its queue starts items in submission order.
// It is kept apart from execute so that the common path carries nothing
// for it.
func (rt *Runtime[S]) executeInOrder(t *Task, begun chan<- struct{}) {
	t.begin()
	if t.ctx.Err() != nil {
		close(begun)
		rt.finishCancelled(t, StatusPending, &State{}, nil)
		rt.settle(t)
		return
	}
	st := State{Status: StatusRunning, StartedAt: now(), Attempt: 1}
	running := rt.write(opStart, t, StatusPending, &st, nil) && st.Status == StatusRunning
	close(begun)
	if running && rt.attempts(t, &st) {
		return // timed out: the callback's goroutine settles the run
	}
	rt.settle(t)
}

// attempts runs the callback until it succeeds, fails for good or is
// cancelled, and records the outcome. It reports whether an attempt timed
// out and handed settling to the callback's goroutine.
//
// A callback that ends its goroutine with runtime.Goexit, as testing's
// FailNow does, never returns here: attempts then records the run FAILED
// and settles it on its way out, as its caller would have, and the
// goroutines above it (a runner, a queue's processor) end or go on as
// their own deferred calls say.
func (rt *Runtime[S]) attempts(t *Task, st *State) (handedOff bool) {
	unwound := true
	defer func() {
		if unwound && t.has(runGoexited) {
			rt.finishFailed(t, st, errGoexit)
			rt.settle(t)
		}
	}()
	handedOff = rt.attemptLoop(t, st)
	unwound = false
	return handedOff
}

// errGoexit is the failure of a run whose callback called runtime.Goexit
// instead of returning.
var errGoexit = Permanent(errors.New("workers: the callback called runtime.Goexit instead of returning (testing's FailNow, Fatal and SkipNow do)"))

// attemptLoop is attempts without its handling of runtime.Goexit.
func (rt *Runtime[S]) attemptLoop(t *Task, st *State) (handedOff bool) {
	var lastErr error
	for attempt := 1; ; attempt++ {
		t.run.Load().attempt.Store(int32(attempt))
		if attempt > 1 {
			st.Attempt, st.Progress = attempt, t.Progress()
			if !rt.write(opRetry, t, StatusRunning, st, lastErr) || st.Status != StatusRunning {
				return false // the record moved on without this run
			}
		}
		if attempt > 1 && rt.gate.isClosed() {
			// Shutdown began while the retry was being written (the
			// store was slow): no attempt begins mid-teardown, as from
			// the backoff.
			t.cancel(ErrShutdown) // a cause it has already stays
		}
		if t.ctx.Err() != nil {
			// Cancelled since its start or retry landed: the attempt
			// does not begin.
			rt.finishCancelled(t, StatusRunning, st, lastErr)
			return false
		}
		res, err, handedOff := rt.call(t, st)
		pe, panicked := asPanic(err)
		if panicked && !handedOff {
			rt.panicked(t, st, pe, err)
		}
		switch {
		case handedOff:
			return true
		case err == nil && !errors.Is(context.Cause(t.ctx), ErrAbandoned) && !rt.cancelledUndecided(t):
			rt.finishCompleted(t, st, res)
			return false
		case panicked && (attempt >= t.opts.retry.MaxAttempts || t.ctx.Err() != nil) && !errors.Is(context.Cause(t.ctx), ErrAbandoned):
			// A panic is the callback's own failure, not its answer to a
			// cancel: it fails the run when no retry is left, or none may
			// begin, the run being cancelled (a Cancel's record, written
			// first, fences it out).
			rt.finishFailed(t, st, err)
			return false
		case t.ctx.Err() != nil:
			// A run abandoned because its instance lost its lease records
			// that, even when its callback then returned a result: a
			// recoverer may already have ended the record, and a late
			// result must not land where none did.
			rt.finishCancelled(t, StatusRunning, st, err)
			return false
		case attempt >= t.opts.retry.MaxAttempts, isPermanent(err):
			rt.finishFailed(t, st, err)
			return false
		case !sleepUnless(t.ctx, t.opts.retry.backoff(attempt), rt.gate.shut):
			// Cancelled in its backoff, or Shutdown began: a run parked
			// there has no callback in flight to let finish within the
			// grace, and begins no attempt mid-teardown.
			t.cancel(ErrShutdown) // a cause it has already stays
			rt.finishCancelled(t, StatusRunning, st, err)
			return false
		}
		lastErr = err
	}
}

// call runs one attempt. Without a timeout it calls the callback here.
// With one, the callback runs on its own goroutine and call waits at most
// the timeout; when that expires it records the outcome and reports
// handedOff, and whichever of the two goroutines finishes last settles
// the run, so the run settles only after its terminal write. The handoff
// state is per attempt: an earlier attempt's goroutine can never touch it.
func (rt *Runtime[S]) call(t *Task, st *State) (res any, err error, handedOff bool) {
	if t.opts.timeout <= 0 {
		res, err = invoke(t, &rt.cfg)
		return res, err, false
	}
	type outcome struct {
		res any
		err error
	}
	out := make(chan outcome, 1)
	var claim atomic.Int32 // 1: the callback returned in time; 2: the waiter gave up
	var left atomic.Int32  // after a give-up: goroutines still to finish; the last settles
	left.Store(2)
	go func() {
		o := outcome{err: errGoexit} // what the callback's runtime.Goexit leaves
		defer func() {
			out <- o
			if !claim.CompareAndSwap(0, 1) {
				// The waiter gave up: nobody reads o, so a panic is
				// logged here or never.
				if pe, ok := asPanic(o.err); ok {
					rt.panickedLate(t, pe)
				}
				if left.Add(-1) == 0 {
					rt.settle(t)
				}
			}
		}()
		o.res, o.err = invoke(t, &rt.cfg)
	}()
	timer := time.NewTimer(t.opts.timeout)
	defer timer.Stop()
	select {
	case o := <-out:
		return o.res, o.err, false
	case <-timer.C:
	}
	if !claim.CompareAndSwap(0, 2) {
		o := <-out // the callback returned as the timer fired
		return o.res, o.err, false
	}
	t.cancel(&TimeoutError{Timeout: t.opts.timeout})
	// The first cause sticks: a cancel that landed before the timeout is
	// what gets recorded.
	rt.finishCancelled(t, StatusRunning, st, nil)
	if left.Add(-1) == 0 {
		rt.settle(t)
	}
	return nil, nil, true
}

// invoke calls the callback, wrapped in the configured middleware,
// turning a panic in either into a *PanicError. A callback that calls
// runtime.Goexit never returns: invoke logs it with its stack and marks
// the run runGoexited for its caller's deferred handling (see attempts).
//
// The goroutine, which may have run another owner's task before and may
// run one after, is this run's while the callback runs: its profiler
// labels are those of the submission's context (pprof.Do), and neither
// they nor a debug.SetPanicOnFault of the callback's outlive the call.
func invoke(t *Task, cfg *Config) (res any, err error) {
	pprof.SetGoroutineLabels(t.ctx)
	returned := false
	defer func() {
		debug.SetPanicOnFault(false)
		pprof.SetGoroutineLabels(context.Background())
		if r := recover(); r != nil {
			res, err = nil, &PanicError{Value: r, Stack: debug.Stack()}
		} else if !returned {
			goexited(t, cfg)
		}
	}()
	fn := t.fn
	if len(cfg.Middleware) > 0 {
		fn = wrap(fn, cfg.Middleware)
	}
	res, err = fn(t.ctx, t)
	returned = true
	return res, err
}

// goexited logs a callback's runtime.Goexit with its stack, at error
// level, and marks its run. It is kept out of line, like panicked.
//
//go:noinline
func goexited(t *Task, cfg *Config) {
	cfg.Logger.Error("workers: task called runtime.Goexit", "task", t.ID(), "run", t.RunID(), "stack", string(debug.Stack()))
	t.mark(runGoexited)
}

// panicked logs a callback's panic with its stack, at error level, and
// reports it to observers. It is kept out of line, like logRunError.
//
//go:noinline
func (rt *Runtime[S]) panicked(t *Task, st *State, pe *PanicError, err error) {
	rt.cfg.Logger.Error("workers: task panicked", "task", t.ID(), "run", t.RunID(), "attempt", st.Attempt,
		"panic", pe.Value, "stack", string(pe.Stack))
	rt.reportLive(t, &change{kind: changePanicked, id: t.ID(), runID: t.RunID(), queue: t.opts.queue, task: t, state: *st, err: err}, false)
}

// reportLive reports c, a change of live run t that the run's own
// goroutine made (its start, a retry, a panic). Observers never hear of
// it after the run's end: if another writer's end (a Cancel's, say) was
// claimed first, they do not hear of it at all (Wait and the streams
// order it themselves); one claimed while they hear of it waits, and is
// reported after it. observersOnly reports c to the observers alone.
func (rt *Runtime[S]) reportLive(t *Task, c *change, observersOnly bool) {
	if len(rt.cfg.Observers) == 0 {
		if !observersOnly {
			rt.emit(c)
		}
		return
	}
	if t.flags.Or(runLiveReporting)&runEndSeen == 0 {
		if observersOnly {
			rt.observe(c)
		} else {
			rt.emit(c)
		}
	} else if !observersOnly {
		rt.emitStreams(c)
	}
	// An end that waited for this report goes now, unless the submission
	// is still to be reported, whose report takes it (see announce).
	if f := t.flags.And(^runLiveReporting); f&runEndWaiting != 0 && f&runAnnounced != 0 {
		rt.reportEarly(t)
	}
}

// panickedLate logs the panic of a callback that outlived its timeout:
// its run was recorded, and its end reported, when the timeout expired,
// so the panic reaches only the log.
//
//go:noinline
func (rt *Runtime[S]) panickedLate(t *Task, pe *PanicError) {
	rt.cfg.Logger.Error("workers: task panicked after its timeout", "task", t.ID(), "run", t.RunID(), "attempt", t.Attempt(),
		"panic", pe.Value, "stack", string(pe.Stack))
}

// encodeResult marshals a callback's result and checks that every store
// can hold it (see checkResult). A panicking MarshalJSON is the
// callback's code, so it fails the run, not the process.
func encodeResult(res any) (b []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			b, err = nil, &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	if b, err = json.Marshal(res); err == nil {
		err = checkResult(b)
	}
	return b, err
}

// errorText is err.Error() with a panic in it recovered, for the same
// reason.
func errorText(err error) (s string) {
	defer func() {
		if r := recover(); r != nil {
			s = (&PanicError{Value: r}).Error()
		}
	}()
	return err.Error()
}

// sleep waits for d unless ctx ends first, and reports whether it waited
// the whole time.
func sleep(ctx context.Context, d time.Duration) bool {
	return sleepUnless(ctx, d, nil)
}

// sleepUnless is sleep, cut short also when stop is closed. A stop or
// an end of ctx that comes as the wait runs out wins over it.
func sleepUnless(ctx context.Context, d time.Duration, stop <-chan struct{}) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-ctx.Done():
		return false
	case <-stop:
		return false
	}
	select {
	case <-stop:
		return false
	default:
		return ctx.Err() == nil
	}
}

func (rt *Runtime[S]) finishCompleted(t *Task, st *State, res any) {
	if res != nil {
		b, err := encodeResult(res)
		if err != nil {
			if !errors.Is(err, ErrResultEncoding) {
				err = fmt.Errorf("%w: %w", ErrResultEncoding, err)
			}
			rt.finishFailed(t, st, err)
			return
		}
		st.Result = b
	}
	rt.finish(t, StatusRunning, st, outcome{StatusCompleted, CauseCompleted, ""}, nil)
}

// finishFailed records a callback's error as the run's FAILED outcome: a
// panic keeps its stack, truncated to MaxStackLen, for System readers.
func (rt *Runtime[S]) finishFailed(t *Task, st *State, err error) {
	code := CauseFailed
	if pe, ok := asPanic(err); ok {
		code = CausePanicked
		st.Stack = truncateText(cleanText(string(pe.Stack)), MaxStackLen)
	} else if isPermanent(err) {
		code = CausePermanent
	}
	rt.finish(t, StatusRunning, st, outcome{StatusFailed, code, cleanText(errorText(err))}, err)
}

// finishCancelled records the outcome of the cause t's context carries,
// rendered through the reasons table. err is the callback's error, if it
// returned one, for observers.
func (rt *Runtime[S]) finishCancelled(t *Task, from Status, st *State, err error) {
	rt.finish(t, from, st, rt.cancelOutcome(t), err)
}

// finish writes a run's terminal record.
func (rt *Runtime[S]) finish(t *Task, from Status, st *State, o outcome, err error) {
	t.mark(runFinishing)
	rt.endState(t, st, o, now())
	st.Progress = t.Progress()
	rt.write(opFinish, t, from, st, err)
}

// cancelledUndecided reports whether run t was cancelled by a Cancel of
// this runtime that could not tell whether its own write landed: the
// run's end is then that cancel's, whatever the callback returned, as
// the record says if that write did land.
func (rt *Runtime[S]) cancelledUndecided(t *Task) bool {
	return t.has(runCancelNoted) && t.ctx.Err() != nil
}

// cancelOutcome is the end of run t, whose context was cancelled: its
// cause's, unless a Cancel that could not tell whether its own write
// landed cancelled it, whatever cancelled it first (a shutdown, say);
// then that Cancel's, as its write would have left, had it landed.
func (rt *Runtime[S]) cancelOutcome(t *Task) outcome {
	if t.has(runCancelNoted) {
		return causeOutcome(ErrCancelled)
	}
	return causeOutcome(t.cause())
}

// endState writes o, run t's end, into st, with the completion time at.
// A run cancelled by a Cancel of this runtime that could not tell
// whether its own write landed records who cancelled it and why, as
// that write would have (see Cancel).
func (rt *Runtime[S]) endState(t *Task, st *State, o outcome, at time.Time) {
	o.apply(st, at)
	if o.code != CauseCancelled || !t.has(runCancelNoted) {
		return
	}
	if n, ok := rt.cancels.Load(t); ok {
		st.CancelledBy, st.CancelReason = n.(cancelNote).by, n.(cancelNote).reason
	}
}

// runOp names a run's store writes, for logs and for the change each
// reports once it lands.
type runOp uint8

const (
	opStart runOp = iota
	opRetry
	opProgress
	opFinish
	opAbandon
)

var runOps = [...]struct {
	name   string
	change changeKind
}{
	opStart:    {"start", changeStarted},
	opRetry:    {"retry", changeRetrying},
	opProgress: {"progress", changeProgress},
	opFinish:   {"finish", changeFinished},
	opAbandon:  {"abandon", changeFinished},
}

// Backoff of a run write whose store call failed for a transient reason.
const (
	writeBackoffMin = 5 * time.Millisecond
	writeBackoffMax = 2 * time.Second
)

// write makes one store write of a run durable: a transition fenced on
// the run's id and the status it expects. A fenced-out write is the
// expected fate of a superseded or cancelled run's late write, not an
// error: write reports false, and reports the run's end if another
// writer made it and nobody here reported it yet (see reportEndFound).
//
// A store error is classified by permanentStoreError. A transient one is
// retried with capped exponential backoff, still fenced on the run id,
// for as long as the runtime lives (until Shutdown gives up); since the
// failed call may have landed, a retry that finds itself fenced out reads
// the record, and counts the write as landed when the record holds
// exactly what it wrote. A permanent one turns st into a FAILED record
// saying the store refused the outcome, which is retried in turn; a start
// refused for good, or a run cancelled while its start was being
// retried, becomes that terminal write too, so st.Status tells the caller
// what landed. err is the callback's error, reported with the change.
func (rt *Runtime[S]) write(op runOp, t *Task, from Status, st *State, err error) bool {
	return rt.writeWithin(rt.life, op, t, from, st, err)
}

// writeWithin is write, whose tries end with life rather than with the
// runtime's life: life is that, or ends sooner (see Reset).
func (rt *Runtime[S]) writeWithin(life context.Context, op runOp, t *Task, from Status, st *State, err error) bool {
	r := t.ensureState()
	t.mark(runWriting) // before the lock: a pass that finds it taken by this write does not wait
	r.writeMu.Lock()
	ok, fenced := rt.writeLocked(life, op, t, from, st)
	t.flags.And(^runWriting)
	r.writeMu.Unlock()
	if ok {
		if st.Status.Terminal() {
			op = opFinish
			t.mark(runEndSeen) // the run's end is this write's
		}
		c := &change{kind: runOps[op].change, id: t.ID(), runID: t.RunID(), queue: t.opts.queue, task: t, state: *st, err: err}
		if op == opStart || op == opRetry {
			rt.reportLive(t, c, false)
		} else {
			rt.emit(c)
		}
		return true
	}
	if h := rt.hooks.Load(); h != nil && h.wrote != nil {
		h.wrote()
	}
	if t.has(runEndKept) {
		// The sync loop found, while this write went on, that another
		// writer ended the run: that end is the run's (reported once).
		if c, kept := rt.found.LoadAndDelete(t); kept {
			rt.reportEnd(t, *c.(*change))
			return false
		}
	}
	if fenced {
		started := st.StartedAt
		if op == opStart {
			started = time.Time{} // the start did not land
		}
		rt.reportEndFound(op, t, started)
	}
	return false
}

// reportEndFound follows a write of run t that was fenced out: the
// record moved on without the run. Unless the run's end was reported
// already, it reads the record, and reports the end another writer made
// if the record holds one of this run's: a cancel made elsewhere of a
// run that had not started here, say, whose start is fenced out at its
// turn, and which nothing else here would report. After Shutdown it
// reads only for a run's own outcome, and only for observers, who may
// hold something open for the run (a span): a run Shutdown left
// executing, recovered elsewhere since, ends for them too, as does one
// whose record moved on to another run meanwhile (see reportMoved).
// started is when the run started, or zero if it did not. A run whose
// start was fenced out never ran: its context is cancelled with what the
// record says ended it (the cause its end keeps, ErrSuperseded, or
// ErrDeleted), as the notice of that end would have had it, had it come
// before the run's turn.
func (rt *Runtime[S]) reportEndFound(op runOp, t *Task, started time.Time) {
	if t.has(runEndSeen) {
		return
	}
	if rt.life.Err() != nil && (op != opFinish || len(rt.cfg.Observers) == 0) {
		return
	}
	rec, err := rt.readBack(rt.life, t, rt.life.Err() != nil)
	cause := overBy(t, &rec, err)
	if cause == nil {
		return
	}
	if op == opStart {
		t.cancel(cause)
	}
	if end, ok := endOf(t, &rec); err == nil && ok {
		rt.reportEnd(t, end)
	} else {
		rt.reportMoved(t, started, cause)
	}
}

// endOf returns the finished change of run t that rec, its id's record,
// holds, and reports whether it holds one: whether rec is t's run's and
// terminal.
func endOf(t *Task, rec *Record) (change, bool) {
	if rec.RunID != t.RunID() || !rec.Status.Terminal() {
		return change{}, false
	}
	return change{kind: changeFinished, id: t.ID(), runID: t.RunID(), queue: t.opts.queue, task: t, created: rec.CreatedAt, state: rec.State}, true
}

// writeLocked is writeWithin with the run's writeMu held. It reports
// whether the write landed, and, when it did not, whether it was fenced
// out (or found the record gone) rather than given up.
func (rt *Runtime[S]) writeLocked(life context.Context, op runOp, t *Task, from Status, st *State) (ok, fenced bool) {
	// A write begun after Shutdown's cutoff is a late callback's outcome:
	// it gets one try bounded on its own (see transition). One begun
	// before has the runtime's life for its bound, and gives up when the
	// cutoff ends it, as Shutdown counts it.
	late := rt.life.Err() != nil && op != opAbandon
	var failed error    // the last attempt's error: it may have landed
	registered := false // a read found the retired run's record (see retiredRecord)
	backoff := writeBackoffMin
	for try := 1; ; try++ {
		fence := statusSet(from)
		if op == opStart && st.Status.Terminal() || from == StatusRunning && (op == opFinish || op == opRetry) {
			// The start became the run's end, refused or cancelled after
			// a failed try, which may have landed: the end is written
			// over the RUNNING record that try would have left, too. And
			// a record of the run's own that says PENDING lost the run's
			// start (a failover to a replica that lacked it): the run's
			// outcome, or a retry, is written over it too.
			fence = fromStarting
		}
		ok, err := rt.transition(life, t, fence, st, late)
		if !ok && err == nil && failed != nil {
			// Fenced out after a failed try: that try may have landed.
			switch landed, known := rt.landed(life, t, st, late); {
			case landed:
				t.setState(st)
				return true, false
			case !known:
				err = errLandedUnknown // try again, as after a transient error
			}
		}
		switch {
		case ok:
			t.setState(st)
			return true, false
		case err == nil, errors.Is(err, ErrNotFound):
			return false, true // fenced out, or the record is gone
		case life.Err() != nil:
			rt.cutShort(late, op, t, err)
			return false, false
		case permanentStoreError(err):
			if st.Status.Terminal() && st.Cause == CauseStore {
				rt.giveUp("workers: the store refused a run's fallback outcome; the record is left for recovery", op, t, err)
				return false, false
			}
			rt.logRunError("workers: the store refused a run write for good; recording the run FAILED", op, t, err)
			refused(st, err)
			failed = err
			continue
		}
		if t.has(runRetired) && !registered {
			absent, answered := rt.retiredRecord(life, t)
			if absent {
				return false, true // as the transition would find the record
			}
			registered = answered
		}
		if try == 1 || try%16 == 0 {
			rt.logRunError("workers: run write failed; retrying", op, t, err)
		}
		failed = err
		if (op == opStart || op == opRetry) && t.cause() != nil && !st.Status.Terminal() {
			// Cancelled while its start, or a retry's, could not be
			// written: record the cancellation instead of starting the
			// attempt. A retry's run began with the attempt before.
			cancelled := State{Progress: t.Progress()}
			if op == opRetry {
				cancelled.StartedAt, cancelled.Attempt = st.StartedAt, st.Attempt-1
			}
			*st = cancelled
			rt.endState(t, st, rt.cancelOutcome(t), now())
		}
		if !sleep(life, jitter(backoff)) {
			// The runtime's life ended: Shutdown's cutoff, at which it
			// counts this write among the records left unwritten; or
			// Reset's ctx did, and a later Shutdown counts it.
			rt.cutShort(late, op, t, err)
			return false, false
		}
		if h := rt.hooks.Load(); h != nil && h.backedOff != nil {
			h.backedOff()
		}
		backoff = min(2*backoff, writeBackoffMax)
	}
}

// gaveUpAtShutdown is the log message of a run write given up because the
// runtime's life ended.
const gaveUpAtShutdown = "workers: run write abandoned: the runtime shut down; the record is left for recovery"

// gaveUpMessage is the log message of a run write given up because the
// bound of its tries ended: the runtime's life, or else Reset's ctx.
func gaveUpMessage(life context.Context) string {
	if life.Err() != nil {
		return gaveUpAtShutdown
	}
	return "workers: run write abandoned: Reset's context ended; the record is left for recovery"
}

// giveUp records that run t's write of op was given up, with err, its
// last try's error: the record is left for recovery, and Shutdown counts
// it among the records left unwritten.
func (rt *Runtime[S]) giveUp(msg string, op runOp, t *Task, err error) {
	l := &rt.left
	l.mu.Lock()
	l.add(t)
	l.mu.Unlock()
	rt.logRunError(msg, op, t, err)
}

// cutShort is giveUp for a write of run t given up because the bound of
// its tries ended, with err, its last try's error. A late write (see
// transition) made its one try, on its own bound, and failed for a
// reason of its own: it logs its own line. Any other was cut off at
// Shutdown's cutoff, or when Reset's ctx ended, as every write in
// flight or still to begin then was: it is tallied for the one line
// that logs them all (see logCutoff), rather than logged on its own,
// which for a long backlog took more time than the cutoff leaves. Once
// Shutdown logged that line, a write given up since (one in flight as
// Shutdown returned) logs its own.
func (rt *Runtime[S]) cutShort(late bool, op runOp, t *Task, err error) {
	if late {
		rt.giveUp(gaveUpMessage(rt.life), op, t, err)
		return
	}
	l := &rt.left
	l.mu.Lock()
	own := l.addCut(op, t, err)
	l.mu.Unlock()
	if own {
		rt.logRunError(gaveUpMessage(rt.life), op, t, err)
	}
}

// lastWriteTimeout bounds the one try a run makes to write its outcome
// after Shutdown gave up on it.
const lastWriteTimeout = 5 * time.Second

// transition is one try of a run's write. A write begun while the
// runtime lives carries life, the runtime's life, which Shutdown's
// cutoff ends, or a shorter one (see Reset), bounded
// by StoreTimeout (see bounded), on every try: once the cutoff has
// passed, a try fails at once, and the write gives up, so that no try
// outlives the Shutdown that counted it. A late write (begun after the
// cutoff: the outcome of a run whose callback returned late) gets its
// one try bounded on its own, since no Shutdown waits for it; a queue
// item's abandon write, made for Shutdown, is never late.
func (rt *Runtime[S]) transition(life context.Context, t *Task, from []Status, st *State, late bool) (bool, error) {
	var ctx context.Context
	var cancel context.CancelFunc
	if late {
		ctx, cancel = context.WithTimeout(context.Background(), lastWriteTimeout)
	} else {
		ctx, cancel = rt.bounded(life) // each try: one cut off is tried again
	}
	defer cancel()
	if rt.mem != nil {
		return rt.mem.transition(ctx, t.ID(), t.rec, t.RunID(), from, *st)
	}
	ok, err := rt.store.TransitionTask(ctx, t.ID(), t.RunID(), from, *st)
	return ok, rt.cutOff(ctx, err)
}

// errStoreCutOff is the cause of the deadline Config.StoreTimeout sets.
var errStoreCutOff = errors.New("workers: store call cut off by StoreTimeout")

// bounded returns ctx bounded by Config.StoreTimeout, for a store call
// the runtime makes on its own, and the func that releases the bound.
// Over a MemStore, or with the bound disabled, it returns ctx as it is.
func (rt *Runtime[S]) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if rt.mem != nil || rt.cfg.StoreTimeout < 0 {
		return ctx, noCancel
	}
	return context.WithTimeoutCause(ctx, rt.cfg.StoreTimeout, errStoreCutOff)
}

func noCancel() {}

// boundedCall runs f, a store call, under ctx bounded by StoreTimeout,
// and returns its error as cutOff does.
func (rt *Runtime[S]) boundedCall(ctx context.Context, f func(context.Context) error) error {
	call, cancel := rt.bounded(ctx)
	defer cancel()
	return rt.cutOff(call, f(call))
}

// cutOff returns err, the error of a store call made under ctx (see
// bounded), as an error that names StoreTimeout when its bound ended the
// call, rather than as context.DeadlineExceeded alone, which reads as a
// deadline of the caller's.
func (rt *Runtime[S]) cutOff(ctx context.Context, err error) error {
	if err != nil && context.Cause(ctx) == errStoreCutOff {
		return fmt.Errorf("workers: the store did not answer within StoreTimeout (%v): %w", rt.cfg.StoreTimeout, err)
	}
	return err
}

// errLandedUnknown is the failure of a write whose earlier try may have
// landed when the record could not be read to tell.
var errLandedUnknown = errors.New("workers: could not read whether an earlier try of the write landed")

// landed reports whether the record holds exactly the state st of run t,
// which a write that reported a failure may have stored after all; known
// is false if the record could not be read (see readBack).
func (rt *Runtime[S]) landed(life context.Context, t *Task, st *State, late bool) (landed, known bool) {
	rec, err := rt.readBack(life, t, late)
	switch {
	case err == nil:
		return wrote(&rec, t.RunID(), st), true
	case errors.Is(err, ErrNotFound):
		return false, true
	}
	return false, false
}

// readBack reads t's record after a write that did not land, or did not
// say whether it did. A read that fails for a transient reason is
// retried with backoff, within the bound of the write's own tries (see
// transition): life, the runtime's, which Shutdown's cutoff ends, or a
// shorter one (see Reset), unless the write is late, begun after that
// cutoff.
func (rt *Runtime[S]) readBack(life context.Context, t *Task, late bool) (Record, error) {
	parent := life
	if late {
		parent = context.WithoutCancel(rt.life)
	}
	ctx, cancel := context.WithTimeout(parent, lastWriteTimeout)
	defer cancel()
	backoff := writeBackoffMin
	for {
		rec, err := rt.store.GetTask(ctx, t.ID())
		if err == nil || errors.Is(err, ErrNotFound) || ctx.Err() != nil || permanentStoreError(err) || !sleep(ctx, jitter(backoff)) {
			return rec, err
		}
		backoff = min(2*backoff, writeBackoffMax)
	}
}

// retiredRecord reads the id of retired run t, whose end is written
// only over a record its failed registering write left, after a try of
// that write failed: absent reports that the read found no record of
// t's run (none, or another run's), answered that the read answered. A
// store that refuses writes while it answers reads (read-only after a
// failover, a full disk) tells so at once, where the end's write would
// fail, and be retried, logged and counted by Shutdown as unwritten,
// until writes are accepted again. A read that fails tells nothing, and
// the next failed try reads again; one that finds the record ends the
// reads.
func (rt *Runtime[S]) retiredRecord(life context.Context, t *Task) (absent, answered bool) {
	ctx, cancel := rt.bounded(life)
	defer cancel()
	rec, err := rt.store.GetTask(ctx, t.ID())
	switch {
	case errors.Is(err, ErrNotFound):
		return true, true
	case err != nil:
		return false, false
	}
	return rec.RunID != t.RunID(), true
}

// refused turns st into the FAILED record of a run whose write the store
// refused for good.
func refused(st *State, err error) {
	*st = State{Progress: st.Progress, Attempt: st.Attempt, StartedAt: st.StartedAt}
	outcome{StatusFailed, CauseStore, cleanText("the store refused the run's outcome: " + err.Error())}.apply(st, now())
}

// permanentStoreError is the one place that classifies a store error: it
// reports whether the same call would fail the same way however often it
// were retried, because the store refused the data itself (ErrInvalidData,
// ErrResultEncoding, ErrInvalidOption, ErrInvalidKey, ErrInvalidRunID).
// Every other error (a dropped connection, a timeout, a serialization
// failure, an error this package does not know) is transient.
func permanentStoreError(err error) bool {
	for _, p := range [...]error{ErrInvalidData, ErrResultEncoding, ErrInvalidOption, ErrInvalidKey, ErrInvalidRunID} {
		if errors.Is(err, p) {
			return true
		}
	}
	return false
}

// jitter spreads d over [d/2, d), so that runs failing together do not
// retry in step.
func jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d/2+1)
}

// logRunError logs a store error met on a run's behalf. It is kept out of
// line so that the run's own frames stay small: a run's goroutine starts
// with a small stack, and growing it costs a copy.
//
//go:noinline
func (rt *Runtime[S]) logRunError(msg string, op runOp, t *Task, err error) {
	rt.cfg.Logger.Error(msg, "op", runOps[op].name, "task", t.ID(), "run", t.RunID(), "err", err)
}

// fromPending and fromRunning are the from lists of a run's writes,
// shared so that they do not allocate; stores never retain or modify a
// from list.
var (
	fromPending = []Status{StatusPending}
	fromRunning = []Status{StatusRunning}
	// fromStarting is the from list of a start that became its run's
	// end after a try that may have landed (see writeLocked): only a
	// run's first start is written from PENDING, so a RUNNING record
	// under its run id is that try's. It is also that of a started
	// run's outcome and retries: a PENDING record under its run id is
	// its own, whose start was lost.
	fromStarting = []Status{StatusPending, StatusRunning}
)

func statusSet(s Status) []Status {
	switch s {
	case StatusPending:
		return fromPending
	case StatusRunning:
		return fromRunning
	}
	return []Status{s}
}

// now is the one clock reading per transition: UTC, to the microsecond
// that every store keeps.
func now() time.Time { return toMicro(time.Now()) }

// toMicro returns t in UTC, truncated to the microsecond, without its
// monotonic reading: t.UTC().Truncate(time.Microsecond), without
// Truncate's general division. It holds for the times Unix microseconds
// can count, about 290,000 years either side of 1970, which take in every
// time a MemStore keeps; now is its only caller.
func toMicro(t time.Time) time.Time { return time.UnixMicro(t.UnixMicro()).UTC() }

// wrote reports whether rec is what a write of st by run runID left: how
// a write that reported an error is found to have landed all the same.
// Progress is not compared: the sync loop may have moved it since.
func wrote(rec *Record, runID string, st *State) bool {
	return rec.RunID == runID && rec.Status == st.Status && rec.Cause == st.Cause && rec.Attempt == st.Attempt &&
		rec.StartedAt.Equal(st.StartedAt) && rec.CompletedAt.Equal(st.CompletedAt)
}
