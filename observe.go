package workers

import (
	"context"
	"errors"
	"time"
)

// Middleware wraps a task's callback. Config.Middleware lists the
// middleware every run's callback is wrapped in, once per attempt: the
// first in the list is the outermost, so it sees the call first and its
// result last, as with net/http handler chains. A middleware may read or
// derive the ctx it passes on (to add a trace span, a logger, a deadline),
// call next zero or more times, and change what it returns; a panic in it
// is recovered like one in the callback.
type Middleware func(next Func) Func

// EventKind names a lifecycle event of a run.
type EventKind uint8

// The events an Observer receives.
const (
	// EventSubmitted: a submission registered a new run, with the state
	// it was registered in: RUNNING (attempt 1) for an async run admitted
	// at once, whose registering write is its durable start; PENDING for
	// a queue item or a run waiting for admission.
	EventSubmitted EventKind = iota + 1
	// EventJoined: a submission joined a live run instead of starting one.
	EventJoined
	// EventStarted: the run is about to call its callback for the first
	// time, its start recorded (RUNNING, attempt 1).
	EventStarted
	// EventRetrying: an attempt failed and the next one is recorded;
	// Attempt is the attempt about to run and Err the previous one's
	// error.
	EventRetrying
	// EventFinished: the run's terminal record landed, whoever wrote it
	// (the run, Runtime.Cancel, Shutdown); Status, Cause and Duration say
	// how it ended. A run of this runtime whose record moved on to
	// another run (a re-run elsewhere) before any end of its own landed
	// finishes CANCELLED with CauseSuperseded, and one whose record was
	// deleted, CANCELLED with CauseDeleted, no record saying otherwise;
	// only this runtime's observers hear of that end.
	EventFinished
	// EventPanicked: an attempt's callback panicked; Err is the
	// *PanicError and Stack its stack. A Finished or Retrying event
	// follows.
	EventPanicked
	// EventRecovered: this runtime's recovery ended a run that was no
	// longer alive (another process's, or one left by a crash) as
	// abandoned. Task is the run when this runtime still executes it (a
	// run it abandoned when its lease was lost, whose callback ignores
	// its cancel), and nil otherwise.
	EventRecovered
)

var eventNames = [...]string{
	EventSubmitted: "submitted",
	EventJoined:    "joined",
	EventStarted:   "started",
	EventRetrying:  "retrying",
	EventFinished:  "finished",
	EventPanicked:  "panicked",
	EventRecovered: "recovered",
}

// String returns the event's lower-case name, such as "finished".
func (k EventKind) String() string {
	if int(k) < len(eventNames) && eventNames[k] != "" {
		return eventNames[k]
	}
	return "unknown"
}

// Event is what an Observer receives. Fields that do not apply to its
// Kind are zero.
type Event struct {
	Kind   EventKind // what happened
	TaskID string    // the scoped task id
	RunID  string    // the run the event is about
	Queue  string    // the sequential queue, or "" for the async path

	Status  Status // the status the record was left in
	Cause   Cause  // how the run ended, for Finished and Recovered
	Attempt int    // the attempt, from 1; 0 before the run started
	Err     error  // the callback's error, when there is one

	// Stack is the panicking goroutine's stack, for EventPanicked; it is
	// not truncated.
	Stack []byte

	CreatedAt   time.Time // when the run was submitted
	StartedAt   time.Time // when the run started; zero before
	CompletedAt time.Time // when the run ended, for Finished and Recovered

	// Duration is CompletedAt minus StartedAt for a run that started and
	// ended (Finished, Recovered); zero otherwise. The time a run waited
	// before it started is StartedAt minus CreatedAt.
	Duration time.Duration

	// Task is the live run when this runtime executes it, nil otherwise
	// (a join of another process's run, a recovery of a run not executing
	// here). Observers may read it; it is the same object the callback
	// holds.
	Task *Task
}

// Observer receives the lifecycle events of every run a Runtime submits,
// runs, cancels or recovers (see Config.Observers).
//
// Observe is called synchronously, after the store write the event
// reports has landed, on the goroutine that made it, with no runtime,
// task or store lock held: an observer may call the Runtime, even about
// the same task, but must not wait there for what the event's maker
// does next (a Wait for the task's end, from the event of its
// submission or start, waits for good: that run goes on only once its
// observers return). ctx carries the submission's values (a trace span,
// say) when this runtime holds the run, and is context.Background
// otherwise; it is never cancelled, not even with the run (the event's
// Cause says how a run ended), so an observer may do its own I/O under
// it, bounded as it sees fit.
//
// Each observer hears of the submission of a run this runtime registered
// before it hears of the run's end, whoever ends it: a Cancel that lands
// before the submission is reported (from an earlier observer of it,
// say) is reported after it, on the submitting goroutine, and that Cancel
// may return before observers hear of its end. So may a Cancel whose end
// the run found first, its own write fenced out by it: the run's
// goroutine reports that end. A submission that fails
// after its record may have been written is not reported; nor is the end
// of the record it may have left, which the runtime writes, though Wait,
// Watch and Subscribe see it.
//
// A slow observer slows only what made the event: the run it observes
// (its goroutine, or its sequential queue's processor, which then starts
// the next item later), or the Submit or Cancel call that made it. It
// never blocks another task's run or a store lock. A panicking observer
// is recovered and logged with Config.Logger; the run carries on, and the
// next observers are still called. An observer must not end its goroutine
// with runtime.Goexit (testing's FailNow and Fatal do, as a require.* of
// a test that fails, which the testing package allows on the test's own
// goroutine alone): the goroutine is the run's, or its submitter's, or
// its canceller's, and the run it was reporting is then left unsettled,
// holding its place under Config.Limits and its queue's turn. A run's
// start, retry or panic is never reported to observers after its end.
type Observer interface {
	// Observe receives one event; see above for when it is called.
	Observe(ctx context.Context, e Event)
}

// ObserverFunc adapts a function to the Observer interface.
type ObserverFunc func(ctx context.Context, e Event)

// Observe calls f(ctx, e).
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

// asPanic reports whether err is, or wraps, a *PanicError. A nil err
// costs nothing, so the run's success path does not allocate for it.
func asPanic(err error) (*PanicError, bool) {
	if err == nil {
		return nil, false
	}
	if pe, ok := err.(*PanicError); ok {
		return pe, true
	}
	var pe *PanicError
	ok := errors.As(err, &pe)
	return pe, ok
}

// wrap returns fn wrapped in the middleware, the first outermost.
func wrap(fn Func, mw []Middleware) Func {
	for i := len(mw) - 1; i >= 0; i-- {
		fn = mw[i](fn) // none is nil: see Config.validate
	}
	return fn
}
