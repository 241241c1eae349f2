package workers

import (
	"context"
	"time"
)

// changeKind names a change in a task's life that this runtime made or
// saw.
type changeKind uint8

const (
	changeSubmitted changeKind = iota + 1 // a new run was registered (PENDING)
	changeJoined                          // a submission joined a live run
	changeStarted                         // the run's start write landed (RUNNING)
	changeProgress                        // a progress write landed (sync loop)
	changeRetrying                        // an attempt failed and another follows
	changeFinished                        // a terminal write landed, whoever made it
	changeRecovered                       // recovery ended another run as abandoned
	changePanicked                        // an attempt's callback panicked (no write)
)

// eventKinds maps a change to the event observers see; changeProgress has
// none.
var eventKinds = [...]EventKind{
	changeSubmitted: EventSubmitted,
	changeJoined:    EventJoined,
	changeStarted:   EventStarted,
	changeRetrying:  EventRetrying,
	changeFinished:  EventFinished,
	changeRecovered: EventRecovered,
	changePanicked:  EventPanicked,
}

// change is what emit reports: the store write that made it has landed.
type change struct {
	kind    changeKind
	id      string
	runID   string
	queue   string
	task    *Task     // the live run, when this runtime holds it; else nil
	created time.Time // the record's CreatedAt, when task is nil
	state   State     // the state the write stored (identity fields excluded)
	err     error     // the callback's error, for changeRetrying, changeFinished and changePanicked
}

// emit reports c to Wait's listeners and to the configured observers. It
// is called after the store write that made the change has landed, with
// no runtime, task or store lock held, from the goroutine that made the
// write. Without observers it costs the bell's one atomic load.
func (rt *Runtime[S]) emit(c *change) {
	if c.kind != changePanicked {
		rt.bells.ring(c.id)
	}
	if len(rt.cfg.Observers) > 0 && eventKinds[c.kind] != 0 {
		rt.observe(c)
	}
}

// observe builds the event of c and hands it to every observer in turn.
// It is kept out of line so that emit stays cheap to inline.
//
//go:noinline
func (rt *Runtime[S]) observe(c *change) {
	e := Event{
		Kind:        eventKinds[c.kind],
		TaskID:      c.id,
		RunID:       c.runID,
		Queue:       c.queue,
		Status:      c.state.Status,
		Cause:       c.state.Cause,
		Attempt:     c.state.Attempt,
		Err:         c.err,
		CreatedAt:   c.created,
		StartedAt:   c.state.StartedAt,
		CompletedAt: c.state.CompletedAt,
		Task:        c.task,
	}
	ctx := context.Background()
	if t := c.task; t != nil {
		ctx, e.CreatedAt = t.ctx, t.created
		e.Attempt = max(e.Attempt, t.Attempt())
	}
	if c.kind == changePanicked {
		if pe, ok := asPanic(c.err); ok {
			e.Stack = pe.Stack
		}
	}
	if c.kind == changeFinished || c.kind == changeRecovered {
		if !e.StartedAt.IsZero() {
			e.Duration = e.CompletedAt.Sub(e.StartedAt)
		}
	}
	for _, o := range rt.cfg.Observers {
		rt.notify(ctx, o, &e)
	}
}

// notify calls one observer, containing its panic.
func (rt *Runtime[S]) notify(ctx context.Context, o Observer, e *Event) {
	defer func() {
		if r := recover(); r != nil {
			rt.cfg.Logger.Error("workers: observer panicked", "event", e.Kind.String(), "task", e.TaskID, "run", e.RunID, "panic", r)
		}
	}()
	o.Observe(ctx, *e)
}
