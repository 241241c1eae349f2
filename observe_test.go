package workers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recorder is an Observer that keeps every event it sees.
type recorder struct {
	mu     sync.Mutex
	events []Event
}

func (r *recorder) Observe(_ context.Context, e Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// kinds returns the kinds seen for task id, in order.
func (r *recorder) kinds(id string) []EventKind {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []EventKind
	for _, e := range r.events {
		if e.TaskID == id {
			out = append(out, e.Kind)
		}
	}
	return out
}

// last returns the last event of kind k for task id.
func (r *recorder) last(id string, k EventKind) (Event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.events) - 1; i >= 0; i-- {
		if e := r.events[i]; e.TaskID == id && e.Kind == k {
			return e, true
		}
	}
	return Event{}, false
}

// waitKind waits until task id has seen an event of kind k.
func (r *recorder) waitKind(t *testing.T, id string, k EventKind) Event {
	t.Helper()
	var e Event
	eventually(t, func() bool {
		var ok bool
		e, ok = r.last(id, k)
		return ok
	}, "event "+k.String()+" of "+id)
	return e
}

// logBuffer is a concurrency-safe log sink.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func bufferLogger() (*slog.Logger, *logBuffer) {
	b := &logBuffer{}
	return slog.New(slog.NewTextHandler(b, nil)), b
}

func TestObserverSeesACompletedRunInOrder(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	rt := newRuntime(t, NewMemStore(), Config{Observers: []Observer{rec}})
	sub, err := rt.Submit(ctx, "k", returns("ok", nil), alice)
	require.NoError(t, err)
	rec.waitKind(t, sub.ID, EventFinished)
	assert.Equal(t, []EventKind{EventSubmitted, EventStarted, EventFinished}, rec.kinds(sub.ID))

	// An async run admitted at once is registered RUNNING: that write
	// is its start. A queue item is registered PENDING.
	sb, _ := rec.last(sub.ID, EventSubmitted)
	assert.Equal(t, StatusRunning, sb.Status)
	assert.Equal(t, 1, sb.Attempt)
	assert.Equal(t, sub.RunID, sb.RunID)
	assert.False(t, sb.CreatedAt.IsZero())
	seq, err := rt.SubmitSequential(ctx, "q", "k2", returns("ok", nil), alice)
	require.NoError(t, err)
	rec.waitKind(t, seq.ID, EventFinished)
	assert.Equal(t, []EventKind{EventSubmitted, EventStarted, EventFinished}, rec.kinds(seq.ID))
	sb, _ = rec.last(seq.ID, EventSubmitted)
	assert.Equal(t, StatusPending, sb.Status)
	st, _ := rec.last(sub.ID, EventStarted)
	assert.Equal(t, StatusRunning, st.Status)
	assert.Equal(t, 1, st.Attempt)
	assert.False(t, st.StartedAt.Before(st.CreatedAt))
	fin, _ := rec.last(sub.ID, EventFinished)
	assert.Equal(t, StatusCompleted, fin.Status)
	assert.Equal(t, CauseCompleted, fin.Cause)
	assert.Equal(t, fin.CompletedAt.Sub(fin.StartedAt), fin.Duration)
	assert.NotNil(t, fin.Task)
}

func TestObserverSeesRetriesPanicsAndFailure(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	rt := newRuntime(t, NewMemStore(), Config{Observers: []Observer{rec}})
	calls := 0
	fn := func(context.Context, *Task) (any, error) {
		calls++
		if calls == 1 {
			panic("boom")
		}
		return nil, errors.New("still failing")
	}
	sub, err := rt.Submit(ctx, "k", fn, alice, WithRetry(RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Microsecond}))
	require.NoError(t, err)
	rec.waitKind(t, sub.ID, EventFinished)
	assert.Equal(t, []EventKind{EventSubmitted, EventStarted, EventPanicked, EventRetrying, EventFinished}, rec.kinds(sub.ID))

	p, _ := rec.last(sub.ID, EventPanicked)
	var pe *PanicError
	require.ErrorAs(t, p.Err, &pe)
	assert.Equal(t, "boom", pe.Value)
	assert.Contains(t, string(p.Stack), "TestObserverSeesRetriesPanicsAndFailure")
	assert.Equal(t, 1, p.Attempt)
	r, _ := rec.last(sub.ID, EventRetrying)
	assert.Equal(t, 2, r.Attempt)
	assert.ErrorAs(t, r.Err, &pe, "a retry carries the failed attempt's error")
	fin, _ := rec.last(sub.ID, EventFinished)
	assert.Equal(t, StatusFailed, fin.Status)
	assert.Equal(t, CauseFailed, fin.Cause)
	assert.EqualError(t, fin.Err, "still failing")
}

func TestObserverSeesJoinCancelAndRecovery(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	store := NewMemStore()
	rt := newRuntime(t, store, Config{Observers: []Observer{rec}})
	g := newGate()
	sub, err := rt.Submit(ctx, "k", g.fn, alice)
	require.NoError(t, err)
	wait(t, g.started, "start")
	again, err := rt.Submit(ctx, "k", noop, alice)
	require.NoError(t, err)
	require.True(t, again.Joined)
	j := rec.waitKind(t, sub.ID, EventJoined)
	assert.Equal(t, sub.RunID, j.RunID)
	assert.Equal(t, StatusRunning, j.Status)

	require.NoError(t, rt.Cancel(ctx, sub.ID, alice))
	fin := rec.waitKind(t, sub.ID, EventFinished)
	assert.Equal(t, StatusCancelled, fin.Status)
	assert.Equal(t, CauseCancelled, fin.Cause)
	wait(t, g.ran, "the callback to return")
	<-rt.handleDone(t, sub.ID)
	n := 0
	for _, k := range rec.kinds(sub.ID) {
		if k == EventFinished {
			n++
		}
	}
	assert.Equal(t, 1, n, "one finished event per run: the run's own late write is fenced out")

	// A record left by a dead runtime.
	dead := Record{ID: "alice::zombie", RunID: "dead-instance.1", Watchers: []string{"alice"},
		CreatedAt: now(), State: State{Status: StatusRunning, Attempt: 1, StartedAt: now()}}
	require.NoError(t, store.InsertTask(ctx, dead))
	got, err := rt.RecoverZombies(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, got)
	e, ok := rec.last(dead.ID, EventRecovered)
	require.True(t, ok)
	assert.Equal(t, CauseAbandoned, e.Cause)
	assert.Equal(t, StatusFailed, e.Status)
	assert.Nil(t, e.Task)
	assert.True(t, e.CreatedAt.Equal(dead.CreatedAt))
}

// handleDone returns the done channel of the run holding id's handle, or
// a closed channel when none does.
func (rt *Runtime[S]) handleDone(t *testing.T, id string) <-chan struct{} {
	t.Helper()
	tk := rt.runs.get(id)
	if tk == nil {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	return tk.doneChan()
}

func TestObserverRunsWithoutLocks(t *testing.T) {
	t.Parallel()
	var rt *Runtime[*MemStore]
	var mu sync.Mutex
	seen := map[EventKind]bool{}
	first := ""
	obs := ObserverFunc(func(ctx context.Context, e Event) {
		mu.Lock()
		if first == "" {
			first = e.RunID
		}
		probe := e.RunID == first && e.Kind != EventJoined && !seen[e.Kind]
		mu.Unlock()
		if !probe {
			return // the joins and runs these calls make are not probed in turn
		}
		// Each of these takes a lock the runtime holds somewhere: the
		// task's key lock (Submit), the runtime's handle lock and the
		// store's lock (Status, List). Held, they would deadlock.
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, err := rt.Status(context.Background(), e.TaskID, System)
			assert.NoError(t, err, e.Kind.String())
			_, err = rt.List(context.Background(), System)
			assert.NoError(t, err)
			_, err = rt.Submit(context.Background(), "other", noop, alice)
			assert.NoError(t, err)
		}()
		// The same calls on the observer's own goroutine must not
		// deadlock either.
		_, err := rt.Status(context.Background(), e.TaskID, System)
		assert.NoError(t, err)
		_, err = rt.Submit(context.Background(), "k", noop, alice) // joins or re-runs; never blocks
		assert.NoError(t, err)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("%s: a call from another goroutine blocked: a lock is held", e.Kind)
		}
		mu.Lock()
		seen[e.Kind] = true
		mu.Unlock()
	})
	rt = newRuntime(t, NewMemStore(), Config{Observers: []Observer{obs}})
	sub, err := rt.Submit(ctx, "k", returns(nil, errors.New("x")), alice,
		WithRetry(RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Microsecond}))
	require.NoError(t, err)
	eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return seen[EventSubmitted] && seen[EventStarted] && seen[EventRetrying] && seen[EventFinished]
	}, "every event of "+sub.ID)
}

func TestObserverPanicIsContainedAndLogged(t *testing.T) {
	t.Parallel()
	logger, logs := bufferLogger()
	rec := &recorder{}
	bad := ObserverFunc(func(context.Context, Event) { panic("observer exploded") })
	rt := newRuntime(t, NewMemStore(), Config{Logger: logger, Observers: []Observer{bad, rec}})
	sub, err := rt.Submit(ctx, "k", returns("ok", nil), alice)
	require.NoError(t, err)
	snap := settled(t, rt, sub.ID)
	assert.Equal(t, StatusCompleted, snap.Status, "the run carries on")
	rec.waitKind(t, sub.ID, EventFinished)
	assert.Equal(t, []EventKind{EventSubmitted, EventStarted, EventFinished}, rec.kinds(sub.ID), "later observers still see every event")
	assert.Contains(t, logs.String(), "observer panicked")
	assert.Contains(t, logs.String(), "observer exploded")
}

func TestObserverContextCarriesSubmissionValues(t *testing.T) {
	t.Parallel()
	type key struct{}
	got := make(chan any, 8)
	obs := ObserverFunc(func(ctx context.Context, e Event) {
		if e.Kind == EventStarted {
			got <- ctx.Value(key{})
		}
	})
	rt := newRuntime(t, NewMemStore(), Config{Observers: []Observer{obs}})
	_, err := rt.Submit(context.WithValue(ctx, key{}, "request-7"), "k", noop, alice)
	require.NoError(t, err)
	select {
	case v := <-got:
		assert.Equal(t, "request-7", v)
	case <-time.After(10 * time.Second):
		t.Fatal("no started event")
	}
}

func TestMiddlewareOrderFirstIsOutermost(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var trail []string
	note := func(s string) { mu.Lock(); trail = append(trail, s); mu.Unlock() }
	mw := func(name string) Middleware {
		return func(next Func) Func {
			return func(ctx context.Context, tk *Task) (any, error) {
				note(name + " in")
				res, err := next(context.WithValue(ctx, name, true), tk)
				note(name + " out")
				return res, err
			}
		}
	}
	rt := newRuntime(t, NewMemStore(), Config{Middleware: []Middleware{mw("a"), mw("b")}})
	sub, err := rt.Submit(ctx, "k", func(ctx context.Context, _ *Task) (any, error) {
		note(fmt.Sprint("fn ", ctx.Value("a"), ctx.Value("b")))
		return nil, nil
	}, alice)
	require.NoError(t, err)
	settled(t, rt, sub.ID)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"a in", "b in", "fn true true", "b out", "a out"}, trail)
}

func TestMiddlewareWrapsEveryAttemptAndMayChangeTheOutcome(t *testing.T) {
	t.Parallel()
	var calls int
	count := func(next Func) Func {
		return func(ctx context.Context, tk *Task) (any, error) {
			calls++
			res, err := next(ctx, tk)
			if err != nil && tk.Attempt() == 2 {
				return "rescued", nil
			}
			return res, err
		}
	}
	rt := newRuntime(t, NewMemStore(), Config{Middleware: []Middleware{count}})
	sub, err := rt.Submit(ctx, "k", returns(nil, errors.New("x")), alice,
		WithRetry(RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Microsecond}))
	require.NoError(t, err)
	snap := settled(t, rt, sub.ID)
	assert.Equal(t, StatusCompleted, snap.Status)
	assert.Equal(t, 2, calls)
	v, err := ResultAs[string](snap)
	require.NoError(t, err)
	assert.Equal(t, "rescued", v)
}

func TestMiddlewarePanicFailsTheRunNotTheProcess(t *testing.T) {
	t.Parallel()
	logger, _ := bufferLogger()
	bad := func(Func) Func { panic("bad middleware") }
	rt := newRuntime(t, NewMemStore(), Config{Logger: logger, Middleware: []Middleware{bad}})
	sub, err := rt.Submit(ctx, "k", noop, alice)
	require.NoError(t, err)
	snap := settled(t, rt, sub.ID)
	assert.Equal(t, StatusFailed, snap.Status)
	assert.Equal(t, CausePanicked, snap.Cause)
}

func TestPanicStackIsLoggedAndKeptForSystem(t *testing.T) {
	t.Parallel()
	logger, logs := bufferLogger()
	rt := newRuntime(t, NewMemStore(), Config{Logger: logger})
	sub, err := rt.Submit(ctx, "k", func(context.Context, *Task) (any, error) {
		var m map[string]int
		m["x"] = 1 // assignment to entry in nil map
		return nil, nil
	}, alice)
	require.NoError(t, err)
	snap := settled(t, rt, sub.ID)
	assert.Equal(t, CausePanicked, snap.Cause)
	assert.Contains(t, snap.Error, "assignment to entry in nil map")
	assert.Contains(t, snap.Stack, "TestPanicStackIsLoggedAndKeptForSystem", "System sees the stack")

	own, err := rt.Status(ctx, sub.ID, alice)
	require.NoError(t, err)
	assert.Empty(t, own.Stack, "an Owner does not")
	list, err := rt.List(ctx, alice)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Empty(t, list[0].Stack)
	all, err := rt.List(ctx, System)
	require.NoError(t, err)
	assert.Equal(t, snap.Stack, all[0].Stack)

	rec, err := rt.Store().GetTask(ctx, sub.ID)
	require.NoError(t, err)
	assert.Equal(t, snap.Stack, rec.Stack, "the stack is on the record")

	out := logs.String()
	assert.Contains(t, out, "level=ERROR")
	assert.Contains(t, out, "task panicked")
	assert.Contains(t, out, "TestPanicStackIsLoggedAndKeptForSystem", "the log carries the stack")
}

func TestPanicStackIsTruncatedOnTheRecord(t *testing.T) {
	t.Parallel()
	logger, _ := bufferLogger()
	rt := newRuntime(t, NewMemStore(), Config{Logger: logger})
	// Tracebacks elide deep frames, so the long stack is handed over
	// the way invoke hands a real one.
	long := bytes.Repeat([]byte("frame\n"), MaxStackLen)
	sub, err := rt.Submit(ctx, "k", returns(nil, &PanicError{Value: "deep", Stack: long}), alice)
	require.NoError(t, err)
	snap := settled(t, rt, sub.ID)
	assert.Equal(t, MaxStackLen, len(snap.Stack), "a long stack keeps its first MaxStackLen bytes")
}

func TestTruncateTextKeepsRunes(t *testing.T) {
	t.Parallel()
	s := strings.Repeat("é", 10) // 2 bytes each
	assert.Equal(t, strings.Repeat("é", 2), truncateText(s, 5))
	assert.Equal(t, s, truncateText(s, 20))
}

func TestPermanentErrorEndsTheRunAtOnce(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	var calls int
	base := errors.New("card declined")
	sub, err := rt.Submit(ctx, "k", func(context.Context, *Task) (any, error) {
		calls++
		return nil, fmt.Errorf("charge: %w", Permanent(base))
	}, alice, WithRetry(RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Microsecond}))
	require.NoError(t, err)
	snap := settled(t, rt, sub.ID)
	assert.Equal(t, 1, calls, "a permanent error is never retried")
	assert.Equal(t, StatusFailed, snap.Status)
	assert.Equal(t, CausePermanent, snap.Cause)
	assert.Equal(t, 1, snap.Attempt)
	assert.Equal(t, "charge: card declined", snap.Error)
}

func TestPermanentWrapsAndUnwraps(t *testing.T) {
	t.Parallel()
	assert.NoError(t, Permanent(nil))
	base := errors.New("x")
	err := fmt.Errorf("outer: %w", Permanent(base))
	var pe *PermanentError
	require.ErrorAs(t, err, &pe)
	assert.Same(t, base, pe.Err)
	assert.ErrorIs(t, err, base)
	assert.Equal(t, "x", Permanent(base).Error())
}

func TestRetryJitterDefaultsAndNone(t *testing.T) {
	t.Parallel()
	policy := func(p RetryPolicy) RetryPolicy {
		o, err := applyOptions([]SubmitOption{WithRetry(p)})
		require.NoError(t, err)
		return o.retry
	}
	assert.Equal(t, DefaultJitter, policy(RetryPolicy{MaxAttempts: 3}).Jitter)
	assert.Equal(t, 0.0, policy(RetryPolicy{MaxAttempts: 3, Jitter: NoJitter}).Jitter)
	assert.Equal(t, 0.5, policy(RetryPolicy{MaxAttempts: 3, Jitter: 0.5}).Jitter)

	p := policy(RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second})
	spread := false
	for range 200 {
		d := p.backoff(1)
		require.GreaterOrEqual(t, d, 900*time.Millisecond)
		require.LessOrEqual(t, d, 1100*time.Millisecond)
		spread = spread || d != time.Second
	}
	assert.True(t, spread, "the default jitter moves the wait")
	none := policy(RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second, Jitter: NoJitter})
	assert.Equal(t, time.Second, none.backoff(1))
}

// A run ended by another runtime (a cancel there, found by this one's
// sync loop) reports its finished event here once, with the record's
// ending, although its own outcome write is fenced out; a cancel made
// here reports it once too.
func TestObserverSeesARunEndedElsewhereOnce(t *testing.T) {
	t.Parallel()
	s := NewMemStore()
	rec := &recorder{}
	here := newRuntime(t, s, Config{Observers: []Observer{rec}, SyncInterval: 2 * time.Millisecond})
	there := newRuntime(t, s, Config{})
	for _, c := range []struct {
		key   string
		local bool
	}{{"remote", false}, {"local", true}} {
		g := stubbornGate()
		sub, err := here.Submit(ctx, c.key, g.fn, alice)
		require.NoError(t, err)
		wait(t, g.started, "the callback")
		canceller := there
		if c.local {
			canceller = here
		}
		require.NoError(t, canceller.Cancel(ctx, sub.ID, alice))
		e := rec.waitKind(t, sub.ID, EventFinished)
		assert.Equal(t, StatusCancelled, e.Status, c.key)
		assert.Equal(t, CauseCancelled, e.Cause, c.key)
		g.open()
		wait(t, g.ran, "the callback's return")
		settled(t, here, sub.ID)
		require.NoError(t, here.Shutdown(ctx)) // the run's late write is done
		n := 0
		for _, k := range rec.kinds(sub.ID) {
			if k == EventFinished {
				n++
			}
		}
		assert.Equal(t, 1, n, "%s: finished events", c.key)
		here = newRuntime(t, s, Config{Observers: []Observer{rec}, SyncInterval: 2 * time.Millisecond})
	}
}

// A run that writes its own end while the sync loop checks it is
// reported finished once: the loop reports an end only for a run it
// found still running, whose own end will then be fenced out.
func TestObserverSeesOneEndWhenARunEndsDuringASync(t *testing.T) {
	rec := &recorder{}
	rt := newRuntime(t, NewMemStore(), Config{Observers: []Observer{rec}})
	g := newGate()
	sub, err := rt.Submit(ctx, "k", g.fn, alice)
	require.NoError(t, err)
	wait(t, g.started, "the run to start")

	paused, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	rt.hooks.Store(&hooks{syncRead: func() { once.Do(func() { close(paused); <-resume }) }})
	synced := make(chan struct{})
	go func() { defer close(synced); rt.syncRuns(ctx) }()
	wait(t, paused, "the sync to find the run running")
	g.open()
	rec.waitKind(t, sub.ID, EventFinished)
	close(resume)
	wait(t, synced, "the sync to end")
	rt.hooks.Store(nil)
	assert.Equal(t, []EventKind{EventSubmitted, EventStarted, EventFinished}, rec.kinds(sub.ID))
}

// A Cancel that ends a run before its submission was reported (here,
// from an observer of the submission, before the next observer hears of
// it) is reported after the submission to every observer: whoever hears
// of a run hears of its submission first.
func TestObserverHearsOfASubmissionBeforeTheEndOfItsRun(t *testing.T) {
	t.Parallel()
	var rt *Runtime[*MemStore]
	canceller := ObserverFunc(func(ctx context.Context, e Event) {
		if e.Kind == EventSubmitted {
			assert.NoError(t, rt.Cancel(context.Background(), e.TaskID, System))
		}
	})
	rec := &recorder{}
	rt = newRuntime(t, NewMemStore(), Config{Observers: []Observer{canceller, rec}})
	sub, err := rt.Submit(ctx, "k", noop, alice)
	require.NoError(t, err)
	settled(t, rt, sub.ID)
	assert.Equal(t, []EventKind{EventSubmitted, EventFinished}, rec.kinds(sub.ID))
	fin, _ := rec.last(sub.ID, EventFinished)
	assert.Equal(t, CauseCancelled, fin.Cause)
	rt.early.Range(func(k, _ any) bool {
		t.Errorf("an end is still held for %v", k)
		return true
	})
}

// landsThenFails stores a record and reports a transient failure, as a
// write whose acknowledgement was lost does.
type landsThenFails struct{ Store }

func (s landsThenFails) InsertTask(ctx context.Context, rec Record) error {
	if err := s.Store.InsertTask(ctx, rec); err != nil {
		return err
	}
	return errors.New("connection reset")
}

// A submission that failed after its record was written is not reported
// to observers, nor is the end the runtime writes for that record; Wait
// sees the end.
func TestObserverHearsNothingOfASubmissionThatFailed(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	rt := newRuntime(t, landsThenFails{NewMemStore()}, Config{Observers: []Observer{rec}})
	_, err := rt.Submit(ctx, "k", noop, alice)
	require.Error(t, err)
	id, err := ScopedTaskKey("k", alice)
	require.NoError(t, err)
	snap := settled(t, rt, id)
	assert.True(t, snap.Status.Terminal(), "the record left behind ends: %s", snap.Status)
	require.NoError(t, rt.Shutdown(ctx)) // every run settled, every event reported
	assert.Empty(t, rec.kinds(id))
}

// A run that has not started here (a queue item behind a head, with or
// without Limits, or a task waiting for a slot) and is cancelled through
// another runtime reports its finished event here once, with the
// record's ending: on the store's notice, before its turn; over a store
// without notices, when its turn comes and its start is fenced out.
func TestObserverSeesAWaitingRunCancelledElsewhereOnce(t *testing.T) {
	for _, w := range []struct {
		name   string
		limits Limits
		queue  string
	}{
		{"queue item", Limits{}, "q"},
		{"queue item under limits", Limits{Owner: OwnerLimits{Waiting: 1}}, "q"},
		{"task waiting for a slot", Limits{MaxRunning: 1}, ""},
	} {
		for _, notices := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/notices=%v", w.name, notices), func(t *testing.T) {
				mem := NewMemStore()
				var s Store = mem
				if !notices {
					s = bareStore{mem}
				}
				rec := &recorder{}
				here := newRuntime(t, s, Config{Limits: w.limits, Observers: []Observer{rec}})
				there := newRuntime(t, mem, Config{})
				head := newGate()
				_, err := submitOn(here, w.queue, "head", head.fn, alice)
				require.NoError(t, err)
				wait(t, head.started, "the head to start")
				behind, err := submitOn(here, w.queue, "behind", noop, alice)
				require.NoError(t, err)
				if notices {
					listening(t, mem, 1)
				}

				require.NoError(t, there.Cancel(ctx, behind.ID, alice))
				if notices {
					e := rec.waitKind(t, behind.ID, EventFinished) // the head still runs
					assert.Equal(t, StatusCancelled, e.Status)
				}
				head.open()
				e := rec.waitKind(t, behind.ID, EventFinished)
				assert.Equal(t, StatusCancelled, e.Status)
				assert.Equal(t, CauseCancelled, e.Cause)
				require.NoError(t, here.Shutdown(ctx))
				assert.Equal(t, 1, count(rec.kinds(behind.ID), EventFinished), "finished events")
			})
		}
	}
}

// count returns how many of s equal v.
func count[T comparable](s []T, v T) int {
	n := 0
	for _, x := range s {
		if x == v {
			n++
		}
	}
	return n
}

// A run whose handle Reset forgot, its callback still running, is ended
// by a Cancel or a recovery that finds no handle and reports that end
// itself: the run's own write, fenced out when the callback returns,
// does not report it again.
//
// So it is over a store whose records Reset failed to clear (here its
// context had ended, and the MemStore cleared nothing).
func TestObserverSeesARunResetForgotEndOnce(t *testing.T) {
	for _, c := range []struct {
		ender, store string
	}{{"cancel", "durable"}, {"recovery", "durable"}, {"cancel", "not cleared"}, {"recovery", "not cleared"}} {
		ender := c.ender
		t.Run(ender+" over a store "+c.store, func(t *testing.T) {
			rec := &recorder{}
			var s Store = bareStore{NewMemStore()}
			resetCtx := ctx
			if c.store == "not cleared" {
				s = NewMemStore()
				ended, cancel := context.WithCancel(ctx)
				cancel()
				resetCtx = ended
			}
			rt := newRuntime(t, s, Config{Observers: []Observer{rec}})
			g := stubbornGate()
			sub, err := rt.Submit(ctx, "k", g.fn, alice)
			require.NoError(t, err)
			wait(t, g.started, "the callback")
			if err := rt.Reset(resetCtx); c.store == "durable" {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, context.Canceled, "the records stay")
			}
			kind := EventFinished
			if ender == "cancel" {
				require.NoError(t, rt.Cancel(ctx, sub.ID, alice))
			} else {
				n, err := rt.RecoverZombies(ctx)
				require.NoError(t, err)
				require.Equal(t, 1, n)
				kind = EventRecovered
			}
			rec.waitKind(t, sub.ID, kind)
			g.open()
			wait(t, g.ran, "the callback's return")
			require.NoError(t, rt.Shutdown(ctx)) // the run's fenced write is done
			kinds := rec.kinds(sub.ID)
			assert.Equal(t, 1, count(kinds, EventFinished)+count(kinds, EventRecovered), "ends reported: %v", kinds)
		})
	}
}

// Reset over a store whose records it clears (a MemStore) leaves no
// Cancel or recovery to find the run it forgot: the run, cancelled,
// reports its own end once its callback returns, CANCELLED as deleted
// (its record is gone), so that an observer's span for it ends.
func TestObserverHearsTheEndOfARunWhoseRecordResetCleared(t *testing.T) {
	rec := &recorder{}
	rt := newRuntime(t, NewMemStore(), Config{Observers: []Observer{rec}})
	sub, g := startGated(t, rt, "k")
	require.NoError(t, rt.Reset(ctx))
	wait(t, g.ran, "the callback's return on the cancel")
	e := rec.waitKind(t, sub.ID, EventFinished)
	assert.Equal(t, CauseDeleted, e.Cause)
	require.NoError(t, rt.Shutdown(ctx))
	kinds := rec.kinds(sub.ID)
	assert.Equal(t, 1, count(kinds, EventFinished)+count(kinds, EventRecovered), "ends reported: %v", kinds)
}

// A run that Shutdown left executing, and that another runtime recovered
// once its lease expired, is reported finished to this runtime's
// observers when its callback returns at last, with the end the record
// holds: its own write is fenced out, and an observer that opened a span
// for it would otherwise keep it open for good. If the key was submitted
// again meanwhile, the record is the new run's and holds no end of the
// old one: the observers hear it ended as superseded. Either way, once.
func TestObserverHearsTheEndOfARunLeftByShutdownAndRecoveredElsewhere(t *testing.T) {
	for _, rerun := range []bool{false, true} {
		t.Run(map[bool]string{false: "recovered", true: "then run again"}[rerun], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := NewMemStore()
				rec := &recorder{}
				cfg := Config{LeaseInterval: time.Second, LeaseTTL: 3 * time.Second, Logger: slog.New(slog.DiscardHandler)}
				withObserver := cfg
				withObserver.Observers = []Observer{rec}
				here, peer := NewRuntime(mem, withObserver), NewRuntime(mem, cfg)
				require.NoError(t, peer.Start(ctx))
				g := stubbornGate()
				sub, err := here.Submit(ctx, "stubborn", g.fn, alice)
				require.NoError(t, err)
				<-g.started

				short, cancel := context.WithTimeout(ctx, time.Second)
				defer cancel()
				require.Error(t, here.Shutdown(short), "the run is left executing")
				time.Sleep(10 * time.Second) // the lease expires, and the peer recovers the run
				synctest.Wait()
				r, err := mem.GetTask(ctx, sub.ID)
				require.NoError(t, err)
				require.Equal(t, CauseAbandoned, r.Cause, "recovered")
				if rerun {
					again, err := peer.Submit(ctx, "stubborn", func(context.Context, *Task) (any, error) { return nil, nil }, alice)
					require.NoError(t, err)
					require.NotEqual(t, sub.RunID, again.RunID)
					synctest.Wait()
				}

				g.open()
				synctest.Wait()
				ends := rec.endsOf(sub.RunID)
				if assert.Len(t, ends, 1, "the run's end reached the observer: %v", rec.kinds(sub.ID)) {
					e := ends[0]
					assert.Equal(t, EventFinished, e.Kind)
					if rerun {
						assert.Equal(t, StatusCancelled, e.Status)
						assert.Equal(t, CauseSuperseded, e.Cause)
						assert.False(t, e.StartedAt.IsZero(), "it started")
						assert.Equal(t, e.CompletedAt.Sub(e.StartedAt), e.Duration)
					} else {
						assert.Equal(t, StatusFailed, e.Status)
						assert.Equal(t, CauseAbandoned, e.Cause)
					}
				}
				require.NoError(t, peer.Shutdown(ctx))
			})
		})
	}
}

// endsOf returns the ends (Finished, Recovered) observers heard of run.
func (r *recorder) endsOf(run string) []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Event
	for _, e := range r.events {
		if e.RunID == run && (e.Kind == EventFinished || e.Kind == EventRecovered) {
			out = append(out, e)
		}
	}
	return out
}

// A run cancelled and re-run by another runtime, whose notices this one
// does not get: its sync pass finds the record another run's, cancels the
// run, and its observers hear of its end then, as superseded, once; the
// callback's late outcome adds nothing. A queue item replaced while it
// waits ends for them when its turn comes, without having started.
func TestObserverHearsTheEndOfARunReplacedElsewhereOnce(t *testing.T) {
	for _, queued := range []bool{false, true} {
		t.Run(map[bool]string{false: "running", true: "waiting in a queue"}[queued], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := NewMemStore()
				rec := &recorder{}
				here := newRuntime(t, bareStore{mem}, Config{Observers: []Observer{rec}, SyncInterval: time.Second})
				require.NoError(t, here.Start(ctx))
				peer := newRuntime(t, mem, Config{})
				g := stubbornGate()
				sub, err := here.SubmitSequential(ctx, "q", "first", g.fn, alice)
				require.NoError(t, err)
				wait(t, g.started, "the first item to start")
				id := sub.ID
				if queued {
					sub, err = here.SubmitSequential(ctx, "q", "second", func(context.Context, *Task) (any, error) { return nil, nil }, alice)
					require.NoError(t, err)
					id = sub.ID
				}
				err = peer.Cancel(ctx, id, alice)
				require.NoError(t, err)
				again, err := peer.Submit(ctx, strings.TrimPrefix(id, "alice::"), func(context.Context, *Task) (any, error) { return nil, nil }, alice)
				require.NoError(t, err)
				require.NotEqual(t, sub.RunID, again.RunID)
				time.Sleep(2 * time.Second) // a sync pass
				synctest.Wait()
				g.open()
				synctest.Wait()
				ends := rec.endsOf(sub.RunID)
				if assert.Len(t, ends, 1, "events of the task: %v", rec.kinds(id)) {
					assert.Equal(t, StatusCancelled, ends[0].Status)
					assert.Equal(t, CauseSuperseded, ends[0].Cause)
					assert.Equal(t, queued, ends[0].StartedAt.IsZero(), "started: %v", ends[0].StartedAt)
				}
			})
		})
	}
}
