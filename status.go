package workers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Wait's and Watch's fallback polls. A task this runtime runs, over a
// Notifier store whose listener listens, is not polled: its changes reach
// them as events, and those made elsewhere through notices (a listener
// that reconnects resyncs; one that stops wakes them to poll again). A
// task this runtime runs otherwise, or another runtime's task over a
// Notifier store, is read at waitFallback, in case a change made
// elsewhere, or its notice, is lost; another runtime's task over a store
// without notices, at waitPoll.
const (
	waitPoll     = 50 * time.Millisecond
	waitFallback = time.Second
)

// fallbackPoll returns when Wait or Watch reads a task again by itself
// (see waitFallback): own is whether this runtime runs it, notices
// whether the store is a Notifier. It returns nil when nothing is to be
// polled.
func (rt *Runtime[S]) fallbackPoll(own, notices bool) <-chan time.Time {
	switch {
	case own && notices && rt.listening.Load():
		return nil // its changes come as events, others' through notices
	case own || notices:
		return time.After(waitFallback) // a notice may be lost
	}
	return time.After(waitPoll)
}

// Wait blocks until the task id's record has ended, or ctx ends, and
// returns its final snapshot. It returns when the record ends, not when
// the callback does: a run that timed out, was cancelled, superseded,
// shut down or recovered is terminal in the store at once, and Wait
// returns then even while its callback runs on. A record deleted under
// a started run of this runtime (by an operator, or lost in a failover)
// ends Wait with ErrNotFound once the runtime finds it gone (see
// Config.SyncInterval) and cancels the run, whether or not its callback
// has returned. Under a run still waiting for its turn (a queue,
// Config.Limits), a Wait begun before the delete over a Notifier store
// ends once the runtime learns of the delete: from the store's notice of
// it (the SQL stores announce a live record deleted by hand), from the
// listener's reconnect, or at that turn. A
// change made by this runtime, or announced by a Notifier store, wakes
// Wait at once; a task another runtime runs over a store without
// notices is read every 50ms.
// Wait works after Shutdown too, reading the store as Status does.
// How the task ended is in the snapshot, not in Wait's error: for a task
// that FAILED or was CANCELLED Wait returns a nil error, and the
// snapshot's Err (or ResultAs) returns the task's *TaskError.
// Errors are those of Status, ErrInvalidConfig (see NewRuntime), the
// error of taking the instance lease over a Leaser store when this
// runtime has not taken it yet, or ctx.Err(); once Wait has read the
// record, a store error that may pass (any but ErrNotFound and the data
// errors that never do) is retried every 50ms until ctx ends, so a
// database blip does not end a Wait.
func (rt *Runtime[S]) Wait(ctx context.Context, id string, auth TaskAuthority) (Snapshot, error) {
	if err := checkContext(ctx); err != nil {
		return Snapshot{}, err
	}
	// The lease starts the listener that wakes Wait. A runtime shut down
	// has none to start, and Wait reads the store as Status does.
	if err := rt.ensureLease(ctx); err != nil && !errors.Is(err, ErrClosed) {
		return Snapshot{}, err
	}
	_, notices := any(rt.store).(Notifier)
	run := "" // the run the last read found
	// The bell listened to, released however Wait ends: a store that
	// panics (recovered by the caller's server), or ends the goroutine
	// with runtime.Goexit, must not leave it, nor the count of
	// listeners, behind.
	var release func()
	defer func() {
		if release != nil {
			release()
		}
	}()
	for read := false; ; read = true {
		// Listen before reading, so a change between the read and the
		// wait still wakes it.
		var ring <-chan struct{}
		ring, release = rt.bells.listen(id, run)
		rec, err := rt.visibleRecord(ctx, id, auth)
		run = rec.RunID
		retry := err != nil && read && ctx.Err() == nil && !errors.Is(err, ErrNotFound) && !permanentStoreError(err)
		if !retry && (err != nil || rec.Status.Terminal()) {
			if err != nil {
				return Snapshot{}, err
			}
			return rt.snapshot(&rec, isSystem(auth)), nil
		}
		var poll <-chan time.Time
		if retry {
			poll = time.After(waitPoll)
		} else {
			poll = rt.fallbackPoll(rt.handle(id, rec.RunID) != nil, notices)
		}
		select {
		case <-ring:
		case <-poll:
		case <-ctx.Done():
		}
		release()
		release = nil
		if ctx.Err() != nil {
			return Snapshot{}, ctx.Err()
		}
	}
}

// bells wake the waiters of a task id when it changes. A bell exists
// while someone listens to it, so a task nobody waits for costs a ring
// one atomic load.
type bells struct {
	listeners atomic.Int64 // how many listen now
	mu        sync.Mutex
	m         map[string]*bell // guarded by mu
}

type bell struct {
	ch   chan struct{} // closed by the next ring
	refs int           // guarded by bells.mu
	// run is the run its listeners last read, or "" if they read none, or
	// not the same: a notice that a live record is another run's rings
	// it (see ringMoved).
	run string // guarded by bells.mu
}

// listen returns a channel closed at id's next ring, and the func that
// stops listening. run is the run of id the caller last read, or "".
func (b *bells) listen(id, run string) (<-chan struct{}, func()) {
	b.listeners.Add(1)
	b.mu.Lock()
	if b.m == nil {
		b.m = make(map[string]*bell)
	}
	bl := b.m[id]
	if bl == nil {
		bl = &bell{ch: make(chan struct{}), run: run}
		b.m[id] = bl
	} else if bl.run != run {
		bl.run = ""
	}
	bl.refs++
	b.mu.Unlock()
	return bl.ch, func() {
		b.mu.Lock()
		if bl.refs--; bl.refs == 0 && b.m[id] == bl {
			delete(b.m, id)
		}
		b.mu.Unlock()
		b.listeners.Add(-1)
	}
}

// ring wakes id's listeners.
func (b *bells) ring(id string) {
	if b.listeners.Load() == 0 {
		return
	}
	b.mu.Lock()
	if bl := b.m[id]; bl != nil {
		close(bl.ch)
		delete(b.m, id)
	}
	b.mu.Unlock()
}

// ringMoved wakes id's listeners on a notice that its record is live
// and run run's (or an unknown run's, with ""): only those who last read
// another run, or none, since a live record of the run they read cannot
// end their wait. A run cancelled and its key re-run elsewhere may reach
// them as the new run's notice alone.
func (b *bells) ringMoved(id, run string) {
	if b.listeners.Load() == 0 {
		return
	}
	b.mu.Lock()
	if bl := b.m[id]; bl != nil && (run == "" || bl.run != run) {
		close(bl.ch)
		delete(b.m, id)
	}
	b.mu.Unlock()
}

// ringAll wakes every listener.
func (b *bells) ringAll() {
	if b.listeners.Load() == 0 {
		return
	}
	b.mu.Lock()
	for id, bl := range b.m {
		close(bl.ch)
		delete(b.m, id)
	}
	b.mu.Unlock()
}

// Status returns a snapshot of the task id, if auth may see it: a
// watcher, the owner the id names, or System. For any other caller it
// returns ErrNotFound, exactly as for a task that does not exist, so
// Status never reveals that someone else's task exists. Progress is read
// live when the run executes in this runtime. Errors: ErrInvalidOption
// for a nil ctx, ErrNoAuthority, a *ValidationError (ErrInvalidKey),
// ErrNotFound, or a store error.
func (rt *Runtime[S]) Status(ctx context.Context, id string, auth TaskAuthority) (Snapshot, error) {
	if err := checkContext(ctx); err != nil {
		return Snapshot{}, err
	}
	rec, err := rt.visibleRecord(ctx, id, auth)
	if err != nil {
		return Snapshot{}, err
	}
	var t *Task
	if !rec.Status.Terminal() {
		t = rt.handle(rec.ID, rec.RunID)
		if t == nil && rec.Status == StatusRunning && InstanceOf(rec.RunID) == rt.instance {
			// A run of this runtime that settled since the read: the
			// record read may hold less progress than a Status before
			// this one showed live. The record read again holds its
			// end.
			if again, err := rt.visibleRecord(ctx, id, auth); err == nil {
				rec = again
			}
			if !rec.Status.Terminal() {
				t = rt.handle(rec.ID, rec.RunID)
			}
		}
	}
	// The handle looked up once: one that settles meanwhile still holds
	// the progress it showed.
	return rt.snapshotOf(&rec, t, isSystem(auth)), nil
}

// snapshot renders a record, with live progress when this runtime runs it;
// the stack of a panic is shown to System only. A live run held here
// learns the record's watchers, which may have grown by a join made
// through another runtime. Its subscribers then read the record again,
// so a watcher who may now see the run is shown it: as the record is
// then, not as this read found it, which the run may have left behind
// since. (Observers heard of the join from the runtime that made it.)
func (rt *Runtime[S]) snapshot(rec *Record, system bool) Snapshot {
	var t *Task
	if !rec.Status.Terminal() {
		t = rt.handle(rec.ID, rec.RunID)
	}
	return rt.snapshotOf(rec, t, system)
}

// snapshotOf is snapshot with t, the handle of rec's run when this
// runtime holds it (nil otherwise), looked up already.
func (rt *Runtime[S]) snapshotOf(rec *Record, t *Task, system bool) Snapshot {
	var s Snapshot
	s.fromRecord(rec, system)
	if t != nil && !s.Status.Terminal() {
		if t.learnWatchers(rec.Watchers) && rt.hub.n.Load() > 0 {
			rt.hub.reread(s.ID, rec.Watchers)
		}
		t.showLive(&s)
	}
	return s
}

// live sets s's progress and attempt from the run, when this runtime runs
// it. The run's attempt is never taken below the record's: a run counts
// its attempt when it begins it, which may come after the write that
// recorded it (the registering write of a run registered RUNNING, a
// queue item's start).
func (rt *Runtime[S]) live(s *Snapshot) {
	if s.Status == StatusRunning {
		if t := rt.handle(s.ID, s.RunID); t != nil {
			t.showLive(s)
		}
	}
}

// showLive is live for s, a snapshot of run t.
func (t *Task) showLive(s *Snapshot) {
	if s.Status == StatusRunning {
		s.Progress, s.Attempt = t.Progress(), max(s.Attempt, t.Attempt())
	}
}

// visibleRecord reads id's record durably and returns it if auth may see
// it, ErrNotFound otherwise.
func (rt *Runtime[S]) visibleRecord(ctx context.Context, id string, auth TaskAuthority) (Record, error) {
	c, err := resolve(auth)
	if err != nil {
		return Record{}, err
	}
	if err := validateID(id); err != nil {
		return Record{}, err
	}
	rec, err := rt.store.GetTask(ctx, id)
	if errors.Is(err, ErrNotFound) {
		return Record{}, ErrNotFound // the very answer a non-watcher gets
	}
	if err != nil {
		return Record{}, err
	}
	if !c.system && !visibleTo(id, rec.Watchers, c.userID) {
		return Record{}, ErrNotFound
	}
	return rec, nil
}

// Cancel cancels the task id on behalf of auth. It first claims CANCELLED
// in the store, fenced on the run it read, and only then cancels the
// run's context with ErrCancelled, so the record says "Cancelled by user"
// whatever the callback does next. A caller who may not see the task gets
// ErrNotFound, exactly as for a missing task. A task that already ended
// returns ErrFinished. Errors: ErrInvalidOption for a nil ctx,
// ErrNoAuthority, a *ValidationError (ErrInvalidKey), ErrNotFound, ErrFinished, ErrConflict (wrapped) when
// the record kept changing, ctx's error when it ends while Cancel waits
// for a submission of the task to register (as Submit's, its cause
// wrapped too), or a store error. When the store reports an
// error for the cancel's write, Cancel reads the record: if the write
// landed all the same, it returns nil; if it did not, the store error,
// and nothing was cancelled. If the read fails too, it returns the store
// error, and a run that this runtime executes is cancelled all the same:
// its own writes are fenced on its run id, so its record ends CANCELLED
// whether or not the cancel's write landed, saying who cancelled it and
// why either way.
//
// The record keeps who cancelled (the Owner's user id; empty for System)
// and, with WithReason, why, and every Snapshot shows both, so an owner
// sees that a watcher cancelled, and why.
// A task waiting for a slot under Config.Limits is cancelled the same
// way; it never starts, and its owner's waiting place frees at once.
//
// A task whose record is gone (deleted behind the runtime's back, or
// missing after a failover to a replica that never had it) returns
// ErrNotFound, and no record is written. A run of it that this runtime
// holds, and that auth may see (System, the owner, or a watcher the run
// knows of), is checked against the store at once, as the sync loop's
// next pass would (see Config.SyncInterval): its context is cancelled
// with ErrDeleted, its outcome is dropped, and Wait and Watch on it
// end with ErrNotFound, Subscribe yields Gone. A run waiting for its
// turn (a queue, Config.Limits) is ended likewise, with the same cause,
// and never starts; under Limits it gives its owner's waiting place back
// at once.
//
// For a run executing in another process that shares the store, the
// record says CANCELLED at once; that process learns of it from the
// store's notice (over a Notifier) or its sync loop (see
// Config.SyncInterval) and cancels the run's context, and without either
// the callback runs on until it returns. Either way its terminal write is
// discarded, since it expects the record RUNNING. The CANCELLED record
// keeps the attempt and progress this call read: a retry that process
// began between the read and the write is not counted in it. A task of
// another process that has not started yet (waiting for its queue's turn
// or, under Config.Limits, for a slot) learns of the cancel from a
// notice; over a store without notices, only when its turn comes and its
// start finds the record CANCELLED: until then it keeps its owner's
// waiting place there.
func (rt *Runtime[S]) Cancel(ctx context.Context, id string, auth TaskAuthority, opts ...CancelOption) error {
	if err := checkContext(ctx); err != nil {
		return err
	}
	var co cancelOptions
	for _, opt := range opts {
		if opt != nil {
			opt(&co)
		}
	}
	var by string // "" for System, as State.CancelledBy says
	if c, err := resolve(auth); err == nil && !c.system {
		by = c.userID
	}
	var runID string
	for range registerAttempts {
		rec, err := rt.visibleRecord(ctx, id, auth)
		if errors.Is(err, ErrNotFound) {
			rt.checkGone(ctx, id, auth)
			return err
		}
		if err != nil {
			return err
		}
		if rec.Status.Terminal() || (runID != "" && rec.RunID != runID) {
			return ErrFinished // it ended, or was re-run, since the first read
		}
		runID = rec.RunID
		t, err := rt.liveHandle(ctx, id, rec.RunID)
		if err != nil {
			return err
		}
		st := endOfStored(&rec, causeOutcome(ErrCancelled), now())
		if t != nil {
			st.Progress, st.Attempt = t.Progress(), max(st.Attempt, t.Attempt())
		}
		st.CancelledBy, st.CancelReason = by, co.reason
		// Fenced on the exact status read, so a start that landed since
		// the read is never overwritten with the older state. A retry of
		// another runtime's run (RUNNING to RUNNING) that lands between
		// the read and the write is not seen: the record keeps the
		// attempt and progress read.
		if done, err := rt.claimCancel(ctx, t, id, &rec, &st, cancelNote{by, co.reason}); done {
			return err
		}
	}
	return fmt.Errorf("%w: task %q kept changing during cancel", ErrConflict, id)
}

// checkGone follows a Cancel of id on behalf of auth that found no
// record it may see: the runs of id live here that auth may see (System,
// the owner, or a watcher the run knows of) are checked against the
// store at once, as a notice naming id has them checked, so that a run
// whose record is gone (deleted, or missing after a failover) is
// cancelled now (ErrDeleted), rather than at the sync loop's next
// pass. The check is the sync loop's, and reads the record again: a run
// whose record is still its own and live is left alone, and a run whose
// own end is being written or has landed keeps it.
func (rt *Runtime[S]) checkGone(ctx context.Context, id string, auth TaskAuthority) {
	c, err := resolve(auth)
	if err != nil {
		return
	}
	for _, t := range rt.runs.ofID(id) {
		if t.visibleTo(c) {
			rt.checkRun(ctx, t, true)
		}
	}
}

// claimCancel writes st, the CANCELLED state of rec's run, fenced on
// rec's status, and reports whether Cancel is done, with its error. While
// it does, run t (live in this runtime unless nil) is marked
// runCancelling: a Watch that finds the run's record moved on (a re-run
// here, once the write landed) waits for the end this cancel reports,
// rather than end without it.
func (rt *Runtime[S]) claimCancel(ctx context.Context, t *Task, id string, rec *Record, st *State, n cancelNote) (done bool, err error) {
	if t != nil {
		rt.holdCancelling(t)
		defer func() { rt.dropCancelling(t, id, done && err == nil) }()
	}
	ok, err := rt.store.TransitionTask(ctx, id, rec.RunID, []Status{rec.Status}, *st)
	if err != nil {
		if permanentStoreError(err) {
			return true, err
		}
		// The write may have landed all the same (a lost
		// acknowledgement): if the record holds it, it did.
		landed, known := rt.holds(ctx, id, rec.RunID, st)
		if !landed {
			if !known {
				// Perhaps it did: a run of this runtime is
				// cancelled all the same, lest it run on under a
				// CANCELLED record that no later Cancel reaches.
				// Its own writes are fenced on its run id; the
				// end it writes, if this write did not land, says
				// who cancelled it and why, as this one would
				// have.
				rt.noteCancel(t, n)
				rt.cancelRun(t)
			}
			return true, err
		}
		ok = true
	}
	if !ok {
		return false, nil
	}
	rt.cancelRun(t)
	rt.reportEnd(t, change{kind: changeFinished, id: id, runID: rec.RunID, queue: rec.Queue, task: t, created: rec.CreatedAt, state: *st})
	return true, nil
}

// holdCancelling marks run t runCancelling while a writer of its end
// other than the run (a Cancel, a recovery pass) writes and reports it.
func (rt *Runtime[S]) holdCancelling(t *Task) {
	rt.cancellingMu.Lock()
	if rt.cancelling == nil {
		rt.cancelling = make(map[*Task]int)
	}
	rt.cancelling[t]++
	t.mark(runCancelling)
	rt.cancellingMu.Unlock()
}

// dropCancelling undoes holdCancelling once the writer is done, reported
// saying whether it reported the run's end. Another writer may be under
// way: the last one clears the flag.
func (rt *Runtime[S]) dropCancelling(t *Task, id string, reported bool) {
	rt.cancellingMu.Lock()
	if rt.cancelling[t]--; rt.cancelling[t] == 0 {
		delete(rt.cancelling, t)
		t.flags.And(^runCancelling)
	}
	rt.cancellingMu.Unlock()
	if !reported && rt.hub.n.Load() > 0 {
		rt.hub.reread(id, t.watcherList()) // a Watch waiting for this report looks again
	}
}

// liveHandle returns the handle of run runID of id if the run is live in
// this runtime, as handle does, and waits out a registration of this
// runtime between its insert and the publishing of its handle, which
// share the task's lock: once the lock is free, the handle is out, or the
// run is no longer live here. Cancel takes the handle before its write,
// so that the run's end is reported once through the handle's flags even
// if the run settles meanwhile (see reportEnd).
// The wait ends with ctx, whose cause it returns.
func (rt *Runtime[S]) liveHandle(ctx context.Context, id, runID string) (*Task, error) {
	t := rt.handle(id, runID)
	if t == nil && InstanceOf(runID) == rt.instance {
		h, err := rt.keys.lock(ctx, id)
		if err != nil {
			return nil, err
		}
		t = rt.handle(id, runID)
		h.unlock()
	}
	return t, nil
}

// noteCancel keeps n, who cancelled run t (live in this runtime unless
// nil) and why, for the run's own write of its end, unless a Cancel kept
// one first. The note is kept before the flag is set, and the flag before
// the run is cancelled, so the end the cancel brings finds it; a run that
// settled meanwhile, whose settle may have looked for the flag before it
// was set, has its note dropped here.
func (rt *Runtime[S]) noteCancel(t *Task, n cancelNote) {
	if t == nil {
		return
	}
	rt.cancels.LoadOrStore(t, n)
	t.mark(runCancelNoted)
	if t.isSettled() {
		rt.cancels.Delete(t)
	}
}

// cancelRun cancels run t, live in this runtime unless nil, with
// ErrCancelled. A run waiting for admission is settled at once.
func (rt *Runtime[S]) cancelRun(t *Task) {
	if t != nil {
		t.cancel(ErrCancelled)
		rt.endWaiting(t)
	}
}

// endWaiting follows the cancel of run t, which may be waiting for its
// turn. Under Limits, its owner's waiting place is given back at once,
// and a run waiting for a slot is taken out and ended now, on a
// goroutine of its own. A queue item waits in its queue, which drops it
// with the other items cancelled meanwhile once they are many (see
// queue.dropCancelled), and ends them; or its turn comes first.
func (rt *Runtime[S]) endWaiting(t *Task) {
	if t.adm != nil && rt.adm.cancelWaiting(t.adm) {
		go rt.execute(t) // it never starts: this settles it
		return
	}
	if t.opts.queue == "" {
		return
	}
	rt.mu.RLock()
	q := rt.queues[t.opts.queue]
	rt.mu.RUnlock()
	if q != nil {
		rt.endNow(q.dropCancelled())
	}
}

// holds reports whether the record id is run runID's with exactly the
// terminal state st: whether a write of st that reported an error landed.
// known is false when the record could not be read to tell.
func (rt *Runtime[S]) holds(ctx context.Context, id, runID string, st *State) (landed, known bool) {
	rec, err := rt.store.GetTask(ctx, id)
	if err != nil {
		return false, errors.Is(err, ErrNotFound)
	}
	return wrote(&rec, runID, st), true
}
