package workers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Edge cases of the runtime's concurrency. As in lifecycle_test.go,
// time.Sleep appears only inside synctest bubbles, where it advances the
// fake clock; it never waits for a condition.

// hookStore lets a test act inside the runtime's store calls. Set the hooks
// before the store is shared.
type hookStore struct {
	Store        // a MemStore, seen without its optional capabilities
	onGet        func(ctx context.Context, rec Record)
	onTransition func(ctx context.Context, id string, from []Status, next State)
}

func (s *hookStore) GetTask(ctx context.Context, id string) (Record, error) {
	rec, err := s.Store.GetTask(ctx, id)
	if err == nil && s.onGet != nil {
		s.onGet(ctx, rec)
	}
	return rec, err
}

func (s *hookStore) TransitionTask(ctx context.Context, id, runID string, from []Status, next State) (bool, error) {
	if s.onTransition != nil {
		s.onTransition(ctx, id, from, next)
	}
	return s.Store.TransitionTask(ctx, id, runID, from, next)
}

type callerTag struct{}

// (c) The claim lands while the run's context is still live: nothing the
// callback does on ctx.Done can pre-empt it.
func TestCancelClaimsBeforeTheRunsContextEnds(t *testing.T) {
	t.Parallel()
	var task atomic.Pointer[Task]
	var causeAtClaim atomic.Value
	s := &hookStore{Store: NewMemStore()}
	s.onTransition = func(ctx context.Context, _ string, _ []Status, next State) {
		if ctx.Value(callerTag{}) != nil && next.Status == StatusCancelled {
			causeAtClaim.Store(struct{ err error }{task.Load().CancelCause()})
		}
	}
	rt := newRuntime(t, s, Config{})
	g := newGate()
	sub, err := rt.Submit(ctx, "k", func(ctx context.Context, tk *Task) (any, error) {
		task.Store(tk)
		return g.fn(ctx, tk)
	}, alice)
	require.NoError(t, err)
	wait(t, g.started, "callback")
	require.NoError(t, rt.Cancel(context.WithValue(ctx, callerTag{}, true), sub.ID, alice))
	got, ok := causeAtClaim.Load().(struct{ err error })
	require.True(t, ok, "Cancel made its claim")
	assert.NoError(t, got.err, "the run's context was already cancelled when the claim was written")
	assert.Equal(t, "Cancelled by user", settled(t, rt, sub.ID).Error)
}

// (h) A superseded run that settles late leaves its successor's handle:
// the successor stays live to recovery and cancellable through it.
func TestSupersededRunSettlingLeavesTheSuccessorsHandle(t *testing.T) {
	t.Parallel()
	s := NewMemStore()
	rt := newRuntime(t, s, Config{})
	_, old, oldTask := runMarkedFinished(t, s, rt)

	fresh := newGate()
	second, err := rt.Submit(ctx, "k", fresh.fn, alice)
	require.NoError(t, err)
	wait(t, fresh.started, "re-run")
	old.open()
	wait(t, oldTask.doneChan(), "the superseded run to settle")

	n, err := rt.RecoverZombies(ctx)
	require.NoError(t, err)
	assert.Zero(t, n, "the successor is live")
	assert.Equal(t, StatusRunning, mustStatus(t, rt, second.ID).Status)
	require.NoError(t, rt.Cancel(ctx, second.ID, alice))
	wait(t, fresh.ran, "the successor's context to end through its handle")
	assert.Equal(t, "Cancelled by user", settled(t, rt, second.ID).Error)
}

// (p) A state write from a tool holding an old copy neither evicts a
// joiner nor moves the record to another run.
func TestStateWriteKeepsJoinersAndRunID(t *testing.T) {
	t.Parallel()
	s := NewMemStore()
	rt := newRuntime(t, s, Config{})
	s.SetWatchAuthorizer(func(string, []string, string) bool { return true })
	g := newGate()
	sub, err := rt.Submit(ctx, "shared", g.fn, alice, WithScope(ScopeGlobal))
	require.NoError(t, err)
	wait(t, g.started, "callback")
	stale, err := s.GetTask(ctx, sub.ID)
	require.NoError(t, err)
	_, err = rt.Submit(ctx, "shared", noop, bob, WithScope(ScopeGlobal))
	require.NoError(t, err)

	stale.Progress, stale.RunID, stale.Watchers = 30, "admin-edit", []string{"mallory"}
	require.NoError(t, s.SetTask(ctx, stale))
	_, err = rt.Status(ctx, sub.ID, bob)
	require.NoError(t, err, "bob's join survived the state write")
	_, err = rt.Status(ctx, sub.ID, MustOwner("mallory"))
	assert.ErrorIs(t, err, ErrNotFound)
	g.open()
	snap := settled(t, rt, sub.ID)
	assert.Equal(t, StatusCompleted, snap.Status, "the run still owns its record")
	assert.Equal(t, sub.RunID, snap.RunID)
}

// (t) Reset forgets every run handle, as documented.
func TestResetForgetsRunHandles(t *testing.T) {
	t.Parallel()
	s := durableStore{NewMemStore()}
	rt := newRuntime(t, s, Config{})
	g := stubbornGate()
	sub, err := rt.Submit(ctx, "k", g.fn, alice)
	require.NoError(t, err)
	wait(t, g.started, "callback")
	require.NoError(t, rt.Reset(ctx))
	assert.Nil(t, rt.handle(sub.ID, sub.RunID), "Reset dropped the handle")
	g.open()
}

// Ownership is derived from the id: a user-scoped record that lists no
// watchers (a full-row write from elsewhere dropped them) is still its
// owner's to read, list and cancel.
func TestOwnerIsNeverEvictedFromAUserScopedTask(t *testing.T) {
	t.Parallel()
	s := NewMemStore()
	rt := newRuntime(t, s, Config{})
	require.NoError(t, s.InsertTask(ctx, Record{ID: "alice::legacy", RunID: "elsewhere.1",
		CreatedAt: now(), State: State{Status: StatusRunning}}))
	_, err := rt.Status(ctx, "alice::legacy", alice)
	require.NoError(t, err)
	list, err := rt.List(ctx, alice)
	require.NoError(t, err)
	assert.Equal(t, []string{"alice::legacy"}, snapshotIDs(list))
	_, err = rt.Status(ctx, "alice::legacy", bob)
	assert.ErrorIs(t, err, ErrNotFound)
	require.NoError(t, rt.Cancel(ctx, "alice::legacy", alice))
}

// System watches everything: it joins a live global task without asking
// the watch authorizer.
func TestSystemJoinsALiveGlobalTask(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	g := newGate()
	sub, err := rt.Submit(ctx, "warm", g.fn, alice, WithScope(ScopeGlobal))
	require.NoError(t, err)
	joined, err := rt.Submit(ctx, "warm", noop, System)
	require.NoError(t, err)
	assert.True(t, joined.Joined)
	assert.Equal(t, sub.RunID, joined.RunID)
	g.open()
	settled(t, rt, sub.ID)
}

// A joiner of a waiting queue item sees its id in QueueStatus.
func TestQueueStatusShowsAJoinersItem(t *testing.T) {
	t.Parallel()
	s := NewMemStore()
	rt := newRuntime(t, s, Config{})
	s.SetWatchAuthorizer(func(_ string, _ []string, user string) bool { return user == "bob" })
	head := newGate()
	_, err := rt.SubmitSequential(ctx, "q", "head", head.fn, alice)
	require.NoError(t, err)
	wait(t, head.started, "head")
	item, err := rt.SubmitSequential(ctx, "q", "shared", noop, alice, WithScope(ScopeGlobal))
	require.NoError(t, err)
	_, err = rt.SubmitSequential(ctx, "q", "shared", noop, bob, WithScope(ScopeGlobal))
	require.NoError(t, err)
	info, err := rt.QueueStatus(ctx, "q", bob)
	require.NoError(t, err)
	assert.Equal(t, []string{item.ID}, info.Pending)
	head.open()
	settled(t, rt, item.ID)
}

// A joiner through another runtime over the same store is a watcher in
// the store: the runtime that holds the queue learns it from the join's
// notice, and its QueueStatus shows the joiner the item, running or
// waiting, as it does a joiner through itself.
func TestQueueStatusShowsAnItemJoinedThroughAnotherRuntime(t *testing.T) {
	t.Parallel()
	s := NewMemStore()
	a := newRuntime(t, s, Config{})
	b := newRuntime(t, s, Config{})
	require.NoError(t, a.Ready(ctx))
	s.SetWatchAuthorizer(func(_ string, _ []string, user string) bool { return user == "bob" })
	head := newGate()
	t.Cleanup(head.open) // before the runtimes shut down
	running, err := a.SubmitSequential(ctx, "q", "head", head.fn, alice, WithScope(ScopeGlobal))
	require.NoError(t, err)
	wait(t, head.started, "head")
	item, err := a.SubmitSequential(ctx, "q", "shared", noop, alice, WithScope(ScopeGlobal))
	require.NoError(t, err)
	for _, key := range []string{"head", "shared"} {
		joined, err := b.SubmitSequential(ctx, "q", key, noop, bob, WithScope(ScopeGlobal))
		require.NoError(t, err)
		require.True(t, joined.Joined, key)
	}
	eventually(t, func() bool {
		info, err := a.QueueStatus(ctx, "q", bob)
		require.NoError(t, err)
		return info.Running == running.ID && slices.Equal(info.Pending, []string{item.ID})
	}, "bob, a watcher in the store, to see both items in the QueueStatus of the runtime that holds them")
}

// A run whose context ended before it started never calls back and
// records its cause.
func TestRunCancelledBeforeItStartsNeverCallsBack(t *testing.T) {
	t.Parallel()
	s := NewMemStore()
	rt := newRuntime(t, s, Config{})
	var called atomic.Bool
	tk := rt.newRun(ctx, "alice::k", "", caller{userID: "alice"}, submitOptions{}, func(context.Context, *Task) (any, error) {
		called.Store(true)
		return nil, nil
	})
	require.NoError(t, s.InsertTask(ctx, tk.record()))
	rt.publish(tk)
	tk.cancel(ErrShutdown)
	rt.execute(tk)
	assert.False(t, called.Load())
	snap := mustStatus(t, rt, tk.ID())
	assert.Equal(t, StatusCancelled, snap.Status)
	assert.ErrorIs(t, snap.Err(), ErrShutdown)
}

// A typed nil *SystemAuthority is a nil authority, not the bypass.
func TestNilSystemPointerIsRefused(t *testing.T) {
	t.Parallel()
	var nilSystem *SystemAuthority
	_, err := resolve(nilSystem)
	require.ErrorIs(t, err, ErrNoAuthority)
	rt := memRuntime(t)
	_, err = rt.List(ctx, nilSystem)
	assert.ErrorIs(t, err, ErrNoAuthority)
}

// A timed-out run settles only after its timeout is recorded, so a
// Shutdown that returned nil never leaves it RUNNING.
func TestTimedOutRunSettlesOnlyAfterItsTerminalWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var task atomic.Pointer[Task]
		var settledFirst atomic.Bool
		s := &hookStore{Store: NewMemStore()}
		s.onTransition = func(_ context.Context, _ string, _ []Status, next State) {
			if next.Status != StatusFailed {
				return
			}
			select {
			case <-task.Load().doneChan():
				settledFirst.Store(true)
			case <-time.After(time.Second): // fake time, within StoreTimeout: nothing else can run meanwhile
			}
		}
		rt := newRuntime(t, s, Config{})
		sub, err := rt.Submit(ctx, "k", func(ctx context.Context, tk *Task) (any, error) {
			task.Store(tk)
			<-ctx.Done() // well-behaved: returns as soon as the timeout cancels it
			return nil, context.Cause(ctx)
		}, alice, WithTimeout(time.Second))
		require.NoError(t, err)
		time.Sleep(time.Hour)
		synctest.Wait()
		assert.False(t, settledFirst.Load(), "the run settled before its timeout was recorded")
		assert.Equal(t, StatusFailed, mustStatus(t, rt, sub.ID).Status)
	})
}

// Retried attempts under a timeout share no handoff state: a late CAS from
// an earlier attempt's goroutine must not make a later attempt settle the
// run twice (close of closed channel).
func TestTimeoutWithManyQuickRetriesSettlesOnce(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		var n atomic.Int32
		_, err := rt.Submit(ctx, fmt.Sprint("k", i), func(context.Context, *Task) (any, error) {
			if n.Add(1) < 100 {
				return nil, errors.New("again")
			}
			wg.Done()
			return nil, nil
		}, alice, WithTimeout(time.Hour), WithRetry(RetryPolicy{MaxAttempts: 100, MaxBackoff: time.Nanosecond}))
		require.NoError(t, err)
	}
	wg.Wait()
}

// Cancel's claim is fenced on the status it read: a run that started
// between the read and the claim keeps its StartedAt and Attempt.
func TestCancelDoesNotEraseAStartThatRacedIt(t *testing.T) {
	t.Parallel()
	s := &hookStore{Store: NewMemStore()}
	rt := newRuntime(t, s, Config{})
	head := newGate()
	_, err := rt.SubmitSequential(ctx, "q", "head", head.fn, alice)
	require.NoError(t, err)
	wait(t, head.started, "head")
	item := newGate()
	sub, err := rt.SubmitSequential(ctx, "q", "item", item.fn, alice)
	require.NoError(t, err)
	var once sync.Once
	s.onGet = func(ctx context.Context, rec Record) {
		if ctx.Value(callerTag{}) != nil && rec.Status == StatusPending {
			once.Do(func() { // the item starts between Cancel's read and its claim
				head.open()
				wait(t, item.started, "item")
			})
		}
	}
	require.NoError(t, rt.Cancel(context.WithValue(ctx, callerTag{}, true), sub.ID, alice))
	snap := settled(t, rt, sub.ID)
	assert.Equal(t, StatusCancelled, snap.Status)
	assert.False(t, snap.StartedAt.IsZero(), "the start was not erased")
	assert.Equal(t, 1, snap.Attempt)
}

type flakyListStore struct {
	Store // a MemStore, seen without its optional capabilities
	fail  atomic.Bool
}

func (s *flakyListStore) ListTasks(ctx context.Context, f Filter) ([]Record, error) {
	if s.fail.CompareAndSwap(true, false) {
		return nil, errors.New("db down")
	}
	return s.Store.ListTasks(ctx, f)
}

// A Start that failed on a transient store error can be retried.
func TestStartCanBeRetriedAfterRecoveryFails(t *testing.T) {
	t.Parallel()
	s := &flakyListStore{Store: NewMemStore()}
	s.fail.Store(true)
	rt := newRuntime(t, s, Config{RecoverZombies: true, Queues: []string{"q"}})
	require.Error(t, rt.Start(ctx))
	require.NoError(t, rt.Start(ctx), "the failed Start left the runtime startable")
}

type panickyResult struct{}

func (panickyResult) MarshalJSON() ([]byte, error) { panic("marshal boom") }

type panickyErr struct{}

func (panickyErr) Error() string { panic("error boom") }

// User code the runtime runs after the callback returns (a result's
// MarshalJSON, an error's Error) is inside the panic boundary too.
func TestPanicInResultEncodingOrErrorTextFailsTheRun(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	for key, fn := range map[string]Func{
		"marshal": returns(panickyResult{}, nil),
		"error":   returns(nil, panickyErr{}),
	} {
		sub, err := rt.Submit(ctx, key, fn, alice)
		require.NoError(t, err)
		snap := settled(t, rt, sub.ID)
		require.Equal(t, StatusFailed, snap.Status, key)
		require.Contains(t, snap.Error, "boom", key)
	}
}

// Shutdown returns only after every queue processor has exited.
func TestShutdownWaitsForQueueProcessors(t *testing.T) {
	t.Parallel()
	rt := NewRuntime(NewMemStore(), Config{Queues: []string{"a", "b", "c"}})
	require.NoError(t, rt.Start(ctx))
	head := newGate()
	sub, err := rt.SubmitSequential(ctx, "a", "head", head.fn, alice)
	require.NoError(t, err)
	wait(t, head.started, "head")
	require.NoError(t, rt.Shutdown(ctx))
	assert.Equal(t, StatusCancelled, mustStatus(t, rt, sub.ID).Status)
	for name, q := range rt.queues {
		select {
		case <-q.exited:
		default:
			t.Errorf("queue %q's processor still running after Shutdown returned nil", name)
		}
	}
}

// The first cause wins over a later timeout: a run that Shutdown cancelled
// before its timeout expired records the shutdown, not the timeout.
func TestShutdownBeforeTimeoutRecordsTheShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := NewRuntime(NewMemStore(), Config{})
		release := make(chan struct{})
		sub, err := rt.Submit(ctx, "k", func(context.Context, *Task) (any, error) {
			<-release // ignores ctx
			return nil, nil
		}, alice, WithTimeout(time.Minute))
		require.NoError(t, err)
		synctest.Wait()
		expired, cancel := context.WithCancel(ctx)
		cancel() // do not wait
		require.ErrorIs(t, rt.Shutdown(expired), context.Canceled)
		time.Sleep(time.Minute + time.Nanosecond)
		synctest.Wait()
		snap := mustStatus(t, rt, sub.ID)
		assert.Equal(t, StatusCancelled, snap.Status)
		assert.ErrorIs(t, snap.Err(), ErrShutdown)
		close(release)
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// A timed-out run's callback is still this runtime's goroutine: Shutdown
// waits for it, and returns nil only once it has returned.
func TestShutdownWaitsForATimedOutCallback(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := NewRuntime(NewMemStore(), Config{})
		release, returned := make(chan struct{}), make(chan struct{})
		sub, err := rt.Submit(ctx, "k", func(context.Context, *Task) (any, error) {
			<-release // ignores its context
			close(returned)
			return nil, nil
		}, alice, WithTimeout(time.Second))
		require.NoError(t, err)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		require.Equal(t, StatusFailed, mustStatus(t, rt, sub.ID).Status)

		short, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		assert.ErrorIs(t, rt.Shutdown(short), context.DeadlineExceeded)
		close(release)
		require.NoError(t, rt.Shutdown(context.Background()))
		select {
		case <-returned:
		default:
			t.Error("Shutdown returned nil while the timed-out callback still ran")
		}
	})
}

type blockingCleanup struct {
	Store            // a MemStore, seen without its optional capabilities
	entered, release chan struct{}
}

func (s *blockingCleanup) DeleteFinished(ctx context.Context, cutoff time.Time) (int, error) {
	select {
	case <-s.entered:
	default:
		close(s.entered)
	}
	<-s.release
	return s.Store.DeleteFinished(ctx, cutoff)
}

// Shutdown waits for a background loop's store call in progress.
func TestShutdownWaitsForTheBackgroundLoops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &blockingCleanup{Store: NewMemStore(), entered: make(chan struct{}), release: make(chan struct{})}
		rt := NewRuntime(s, Config{CleanupInterval: time.Second})
		require.NoError(t, rt.Start(ctx))
		<-s.entered
		short, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		assert.ErrorIs(t, rt.Shutdown(short), context.DeadlineExceeded, "a cleanup in progress is waited for")
		close(s.release)
		require.NoError(t, rt.Shutdown(context.Background()))
	})
}

// finishDuringRead lets the run finish while the sync loop's read is in flight.
type finishDuringRead struct {
	Store    // a MemStore, seen without its optional capabilities
	once     sync.Once
	armed    atomic.Bool
	release  chan struct{} // closed to let the callback return
	finished chan struct{} // closed once the run's terminal write landed
	signal   sync.Once
}

func (s *finishDuringRead) GetTask(ctx context.Context, id string) (Record, error) {
	if s.armed.Load() {
		s.once.Do(func() {
			close(s.release)
			<-s.finished
		})
	}
	return s.Store.GetTask(ctx, id)
}

func (s *finishDuringRead) TransitionTask(ctx context.Context, id, runID string, from []Status, next State) (bool, error) {
	ok, err := s.Store.TransitionTask(ctx, id, runID, from, next)
	if ok && next.Status.Terminal() {
		s.signal.Do(func() { close(s.finished) })
	}
	return ok, err
}

// A run whose own terminal write lands while the sync loop reads its
// record is not cancelled after the fact.
func TestSyncLoopSparesARunThatFinishedDuringItsRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &finishDuringRead{Store: NewMemStore(), release: make(chan struct{}), finished: make(chan struct{})}
		rt := NewRuntime(s, Config{SyncInterval: time.Second})
		require.NoError(t, rt.Start(ctx))
		var task *Task
		_, err := rt.Submit(ctx, "k", func(ctx context.Context, tk *Task) (any, error) {
			task = tk
			<-s.release
			return nil, nil
		}, alice)
		require.NoError(t, err)
		s.armed.Store(true)
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		assert.NoError(t, task.CancelCause(), "a finished run is not cancelled")
		require.NoError(t, rt.Shutdown(context.Background()))
	})
}
