package workers

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// DefaultQueue is the queue name the async path (Runtime.Submit) passes to
// the queue authorizer. An allowlist authorizer must permit it, or Submit
// is closed to everyone.
const DefaultQueue = "default"

// registerAttempts bounds how often a submission retries after another
// process changed the record between its read and its write.
const registerAttempts = 8

// Config configures a Runtime. The zero value is valid.
type Config struct {
	// Queues names the sequential queues whose processors Start starts.
	// Other queues start on their first submission. Defaults to none.
	Queues []string

	// RecoverZombies makes Start call RecoverZombies before anything
	// runs. Defaults to false.
	RecoverZombies bool

	// CleanupInterval is how often the cleanup scheduler, started by
	// Start, deletes terminal records older than Retention. Zero disables
	// the scheduler. Defaults to 0.
	CleanupInterval time.Duration

	// Retention is how long the scheduler keeps terminal records.
	// Defaults to 24 hours.
	Retention time.Duration

	// SyncInterval, when positive, makes Start run a loop that syncs this
	// runtime's running tasks with the store at that interval, for
	// processes that share it: it stores a run's live progress whenever
	// it changed, so other processes see it, and it cancels a run whose
	// record says another process ended it: with ErrCancelled when it was
	// cancelled there, ErrAbandoned when it was recovered as a zombie,
	// ErrSuperseded when the record was replaced or deleted. Each progress
	// write is fenced on the run and its RUNNING status; a run with no
	// progress to store costs one read per interval. Zero (the default)
	// runs no loop: progress is stored with a run's transitions only, and
	// a cancel from another process reaches the record but not the
	// callback. Only runs that have started are checked: a queued item
	// whose record another process ended waits to be skipped by its
	// processor.
	SyncInterval time.Duration

	// Logger receives errors that have no caller to return to: a store
	// write on a run's behalf that failed (which leaves the record for
	// zombie recovery), a cleanup that failed. Defaults to slog.Default().
	Logger *slog.Logger
}

// Runtime is what this process is doing now: the run handles, the
// sequential queues and their processors, and the cleanup scheduler,
// over a Store that holds the records. Several runtimes may share one
// store (in one process or several); each has its own queues, handles and
// scheduler, while the store's authorizers are shared.
//
// A Runtime is safe for concurrent use. Construct it with NewRuntime,
// optionally call Start, submit, and end it with Shutdown. A Runtime that
// has shut down cannot be started again: construct a new one over the
// same store.
type Runtime[S Store] struct {
	store     S
	cfg       Config
	runPrefix string
	runSeq    atomic.Uint64

	// submitMu is held for reading by every submission from its closed
	// check to the moment its run is handed to a goroutine or a queue,
	// and for writing by Shutdown to set closed, so that no submission
	// straddles the start of a shutdown.
	submitMu sync.RWMutex
	closed   bool // guarded by submitMu

	keys *keyLocks // the task lock: serializes this process's decisions per id

	mu      sync.RWMutex
	handles map[string]*Task   // guarded by mu: task id -> the run holding its handle
	runs    map[*Task]struct{} // guarded by mu: every registered run not yet settled
	queues  map[string]*queue  // guarded by mu
	started bool               // guarded by mu

	stopLoops context.CancelFunc // set once by Start; stops the background loops
	loopsDone []chan struct{}    // set once by Start: closed as each loop exits
}

// NewRuntime returns a Runtime over store. It starts no goroutine; see
// Start.
func NewRuntime[S Store](store S, cfg Config) *Runtime[S] {
	cfg.Retention = cmp.Or(cfg.Retention, 24*time.Hour)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Runtime[S]{
		store:     store,
		cfg:       cfg,
		runPrefix: uuid.NewString(),
		keys:      newKeyLocks(),
		handles:   make(map[string]*Task),
		runs:      make(map[*Task]struct{}),
		queues:    make(map[string]*queue),
	}
}

// Store returns the store the runtime was built over.
func (rt *Runtime[S]) Store() S { return rt.store }

// Start readies the runtime as its Config says: it recovers zombies
// (Config.RecoverZombies), starts the named queues' processors, the
// cleanup scheduler and the sync loop. Start is optional when none of
// that is wanted. It returns a *ValidationError for a bad queue name in
// Config.Queues, ErrInvalidOption for a negative interval or Retention,
// ErrClosed after Shutdown and ErrStarted if it already ran; a Start that
// failed (a store error during recovery) may be called again.
func (rt *Runtime[S]) Start(ctx context.Context) error {
	for _, q := range rt.cfg.Queues {
		if err := validateText("queue", q, MaxKeyLen, ErrInvalidKey); err != nil {
			return err
		}
	}
	if rt.cfg.CleanupInterval < 0 || rt.cfg.Retention < 0 || rt.cfg.SyncInterval < 0 {
		return fmt.Errorf("%w: negative interval or retention", ErrInvalidOption)
	}
	rt.submitMu.RLock()
	defer rt.submitMu.RUnlock()
	if rt.closed {
		return ErrClosed
	}
	rt.mu.Lock()
	started := rt.started
	rt.started = true
	rt.mu.Unlock()
	if started {
		return ErrStarted
	}
	if rt.cfg.RecoverZombies {
		if _, err := rt.RecoverZombies(ctx); err != nil {
			rt.mu.Lock()
			rt.started = false // a transient store error must not leave Start unretryable
			rt.mu.Unlock()
			return err
		}
	}
	for _, name := range rt.cfg.Queues {
		rt.queue(name)
	}
	loops, stop := context.WithCancel(context.Background())
	rt.stopLoops = stop
	rt.every(loops, rt.cfg.CleanupInterval, func(ctx context.Context) {
		if _, err := rt.Cleanup(ctx, rt.cfg.Retention); err != nil && ctx.Err() == nil {
			rt.cfg.Logger.Error("workers: cleanup failed", "err", err)
		}
	})
	rt.every(loops, rt.cfg.SyncInterval, rt.syncRuns)
	return nil
}

// Submission is what a submit call returns.
type Submission struct {
	// ID is the scoped task id: the handle for Status and Cancel. It is
	// not the key passed in; ScopedTaskKey rebuilds it.
	ID string
	// RunID is the id of the run the submission started or joined.
	RunID string
	// Joined reports that the key was already live and the submission
	// attached to that run instead of starting a new one.
	Joined bool
}

// Submit runs fn on its own goroutine as the task key, on behalf of auth.
// ctx bounds the submission itself and nothing else: the run outlives it.
//
// If the key's task is live and the caller watches it, Submit joins that
// run. If it is live or finished and the caller is not a watcher (only
// possible for a global-scope key), Submit returns an *AuthorizationError
// unless the store's watch authorizer allows it. A finished key is run
// again: a new run replaces the record, its watchers reset to the
// submitter and those granted with WithWatchers, and a predecessor still
// executing is cancelled with ErrSuperseded, its late writes discarded.
//
// The queue authorizer is asked with DefaultQueue. Errors: ErrNoAuthority,
// a *ValidationError (ErrInvalidKey), ErrInvalidOption, an
// *AuthorizationError (ErrUnauthorized), ErrClosed, ErrConflict (wrapped)
// when other processes kept changing the record, or a store error.
//
// Options such as WithWatchers apply to a new run only: a submission that
// joins a live run does not change it.
func (rt *Runtime[S]) Submit(ctx context.Context, key string, fn Func, auth TaskAuthority, opts ...SubmitOption) (Submission, error) {
	return rt.submit(ctx, "", key, fn, auth, opts)
}

// SubmitSequential is Submit on the named sequential queue: the queue's
// one processor runs its tasks one at a time, in submission order.
// Different queues run independently. The queue authorizer is asked with
// the queue's name. Each distinct queue name gets a processor goroutine
// that lives until Shutdown, so do not pass untrusted names without a
// queue authorizer that limits them.
func (rt *Runtime[S]) SubmitSequential(ctx context.Context, queue, key string, fn Func, auth TaskAuthority, opts ...SubmitOption) (Submission, error) {
	if err := validateText("queue", queue, MaxKeyLen, ErrInvalidKey); err != nil {
		return Submission{}, err
	}
	return rt.submit(ctx, queue, key, fn, auth, opts)
}

func (rt *Runtime[S]) submit(ctx context.Context, queue, key string, fn Func, auth TaskAuthority, opts []SubmitOption) (Submission, error) {
	c, err := resolve(auth)
	if err != nil {
		return Submission{}, err
	}
	if fn == nil {
		return Submission{}, fmt.Errorf("%w: nil Func", ErrInvalidOption)
	}
	o, err := applyOptions(opts)
	if err != nil {
		return Submission{}, err
	}
	id, err := scopedID(key, c, o.scope)
	if err != nil {
		return Submission{}, err
	}
	if !c.system && !allowQueue(rt.store, cmp.Or(queue, DefaultQueue), c.userID) {
		return Submission{}, &AuthorizationError{Op: "submit", Queue: cmp.Or(queue, DefaultQueue), UserID: c.userID}
	}

	rt.submitMu.RLock()
	defer rt.submitMu.RUnlock()
	if rt.closed {
		return Submission{}, ErrClosed
	}
	t, sub, err := rt.register(ctx, id, queue, c, o, fn)
	if err != nil || t == nil {
		return sub, err
	}
	if queue == "" {
		go rt.execute(t)
	} else {
		rt.queue(queue).push(t)
	}
	return sub, nil
}

// register decides, under the task's lock, whether the submission
// joins a live run, re-runs a finished key or creates the task. For a new
// run it returns the registered Task, its handle published; for a join it
// returns a nil Task.
func (rt *Runtime[S]) register(ctx context.Context, id, queue string, c caller, o submitOptions, fn Func) (*Task, Submission, error) {
	l := rt.keys.lock(id)
	defer rt.keys.unlock(id, l)
	for range registerAttempts {
		rec, err := rt.store.GetTask(ctx, id)
		if errors.Is(err, ErrNotFound) {
			t, now := rt.newRun(id, queue, c, o, fn)
			err = rt.store.InsertTask(ctx, t.record(now))
			if errors.Is(err, ErrConflict) {
				continue // another process created it first
			}
			if err != nil {
				return nil, Submission{}, err
			}
			rt.publish(t)
			rt.emit(&change{kind: changeSubmitted, id: id, runID: t.runID, queue: queue, task: t, state: State{Status: StatusPending}})
			return t, Submission{ID: id, RunID: t.runID}, nil
		}
		if err != nil {
			return nil, Submission{}, err
		}

		watching := c.system || visibleTo(id, rec.Watchers, c.userID)
		if !watching && !allowWatch(rt.store, id, rec.Watchers, c.userID) {
			return nil, Submission{}, &AuthorizationError{Op: "submit", TaskID: id, UserID: c.userID}
		}

		if !rec.Status.Terminal() {
			if !watching {
				added, err := rt.store.AddWatcher(ctx, id, rec.RunID, c.userID)
				if errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound) {
					continue // the record moved on; decide again
				}
				if err != nil {
					return nil, Submission{}, err
				}
				if added {
					rt.noteWatcher(id, rec.RunID, append(rec.Watchers, c.userID))
				}
			}
			rt.emit(&change{kind: changeJoined, id: id, runID: rec.RunID, queue: rec.Queue, task: rt.handle(id, rec.RunID), state: rec.State})
			return nil, Submission{ID: id, RunID: rec.RunID, Joined: true}, nil
		}

		t, now := rt.newRun(id, queue, c, o, fn)
		err = rt.store.ReplaceTask(ctx, t.record(now), rec.RunID)
		if errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound) {
			continue // another process re-ran or deleted it first
		}
		if err != nil {
			return nil, Submission{}, err
		}
		rt.publish(t)
		rt.emit(&change{kind: changeSubmitted, id: id, runID: t.runID, queue: queue, task: t, state: State{Status: StatusPending}})
		return t, Submission{ID: id, RunID: t.runID}, nil
	}
	return nil, Submission{}, fmt.Errorf("%w: task %q kept changing during submission", ErrConflict, id)
}

// newRun builds the live object of a run and mints its run id.
func (rt *Runtime[S]) newRun(id, queue string, c caller, o submitOptions, fn Func) (*Task, time.Time) {
	ctx, cancel := context.WithCancelCause(context.Background())
	t := &Task{
		id:     id,
		runID:  rt.runPrefix + "." + strconv.FormatUint(rt.runSeq.Add(1), 36),
		queue:  queue,
		opts:   o,
		fn:     fn,
		ctx:    ctx,
		cancel: cancel,
		done:   make(chan struct{}),
	}
	w := make([]string, 0, 1+len(o.watchers))
	if !c.system {
		w = append(w, c.userID)
	}
	for _, g := range o.watchers {
		if g != c.userID {
			w = append(w, g)
		}
	}
	t.initial = w
	t.watchers.Store(&t.initial)
	return t, now()
}

// record is the new record a run is registered with.
func (t *Task) record(created time.Time) Record {
	return Record{
		ID:        t.id,
		RunID:     t.runID,
		Queue:     t.queue,
		Watchers:  *t.watchers.Load(),
		CreatedAt: created,
		State:     State{Status: StatusPending},
	}
}

// publish makes t the holder of its id's handle. A run of the same id
// still executing here is a predecessor whose record was replaced: it is
// cancelled as superseded (a no-op if it already has a cause).
func (rt *Runtime[S]) publish(t *Task) {
	rt.mu.Lock()
	old := rt.handles[t.id]
	rt.handles[t.id] = t
	rt.runs[t] = struct{}{}
	rt.mu.Unlock()
	if old != nil {
		old.cancel(ErrSuperseded)
	}
}

// noteWatcher updates the live copy of a run's watchers after a join.
func (rt *Runtime[S]) noteWatcher(id, runID string, watchers []string) {
	rt.mu.RLock()
	t := rt.handles[id]
	rt.mu.RUnlock()
	if t != nil && t.runID == runID {
		t.setWatchers(watchers)
	}
}

// handle returns the run holding id's handle if it is the run runID.
func (rt *Runtime[S]) handle(id, runID string) *Task {
	rt.mu.RLock()
	t := rt.handles[id]
	rt.mu.RUnlock()
	if t != nil && t.runID == runID {
		return t
	}
	return nil
}

// settle ends a run's life in the runtime. Only the run that holds the
// handle removes it: a successor's handle is never touched.
func (rt *Runtime[S]) settle(t *Task) {
	rt.mu.Lock()
	if rt.handles[t.id] == t {
		delete(rt.handles, t.id)
	}
	delete(rt.runs, t)
	rt.mu.Unlock()
	close(t.done)
}

// execute runs t from its start to its terminal record and settles it.
func (rt *Runtime[S]) execute(t *Task) {
	st := State{Status: StatusRunning, StartedAt: now(), Attempt: 1}
	switch {
	case t.ctx.Err() != nil:
		// Cancelled before it started (a shutdown, a supersede): record
		// the cause, if the record is still this run's and PENDING.
		rt.finishCancelled(t, StatusPending, &State{})
	case !rt.write("start", t, StatusPending, &st):
		// A run-start is a durable, fenced read: the store no longer says
		// this run is PENDING, so it was cancelled or superseded.
	default:
		if rt.attempts(t, &st) {
			return // timed out: the callback's goroutine settles the run
		}
	}
	rt.settle(t)
}

// attempts runs the callback until it succeeds, fails for good or is
// cancelled, and records the outcome. It reports whether an attempt timed
// out and handed settling to the callback's goroutine.
func (rt *Runtime[S]) attempts(t *Task, st *State) (handedOff bool) {
	for attempt := 1; ; attempt++ {
		t.attempt.Store(int32(attempt))
		if attempt > 1 {
			st.Attempt, st.Progress = attempt, t.Progress()
			if !rt.write("retry", t, StatusRunning, st) {
				return false // the record moved on without this run
			}
		}
		res, err, handedOff := rt.call(t, st)
		switch {
		case handedOff:
			return true
		case err == nil:
			rt.finishCompleted(t, st, res)
			return false
		case t.ctx.Err() != nil:
			rt.finishCancelled(t, StatusRunning, st)
			return false
		case attempt >= t.opts.retry.MaxAttempts:
			rt.finish(t, StatusRunning, st, StatusFailed, errorText(err))
			return false
		case !sleep(t.ctx, t.opts.retry.backoff(attempt)):
			rt.finishCancelled(t, StatusRunning, st)
			return false
		}
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
		res, err = invoke(t)
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
		r, e := invoke(t)
		out <- outcome{r, e}
		if !claim.CompareAndSwap(0, 1) && left.Add(-1) == 0 {
			rt.settle(t)
		}
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
	rt.finishCancelled(t, StatusRunning, st)
	if left.Add(-1) == 0 {
		rt.settle(t)
	}
	return nil, nil, true
}

// invoke calls the callback, turning a panic into a *PanicError.
func invoke(t *Task) (res any, err error) {
	defer func() {
		if r := recover(); r != nil {
			res, err = nil, &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return t.fn(t.ctx, t)
}

// encodeResult marshals a callback's result. A panicking MarshalJSON is
// the callback's code, so it fails the run, not the process.
func encodeResult(res any) (b []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			b, err = nil, &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return json.Marshal(res)
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
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (rt *Runtime[S]) finishCompleted(t *Task, st *State, res any) {
	if res == nil {
		rt.finish(t, StatusRunning, st, StatusCompleted, "")
		return
	}
	b, err := encodeResult(res)
	if err != nil {
		rt.finish(t, StatusRunning, st, StatusFailed, fmt.Errorf("%w: %w", ErrResultEncoding, err).Error())
		return
	}
	st.Result = b
	rt.finish(t, StatusRunning, st, StatusCompleted, "")
}

// finishCancelled records the outcome of the cause t's context carries,
// rendered through the reasons table.
func (rt *Runtime[S]) finishCancelled(t *Task, from Status, st *State) {
	status, msg := causeOutcome(context.Cause(t.ctx))
	rt.finish(t, from, st, status, msg)
}

// finish writes a run's terminal record.
func (rt *Runtime[S]) finish(t *Task, from Status, st *State, status Status, msg string) {
	st.Status, st.Error, st.CompletedAt = status, msg, now()
	st.Progress = t.Progress()
	rt.write("finish", t, from, st)
}

// write is every store write a run makes: a transition fenced on the
// run's id and the status it expects. A failed fence is the expected fate
// of a superseded or cancelled run's late write, not an error; a store
// error is logged, since a run has no caller to return it to.
func (rt *Runtime[S]) write(op string, t *Task, from Status, st *State) bool {
	t.stateMu.Lock()
	ok := rt.writeLocked(op, t, from, st)
	t.stateMu.Unlock()
	if ok {
		rt.emit(&change{kind: opChange[op], id: t.id, runID: t.runID, queue: t.queue, task: t, state: *st})
	}
	return ok
}

// opChange is the change each run write reports once it lands.
var opChange = map[string]changeKind{
	"start":    changeStarted,
	"retry":    changeRetrying,
	"finish":   changeFinished,
	"abandon":  changeFinished,
	"progress": changeProgress,
}

// writeLocked is write with t.stateMu held.
func (rt *Runtime[S]) writeLocked(op string, t *Task, from Status, st *State) bool {
	ok, err := rt.store.TransitionTask(context.Background(), t.id, t.runID, statusSet(from), *st)
	if err != nil && !errors.Is(err, ErrNotFound) {
		rt.logRunError("workers: store write failed", op, t, err)
	}
	if ok {
		t.state = *st
	}
	return ok
}

// logRunError logs a store error met on a run's behalf. It is kept out of
// line so that the run's own frames stay small: a run's goroutine starts
// with a small stack, and growing it costs a copy.
//
//go:noinline
func (rt *Runtime[S]) logRunError(msg, op string, t *Task, err error) {
	rt.cfg.Logger.Error(msg, "op", op, "task", t.id, "run", t.runID, "err", err)
}

// syncRuns is the sync loop's work (see Config.SyncInterval). A progress
// write is built from the state the run last wrote, under the run's state
// lock, so it never undoes a newer write of the run's own (a retry's
// attempt number, say); a run is cancelled only while it still holds that
// its last write left it RUNNING, so a run that has just finished is left
// alone.
func (rt *Runtime[S]) syncRuns(ctx context.Context) {
	rt.mu.RLock()
	runs := slices.Collect(maps.Keys(rt.runs))
	rt.mu.RUnlock()
	for _, t := range runs {
		if t.ctx.Err() != nil {
			continue // ending already: its final write carries its state
		}
		if running, stored := rt.syncProgress(t); !running || stored {
			continue // not started yet, finished, or still this run's and RUNNING
		}
		rec, err := rt.store.GetTask(ctx, t.id)
		var cause error
		switch {
		case errors.Is(err, ErrNotFound):
			cause = ErrSuperseded
		case err != nil:
			if ctx.Err() == nil {
				rt.logRunError("workers: sync read failed", "sync", t, err)
			}
			continue
		case rec.RunID != t.runID:
			cause = ErrSuperseded
		case rec.Status != StatusRunning:
			cause = cmp.Or(causeFromRecord(rec.Status, rec.Error), ErrSuperseded)
		default:
			continue
		}
		t.stateMu.Lock()
		if t.state.Status == StatusRunning {
			t.cancel(cause)
		}
		t.stateMu.Unlock()
	}
}

// waitPoll is how often Wait reads a task that runs in another runtime.
const waitPoll = 50 * time.Millisecond

// Wait blocks until the task id has ended, or ctx ends, and returns its
// final snapshot. A run executing in this runtime is waited on directly;
// a task another runtime or process runs is read from the store every
// 50ms. Errors are those of Status, or ctx.Err().
func (rt *Runtime[S]) Wait(ctx context.Context, id string, auth TaskAuthority) (Snapshot, error) {
	for {
		rec, err := rt.visibleRecord(ctx, id, auth)
		if err != nil {
			return Snapshot{}, err
		}
		if rec.Status.Terminal() {
			return rt.snapshot(&rec), nil
		}
		if t := rt.handle(id, rec.RunID); t != nil {
			select {
			case <-t.done:
			case <-ctx.Done():
				return Snapshot{}, ctx.Err()
			}
			continue
		}
		timer := time.NewTimer(waitPoll)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return Snapshot{}, ctx.Err()
		}
	}
}

// syncProgress stores t's live progress if it changed since the run's
// last write. It builds the write from t.state within one hold of
// t.stateMu, so no write of the run's own can land in between. It reports
// whether the run's last write left it RUNNING, and whether it stored.
func (rt *Runtime[S]) syncProgress(t *Task) (running, stored bool) {
	t.stateMu.Lock()
	defer t.stateMu.Unlock()
	if t.state.Status != StatusRunning {
		return false, false
	}
	p := t.Progress()
	if p == t.state.Progress {
		return true, false
	}
	st := t.state
	st.Progress = p
	return true, rt.writeLocked("progress", t, StatusRunning, &st)
}

// Status returns a snapshot of the task id, if auth may see it: a
// watcher, the owner the id names, or System. For any other caller it
// returns ErrNotFound, exactly as for a task that does not exist, so
// Status never reveals that someone else's task exists. Progress is read
// live when the run executes in this runtime. Errors: ErrNoAuthority, a
// *ValidationError (ErrInvalidKey), ErrNotFound, or a store error.
func (rt *Runtime[S]) Status(ctx context.Context, id string, auth TaskAuthority) (Snapshot, error) {
	rec, err := rt.visibleRecord(ctx, id, auth)
	if err != nil {
		return Snapshot{}, err
	}
	return rt.snapshot(&rec), nil
}

// List returns the tasks auth may see, ordered by creation time: for an
// Owner, the tasks it owns or watches; for System, every task. Options
// narrow the list. Errors: ErrNoAuthority or a store error.
func (rt *Runtime[S]) List(ctx context.Context, auth TaskAuthority, opts ...ListOption) ([]Snapshot, error) {
	c, err := resolve(auth)
	if err != nil {
		return nil, err
	}
	var f Filter
	for _, opt := range opts {
		opt(&f)
	}
	if !c.system {
		f.VisibleTo = c.userID
	}
	recs, err := rt.store.ListTasks(ctx, f)
	if err != nil {
		return nil, err
	}
	out := make([]Snapshot, len(recs))
	for i := range recs {
		out[i] = rt.snapshot(&recs[i])
	}
	return out, nil
}

// snapshot renders a record, with live progress when this runtime runs it.
func (rt *Runtime[S]) snapshot(rec *Record) Snapshot {
	s := snapshotOf(rec)
	if rec.Status == StatusRunning {
		if t := rt.handle(rec.ID, rec.RunID); t != nil {
			s.Progress, s.Attempt = t.Progress(), t.Attempt()
		}
	}
	return s
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
// returns ErrFinished. Errors: ErrNoAuthority, a *ValidationError
// (ErrInvalidKey), ErrNotFound, ErrFinished, ErrConflict (wrapped) when
// the record kept changing, or a store error.
//
// For a run executing in another process that shares the store, the
// record says CANCELLED at once; that process's sync loop (see
// Config.SyncInterval) cancels the run's context within an interval, and
// without it the callback runs on until it returns. Either way its
// terminal write is discarded, since it expects the record RUNNING.
func (rt *Runtime[S]) Cancel(ctx context.Context, id string, auth TaskAuthority) error {
	var runID string
	for range registerAttempts {
		rec, err := rt.visibleRecord(ctx, id, auth)
		if err != nil {
			return err
		}
		if rec.Status.Terminal() || (runID != "" && rec.RunID != runID) {
			return ErrFinished // it ended, or was re-run, since the first read
		}
		runID = rec.RunID
		t := rt.handle(id, rec.RunID)
		st := rec.State
		if t != nil {
			st.Progress, st.Attempt = t.Progress(), max(st.Attempt, t.Attempt())
		}
		st.Status, st.Error = causeOutcome(ErrCancelled)
		st.CompletedAt = now()
		// Fenced on the exact status read, so a start or retry that landed
		// since the read is never overwritten with the older state.
		ok, err := rt.store.TransitionTask(ctx, id, rec.RunID, []Status{rec.Status}, st)
		if err != nil {
			return err
		}
		if ok {
			if t != nil {
				t.cancel(ErrCancelled)
			}
			rt.emit(&change{kind: changeFinished, id: id, runID: rec.RunID, queue: rec.Queue, task: t, state: st})
			return nil
		}
	}
	return fmt.Errorf("%w: task %q kept changing during cancel", ErrConflict, id)
}

// fromPending and fromRunning are the from lists of a run's writes,
// shared so that they do not allocate; stores never retain or modify a
// from list.
var (
	fromPending = []Status{StatusPending}
	fromRunning = []Status{StatusRunning}
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
func now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }
