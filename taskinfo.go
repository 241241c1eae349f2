package workers

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Func is a task's callback. ctx is cancelled by the runtime, with one of
// ErrCancelled, a *TimeoutError, ErrSuperseded, ErrShutdown,
// ErrAbandoned (its runtime lost its instance lease, or another process
// recovered the run) or ErrDeleted (its record was deleted) as its cause, when the run should stop; a callback
// that watches ctx ends promptly. Once the run has ended, its outcome
// recorded, ctx is cancelled all the same, as a request's is once its
// handler returns: what the callback tied to it (a goroutine, a
// context.AfterFunc, a client's stream) is let go. That end is no cause
// of the run's: context.Cause says the run has ended, and the record
// keeps what it had. t is the live run: report progress through
// t.SetProgress.
//
// The result is stored as JSON (see ResultAs); a result that cannot be
// encoded fails the run. A returned error fails the run, or triggers a
// retry when the task has attempts left; returning an error after ctx was
// cancelled records the cancellation instead. A panic is recovered and
// fails the run with a *PanicError, or triggers a retry while the task
// has attempts left and ctx is live; one after ctx was cancelled fails
// the run all the same (an abandoned run records the abandon, as ever).
// A callback that calls runtime.Goexit (testing's FailNow and Fatal do)
// fails the run for good, with CausePermanent and no retry, and its
// stack is logged.
//
// The goroutine a callback runs on may have run earlier tasks, of other
// owners, and may run later ones: it carries the profiler labels of the
// submission's context (pprof.Do) while the callback runs, and a
// debug.SetPanicOnFault of the callback's ends with the call. A callback
// that locks its goroutine to its thread (runtime.LockOSThread) must
// unlock it before it returns: a thread left locked, with whatever state
// the callback gave it (a namespace, credentials), would run the tasks
// that follow on that goroutine, where a goroutine of its own would have
// ended and taken the thread with it.
type Func func(ctx context.Context, t *Task) (any, error)

// Task is one run of a task: the live object its callback holds. A re-run
// of the same id is a new Task. Its methods are safe for concurrent use.
type Task struct {
	ids  string      // the task id, then the run id (see runIDs)
	opts *runOptions // its queue's, shared, when the submission set none
	fn   Func

	// ctx is this run's own context, whose parent (its runState's vals)
	// carries the submission's context's values and never its
	// cancellation or deadline. An async run's is made with the Task; a
	// queue item's when it starts (begin) or is cancelled, so that items
	// waiting in a queue stay small: until then ctx holds the
	// submission's context itself. ctx is written under mu; the run's
	// own goroutine reads it freely after begin, others through cause.
	ctx context.Context

	// run is what the run holds from its start (see runState): an async
	// run's is set before the Task is shared, a queue item's once, under
	// mu, when it begins or first needs it.
	run atomic.Pointer[runState]

	// watchers is the record's watchers, for QueueStatus and events: nil
	// while they are the ones the run was registered with, which are
	// first (empty) or first[:1], and set by a join, or at registration
	// when there are more than one.
	watchers atomic.Pointer[[]string]
	first    [1]string

	flags atomic.Uint32 // the run* bits below

	// startsRegistered is set for a run registered RUNNING (an async run
	// admitted at once), whose start needs no write of its own.
	startsRegistered bool
	settled          bool   // guarded by mu
	landedCancel     bool   // guarded by mu: a Cancel's end of this run landed after its context ended with errRunEnded
	idLen            uint16 // the task id's length in ids: at most MaxOwnerIDLen + 2 + MaxKeyLen
	shard            uint8  // the index of its id's shard in home (see runSet.shardOf)

	adm *admit // its standing with admission; nil without Config.Limits

	// rec is the record the run was registered with over a MemStore, or
	// nil (over another store, or after a failed insert). The run's own
	// writes go to it without looking it up while the store holds it,
	// and by id once it was taken out (MemStore.transition); other
	// writes, such as a cancellation's, go by id.
	rec *memRecord

	created int64 // when the run was registered, in Unix microseconds (now's precision)

	// home is the runtime's set of runs; pos is the run's place in its
	// shard's ring while its record keeps its handle, over a MemStore
	// (see runRing), guarded by that shard's lock.
	home *runSet
	pos  uint64

	mu sync.Mutex
}

// runState is what a run holds from its start, apart from its Task so
// that a queue item, which may wait long, stays small until then. An
// async run's sits in the allocation of its Task (see asyncTask); a
// queue item's is made when it begins, or earlier if, while it waits, it
// is cancelled, written to, waited for, given progress, or reported to a
// subscriber.
type runState struct {
	vals valuesOnly              // the parent of the run's context
	stop context.CancelCauseFunc // guarded by Task.mu: private to the runtime, see cancel; nil until ctx is made
	done chan struct{}           // guarded by Task.mu: made on first demand, closed once settled

	progress atomic.Int32
	attempt  atomic.Int32

	writeMu sync.Mutex // serializes the run's store writes; taken before Task.mu
	last    lastWrite  // guarded by writeMu

	view atomic.Pointer[Snapshot] // guarded by hub.mu for writes: the snapshot last published
}

// lastWrite is what a run's last write left in its record, as far as
// its later writes and its subscribers read it: whether the run was left
// RUNNING, and then the rest of that state, since a RUNNING state holds
// nothing else. It keeps a run's state small: 40 bytes, where a State
// takes 184.
type lastWrite struct {
	startedAt         time.Time
	progress, attempt int32
	running           bool // false until the first write, and after a terminal one
}

// state returns the RUNNING state the run last wrote; running is set.
func (w *lastWrite) state() State {
	return State{Status: StatusRunning, Progress: int(w.progress), Attempt: int(w.attempt), StartedAt: w.startedAt}
}

// The bits of Task.flags.
const (
	runFinishing uint32 = 1 << iota // set before the run writes its own outcome
	// runEndSeen is set by whoever reports the end of a run that another
	// writer ended (a Cancel here, or a record found ended elsewhere), so
	// the run's finished event is reported once.
	runEndSeen
	runPoked      // queued for the hub's progress pump
	runAnnounced  // the run's submission was reported
	runEndWaiting // an end reported before the submission waits in Runtime.early
	runRetired    // its submission failed: its end reaches Wait and the streams, not the observers
	runWriting    // write is trying the run's own write, which may retry for as long as the store fails
	runEndKept    // the sync loop kept in Runtime.found an end it found while the run wrote
	runShared     // queued for shareProgress: its progress changed
	// runProgressFailing is set when a progress write failed and was
	// logged, until one lands: the failures between are not logged.
	runProgressFailing
	runGoexited // its callback called runtime.Goexit
	runGaveUp   // a write of its gave up, counted in Runtime.gaveUp
	// runCancelNoted is set when Runtime.cancels holds who cancelled the
	// run and why, for its own write of its end.
	runCancelNoted
	// runCancelling is set while a Cancel of this runtime writes the
	// run's end and reports it (see Runtime.claimCancel).
	runCancelling
	// runLiveReporting is set while the run's own goroutine reports a
	// change of its live run to observers (its start, a retry, a panic):
	// an end another writer reports meanwhile waits in Runtime.early,
	// and the run reports it after (see reportLive).
	runLiveReporting
	// runAbandonBegun is set, under Runtime.left's lock, when a queue
	// item's abandon write begins (see Runtime.beginAbandon).
	runAbandonBegun
)

// has reports whether flag is set.
func (t *Task) has(flag uint32) bool { return t.flags.Load()&flag != 0 }

// mark sets flag.
func (t *Task) mark(flag uint32) { t.flags.Or(flag) }

// claim sets flag and reports whether it was clear: true for one caller.
// A flag set already costs a load, not a read-modify-write: SetProgress
// claims its flags at every change.
func (t *Task) claim(flag uint32) bool { return !t.has(flag) && t.flags.Or(flag)&flag == 0 }

// state returns the run's runState, making it if the run has none yet;
// mu is held.
func (t *Task) state() *runState {
	r := t.run.Load()
	if r == nil {
		r = new(runState)
		t.run.Store(r)
	}
	return r
}

// ensureState is state for a caller that does not hold mu: it takes mu
// only to make the state.
func (t *Task) ensureState() *runState {
	if r := t.run.Load(); r != nil {
		return r
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.state()
}

// cancel cancels the run's context with cause, making it first if the
// run has not begun. The first cause sticks.
func (t *Task) cancel(cause error) {
	if cause == nil {
		cause = context.Canceled
	}
	t.mu.Lock()
	r := t.state()
	stop := r.stop
	if stop == nil {
		// Made here, the context is nobody's yet: cancelled under mu, it
		// holds this cause before any other cancel can reach it.
		t.makeContext(r)
		r.stop(cause)
	}
	t.mu.Unlock()
	if stop != nil {
		stop(cause)
	}
}

// makeContext makes the run's context, whose parent is r.vals; mu is
// held, or t is not yet shared.
func (t *Task) makeContext(r *runState) {
	r.vals.parent = t.ctx
	t.ctx, r.stop = context.WithCancelCause(&r.vals)
}

// cause returns the cause the run was cancelled with, or nil while it
// has not been.
func (t *Task) cause() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r := t.run.Load(); r == nil || r.stop == nil || t.ctx.Err() == nil {
		return nil
	}
	if c := context.Cause(t.ctx); c != errRunEnded {
		return c
	}
	if t.landedCancel {
		return ErrCancelled
	}
	return nil
}

// cancelLanded cancels the run with ErrCancelled for a Cancel whose end
// of this run is known to be in its record: should the run have settled
// first, its context ended with errRunEnded, CancelCause reports the
// Cancel all the same.
func (t *Task) cancelLanded() {
	t.cancel(ErrCancelled)
	t.mu.Lock()
	if r := t.run.Load(); r != nil && r.stop != nil && context.Cause(t.ctx) == errRunEnded {
		t.landedCancel = true
	}
	t.mu.Unlock()
}

// valuesContext returns a context with the submission's values and
// none of its cancellation or the run's, for the run's observers.
func (t *Task) valuesContext() context.Context {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r := t.run.Load(); r != nil && r.stop != nil {
		return &r.vals
	}
	return &valuesOnly{t.ctx}
}

// begin makes the run's state, unless something made it first, and its
// context, unless a cancel made it first.
func (t *Task) begin() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r := t.state(); r.stop == nil {
		t.makeContext(r)
	}
}

// begun reports whether the run's context was made: it began (an async
// run begins with it), or was cancelled before its turn.
func (t *Task) begun() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.run.Load()
	return r != nil && r.stop != nil
}

// setState records what st, the state the run last wrote, left (see
// lastWrite); its writeMu is held.
func (t *Task) setState(st *State) {
	w := &t.run.Load().last
	if st.Status != StatusRunning {
		*w = lastWrite{}
		return
	}
	*w = lastWrite{startedAt: st.StartedAt, progress: int32(st.Progress), attempt: int32(st.Attempt), running: true}
}

// running reports whether the run's last write left it RUNNING; writeMu
// is held.
func (r *runState) running() bool { return r.last.running }

// createdAt returns when the run was registered.
func (t *Task) createdAt() time.Time { return time.UnixMicro(t.created).UTC() }

// asyncTask is an async run's Task with its runState: one allocation
// where a queue item makes its runState when it begins.
type asyncTask struct {
	Task
	runState
}

// runOptions are what a run consults while it executes: its queue, the
// submit options, and the runtime's hub, which SetProgress tells. The
// runs of one queue (or the async path) submitted without options share
// one.
type runOptions struct {
	queue   string // the sequential queue, or "" for the async path
	timeout time.Duration
	retry   RetryPolicy
	hub     *hub
}

// doneChan returns a channel closed once the run has settled. Most runs
// are never waited for, so the channel is made on the first demand.
func (t *Task) doneChan() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.settled {
		return closedChan // a queue's processor asks after nearly every run
	}
	r := t.state()
	if r.done == nil {
		r.done = make(chan struct{})
	}
	return r.done
}

// closedChan is the done channel of every run asked for it once settled.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// isSettled reports whether the run has settled.
func (t *Task) isSettled() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.settled
}

// markSettled closes the run's done channel, if anyone asked for it.
func (t *Task) markSettled() {
	t.mu.Lock()
	t.settled = true
	r := t.run.Load()
	if r != nil && r.done != nil {
		close(r.done)
	}
	var stop context.CancelCauseFunc
	if r != nil {
		stop = r.stop
	}
	t.mu.Unlock()
	if stop != nil {
		// The run is over: its context ends, as a request's does once its
		// handler returns, so that whatever the callback tied to it (a
		// goroutine, a context.AfterFunc, a client stream) is let go. A
		// cause it had stays; this one is never reported as the run's.
		stop(errRunEnded)
	}
}

// errRunEnded is the cause of a run's context that ended because the run
// settled, not because it was cancelled: CancelCause does not report it.
var errRunEnded = fmt.Errorf("workers: the run has ended: %w", context.Canceled)

// valuesOnly is the parent of a run's context: the values of the
// submission's context without its cancellation or deadline, as
// context.WithoutCancel gives, but kept inside the Task instead of
// allocated on its own. Its Done is nil, so the run's cancelable context
// registers nothing with it, and context.Cause finds the run's own
// cancelation first.
type valuesOnly struct{ parent context.Context }

func (valuesOnly) Deadline() (time.Time, bool) { return time.Time{}, false }
func (valuesOnly) Done() <-chan struct{}       { return nil }
func (valuesOnly) Err() error                  { return nil }
func (v *valuesOnly) Value(key any) any        { return v.parent.Value(key) }
func (v *valuesOnly) String() string           { return "workers.runContext" }

// taskID returns the run's task id, which keys it in the runtime's
// idMap of handles.
func (t *Task) taskID() string { return t.ID() }

// ID returns the scoped task id.
func (t *Task) ID() string { return t.ids[:t.idLen] }

// RunID returns this run's id, unique across processes.
func (t *Task) RunID() string { return t.ids[t.idLen:] }

// Queue returns the sequential queue the run belongs to, or "" for the
// async path.
func (t *Task) Queue() string { return t.opts.queue }

// Attempt returns the current attempt number, starting at 1.
func (t *Task) Attempt() int {
	if r := t.run.Load(); r != nil {
		return int(r.attempt.Load())
	}
	return 0
}

// SetProgress records progress on a 0 to 100 scale, clamping values
// outside it. It is the only way to write progress, and it is cheap: the
// value lives on the run and reaches the store with the run's next
// transition, or within one Config.ProgressInterval over a store other
// processes share, while Runtime.Status reads it live. While someone watches (see
// Runtime.Watch), a change also queues the run for the runtime's
// progress pump, at most once until the pump takes it: SetProgress
// never blocks on a subscriber and does not allocate (the pump's queue
// reuses its buffers).
func (t *Task) SetProgress(p int) {
	v := int32(min(max(p, 0), 100))
	if t.ensureState().progress.Swap(v) != v {
		if h := t.opts.hub; h != nil {
			if h.n.Load() > 0 {
				h.poke(t)
			}
			if h.sharing {
				h.share(t)
			}
		}
	}
}

// Progress returns the last value passed to SetProgress, as it kept it:
// clamped to 0–100.
func (t *Task) Progress() int {
	if r := t.run.Load(); r != nil {
		return int(r.progress.Load())
	}
	return 0
}

// CancelCause returns the cause the run's context was cancelled with
// (ErrCancelled, ErrShutdown, a *TimeoutError, ...), as context.Cause of
// the callback's context does, or nil while it has not been. The first
// cause is the one that sticks. The context also ends once the run has
// settled, with a cause of its own that CancelCause does not report; a
// Cancel whose end of the run landed, but reached the run only after it
// had settled, is reported here all the same, though the context's
// cause was set before it. The text a canceller gave (WithReason) is
// in the record: Snapshot.CancelReason.
func (t *Task) CancelCause() error {
	return t.cause()
}

func (t *Task) setWatchers(w []string) { t.watchers.Store(&w) }

// learnWatchers adds to the run's copy of its watchers those of w, the
// watchers of the run's record as a read or a join found them. A run's
// watchers only grow, by joins, some made through other runtimes, so a
// name once known stays: a read that raced a join never takes the copy
// back, and two lists that each miss a join the other has are merged.
// Only membership is read from the copy; its order may differ from the
// record's. It reports whether the copy gained a name.
func (t *Task) learnWatchers(w []string) bool {
	for {
		p := t.watchers.Load()
		known := t.watcherList()
		if p != nil {
			known = *p
		}
		merged := mergeWatchers(known, w)
		if merged == nil {
			return false
		}
		c := new([]string) // allocated here, not on the common path above
		*c = merged
		if t.watchers.CompareAndSwap(p, c) {
			return true
		}
	}
}

// mergeWatchers returns known followed by the names of w it lacks, in a
// new slice, or nil when it lacks none. Neither list names anyone twice,
// as a record's watchers do not. A list known begins with, the common
// case, costs one pass and no allocation.
func mergeWatchers(known, w []string) []string {
	if len(w) <= len(known) && slices.Equal(known[:len(w)], w) {
		return nil
	}
	var have map[string]struct{}
	if len(known) > 16 {
		have = make(map[string]struct{}, len(known))
		for _, u := range known {
			have[u] = struct{}{}
		}
	}
	var merged []string
	for _, u := range w {
		found := false
		if have != nil {
			_, found = have[u]
		} else {
			found = slices.Contains(known, u)
		}
		if found {
			continue
		}
		if merged == nil {
			merged = append(make([]string, 0, len(known)+len(w)), known...)
		}
		merged = append(merged, u)
	}
	return merged
}

// watcherList returns the record's watchers as this run knows them. The
// caller must not modify the slice.
func (t *Task) watcherList() []string {
	if p := t.watchers.Load(); p != nil {
		return *p
	}
	if t.first[0] == "" {
		return nil
	}
	return t.first[:]
}

func (t *Task) visibleTo(c caller) bool {
	return c.system || visibleTo(t.ID(), t.watcherList(), c.userID)
}

// Snapshot is a point-in-time view of a task, as Runtime.Status and
// Runtime.List return it.
type Snapshot struct {
	ID     string // the scoped task id
	RunID  string // the run the record belongs to
	Status Status // the record's status; empty on a Gone snapshot
	// Progress is live for a run executing in this runtime, and the last
	// stored value otherwise. A stream (Watch, Subscribe) shows a run of
	// this runtime's live progress too, lower than before if the callback
	// lowered it (a retry that starts its work over, say); another
	// runtime's run's progress it keeps from going back, since a store
	// read may lag what an earlier notice showed.
	Progress int
	// Attempt is the current attempt, from 1; live like Progress.
	Attempt int
	// Result is the JSON encoding of the callback's result, for a
	// COMPLETED task that returned one. Decode it with ResultAs.
	Result json.RawMessage
	// Error is the recorded message of a FAILED or CANCELLED task; Err
	// turns it into an error.
	Error string
	// Cause is the code of how the task ended; empty while it is live.
	Cause       Cause
	CreatedAt   time.Time // when the run was submitted
	StartedAt   time.Time // zero until the run started
	CompletedAt time.Time // zero until the task ended
	Queue       string    // the sequential queue, or "" for the async path
	// WatcherCount is how many identities are granted the task.
	WatcherCount int
	// CancelledBy is who cancelled the task through Runtime.Cancel: the
	// Owner's user id. It is empty for a cancel by System (Cause is then
	// CauseCancelled) and for every other ending.
	CancelledBy string
	// CancelReason is the reason given with WithReason, if any.
	CancelReason string
	// Stack is the stack of a callback that panicked (Cause is
	// CausePanicked), truncated to MaxStackLen bytes. Only System reads
	// see it: it names the service's code and may hold its data, so an
	// Owner's snapshot leaves it empty.
	Stack string
	// Gone marks the last snapshot a Subscribe stream yields of a run it
	// showed live and can no longer follow to its end. That happens when,
	// before the stream read the run's end, the key was re-run (without
	// the caller among its watchers, in another queue than the stream's
	// WithQueue, by another process, while the stream's consumer fell
	// far behind, or so soon that the new run was reported first: the
	// new run, if the stream may show it, follows), or the record was
	// deleted. Only ID, RunID (the run last shown) and Queue are set, and
	// Status is empty: check Gone before Status, and drop the task from
	// the view. Nothing more of that run
	// follows; a later run the stream may show is yielded as usual.
	// Watch never sets it: it ends with ErrNotFound instead.
	Gone bool
}

// Err returns nil unless the task FAILED or was CANCELLED; then it returns
// a *TaskError carrying the recorded message, which unwraps to the
// cause the record's Cause code names, if any: ErrCancelled, a
// *TimeoutError, ErrSuperseded, ErrShutdown or ErrAbandoned. A run that
// FAILED because its result could not be encoded (its message begins
// with ErrResultEncoding's text) unwraps to ErrResultEncoding.
func (s Snapshot) Err() error {
	if s.Status != StatusFailed && s.Status != StatusCancelled {
		return nil
	}
	cause := causeOf(s.Cause, s.Error)
	if cause == nil && s.Status == StatusFailed && strings.HasPrefix(s.Error, ErrResultEncoding.Error()+":") {
		cause = ErrResultEncoding // a result that could not be encoded: see finishCompleted
	}
	return &TaskError{ID: s.ID, Status: s.Status, Message: s.Error, cause: cause}
}

// fromRecord sets s to the snapshot of r for a reader: the stack of a
// panic is shown to System only.
func (s *Snapshot) fromRecord(r *Record, system bool) {
	*s = Snapshot{
		ID:           r.ID,
		RunID:        r.RunID,
		CreatedAt:    r.CreatedAt,
		Queue:        r.Queue,
		WatcherCount: len(r.Watchers),
	}
	s.setState(&r.State)
	if system {
		s.Stack = r.Stack
	}
}

// setState copies the fields a State holds into s.
func (s *Snapshot) setState(st *State) {
	s.Status = st.Status
	s.Progress = st.Progress
	s.Attempt = st.Attempt
	s.Result = st.Result
	s.Error = st.Error
	s.Cause = st.Cause
	s.StartedAt = st.StartedAt
	s.CompletedAt = st.CompletedAt
	s.CancelledBy = st.CancelledBy
	s.CancelReason = st.CancelReason
}

// ResultAs decodes a task's stored JSON result into a T. Every store
// keeps results as JSON, so a callback that returned a struct yields a
// map when read back as any; ResultAs gives the typed value instead. It
// fails with the task's own error (Snapshot.Err, a *TaskError) when the
// task FAILED or was CANCELLED, and otherwise with an error wrapping
// ErrResultEncoding when the task has no result (it has not finished,
// or its callback returned none) or the result does not decode into T.
func ResultAs[T any](s Snapshot) (T, error) {
	var v T
	if err := s.Err(); err != nil {
		return v, err
	}
	if s.Result == nil {
		if !s.Status.Terminal() {
			return v, fmt.Errorf("%w: task %q has not finished (%s)", ErrResultEncoding, s.ID, s.Status)
		}
		return v, fmt.Errorf("%w: task %q has no result", ErrResultEncoding, s.ID)
	}
	if err := json.Unmarshal(s.Result, &v); err != nil {
		return v, fmt.Errorf("%w: task %q: %w", ErrResultEncoding, s.ID, err)
	}
	return v, nil
}

// QueueState describes what a sequential queue is doing.
type QueueState string

// Queue states.
const (
	QueueIdle       QueueState = "idle"       // nothing running or pending
	QueueQueued     QueueState = "queued"     // items pending, none running
	QueueProcessing QueueState = "processing" // an item is running
)

// QueueInfo is a point-in-time view of a sequential queue, as
// Runtime.QueueStatus returns it.
type QueueInfo struct {
	Name  string     // the queue's name
	State QueueState // idle, queued or processing
	// Running is the id of the task executing now, or "". With a
	// Limits.QueueConcurrency above one it is the earliest started of
	// those the caller may see; it is empty when the caller may see none
	// of them. A task that timed out but
	// whose callback has not returned still counts as running here.
	Running string
	// RunningCount counts every item executing, seen or not.
	RunningCount int
	// Pending lists the waiting task ids the caller may see, in order.
	Pending []string
	// PendingCount counts every waiting item, seen or not.
	PendingCount int
	// Load is PendingCount plus RunningCount.
	Load int
}
