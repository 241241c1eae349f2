package workers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Inside a synctest bubble, time.Sleep advances the fake clock; it never
// waits for a condition (synctest.Wait does that).

func TestTimeoutFailsTheTaskAtOnceAndIsNeverRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := memRuntime(t)
		release := make(chan struct{})
		var calls atomic.Int32
		var task *Task
		sub, err := rt.Submit(ctx, "slow", func(ctx context.Context, tk *Task) (any, error) {
			calls.Add(1)
			task = tk
			<-release // ignores ctx: a timeout bounds the wait, not the work
			return "late", nil
		}, alice, WithTimeout(time.Second), WithRetry(RetryPolicy{MaxAttempts: 3}))
		require.NoError(t, err)

		time.Sleep(time.Second + time.Nanosecond)
		synctest.Wait()
		snap, err := rt.Status(ctx, sub.ID, alice)
		require.NoError(t, err)
		assert.Equal(t, StatusFailed, snap.Status)
		assert.Equal(t, "Timed out after 1s", snap.Error)
		var te *TimeoutError
		require.ErrorAs(t, snap.Err(), &te)
		assert.Equal(t, time.Second, te.Timeout)
		assert.ErrorIs(t, snap.Err(), ErrTimeout)
		require.ErrorAs(t, task.CancelCause(), &te, "the context's cause is the typed timeout")

		time.Sleep(time.Hour)
		synctest.Wait()
		assert.EqualValues(t, 1, calls.Load(), "a timed-out attempt is never retried")

		close(release)
		synctest.Wait()
		snap, err = rt.Status(ctx, sub.ID, alice)
		require.NoError(t, err)
		assert.Equal(t, StatusFailed, snap.Status, "the late return is fenced out")
		assert.Nil(t, snap.Result)
	})
}

func TestTimeoutHoldsTheQueuePlaceUntilTheCallbackReturns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := memRuntime(t)
		release := make(chan struct{})
		stuck, err := rt.SubmitSequential(ctx, "q", "stuck", func(context.Context, *Task) (any, error) {
			<-release // ignores its context
			return nil, nil
		}, alice, WithTimeout(time.Minute))
		require.NoError(t, err)
		var nextRan atomic.Bool
		next, err := rt.SubmitSequential(ctx, "q", "next", func(context.Context, *Task) (any, error) {
			nextRan.Store(true)
			return "ok", nil
		}, alice)
		require.NoError(t, err)

		time.Sleep(time.Minute + time.Nanosecond)
		synctest.Wait()
		snap := mustStatus(t, rt, stuck.ID)
		assert.Equal(t, StatusFailed, snap.Status, "the record says timed out at once")
		assert.ErrorIs(t, snap.Err(), ErrTimeout)
		assert.Equal(t, StatusPending, mustStatus(t, rt, next.ID).Status)
		assert.False(t, nextRan.Load(), "the next item started while the timed-out callback still ran")
		info, err := rt.QueueStatus(ctx, "q", System)
		require.NoError(t, err)
		assert.Equal(t, stuck.ID, info.Running, "the timed-out callback still holds the queue's place")

		time.Sleep(time.Hour)
		synctest.Wait()
		assert.False(t, nextRan.Load(), "the place is held however long the callback runs")

		close(release)
		synctest.Wait()
		assert.Equal(t, StatusCompleted, mustStatus(t, rt, next.ID).Status, "the next item starts once it returns")
		assert.Equal(t, StatusFailed, mustStatus(t, rt, stuck.ID).Status)
	})
}

func mustStatus[S Store](t *testing.T, rt *Runtime[S], id string) Snapshot {
	t.Helper()
	snap, err := rt.Status(ctx, id, System)
	require.NoError(t, err)
	return snap
}

func TestRetryBacksOffExponentiallyUpToTheCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := memRuntime(t)
		var at []time.Time
		var attempts []int
		sub, err := rt.Submit(ctx, "flaky", func(_ context.Context, tk *Task) (any, error) {
			at = append(at, time.Now())
			attempts = append(attempts, tk.Attempt())
			if len(at) < 5 {
				return nil, errors.New("transient")
			}
			return "ok", nil
		}, alice, WithRetry(RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Second, MaxBackoff: 3 * time.Second, Jitter: NoJitter}))
		require.NoError(t, err)

		synctest.Wait()
		snap := mustStatus(t, rt, sub.ID)
		assert.Equal(t, StatusRunning, snap.Status)
		assert.Equal(t, 1, snap.Attempt)
		time.Sleep(time.Second)
		synctest.Wait()
		assert.Equal(t, 2, mustStatus(t, rt, sub.ID).Attempt, "the snapshot shows the attempt number")

		time.Sleep(time.Minute)
		synctest.Wait()
		snap = mustStatus(t, rt, sub.ID)
		assert.Equal(t, StatusCompleted, snap.Status)
		assert.Equal(t, 5, snap.Attempt)
		assert.Equal(t, []int{1, 2, 3, 4, 5}, attempts)
		var gaps []time.Duration
		for i := 1; i < len(at); i++ {
			gaps = append(gaps, at[i].Sub(at[i-1]))
		}
		assert.Equal(t, []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second}, gaps)
	})
}

func TestRetryExhaustedFailsWithTheLastError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := memRuntime(t)
		var n atomic.Int32
		sub, err := rt.Submit(ctx, "k", func(context.Context, *Task) (any, error) {
			return nil, fmt.Errorf("failure %d", n.Add(1))
		}, alice, WithRetry(RetryPolicy{MaxAttempts: 3}))
		require.NoError(t, err)
		time.Sleep(time.Hour)
		synctest.Wait()
		snap := mustStatus(t, rt, sub.ID)
		assert.Equal(t, StatusFailed, snap.Status)
		assert.Equal(t, "failure 3", snap.Error)
		assert.Equal(t, 3, snap.Attempt)
	})
}

func TestBackoffJitterStaysWithinBounds(t *testing.T) {
	t.Parallel()
	p := RetryPolicy{InitialBackoff: time.Second, MaxBackoff: time.Hour, Multiplier: 2, Jitter: 0.5}
	for range 1000 {
		d := p.backoff(3) // 4s nominal
		require.GreaterOrEqual(t, d, 2*time.Second)
		require.LessOrEqual(t, d, 6*time.Second)
	}
	p.Jitter = 0
	assert.Equal(t, time.Hour, p.backoff(100), "the cap holds however many attempts")
}

// Waits at the cap spread below it: jittered past the cap and cut back,
// every one would be MaxBackoff, and tasks failing alike would retry in
// step.
func TestBackoffJitterSpreadsWaitsAtTheCap(t *testing.T) {
	t.Parallel()
	p := RetryPolicy{InitialBackoff: time.Second, MaxBackoff: 3 * time.Second, Multiplier: 2, Jitter: DefaultJitter}
	seen := map[time.Duration]bool{}
	for range 200 {
		d := p.backoff(5) // 16s nominal, capped at 3s
		require.GreaterOrEqual(t, d, 2700*time.Millisecond)
		require.LessOrEqual(t, d, 3*time.Second)
		seen[d] = true
	}
	assert.Greater(t, len(seen), 100, "distinct waits of 200 at the cap")
}

func TestPanicsCountAsErrorsForRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := memRuntime(t)
		var n atomic.Int32
		sub, err := rt.Submit(ctx, "k", func(context.Context, *Task) (any, error) {
			if n.Add(1) == 1 {
				panic("first attempt explodes")
			}
			return "recovered", nil
		}, alice, WithRetry(RetryPolicy{MaxAttempts: 2}))
		require.NoError(t, err)
		time.Sleep(time.Minute)
		synctest.Wait()
		snap := mustStatus(t, rt, sub.ID)
		assert.Equal(t, StatusCompleted, snap.Status)
		assert.Equal(t, 2, snap.Attempt)
	})
}

func TestCancelDuringBackoffEndsCancelled(t *testing.T) {
	for _, c := range []struct {
		name   string
		cancel func(*Runtime[*MemStore], string) error
		cause  error
		msg    string
	}{
		{"ByUser", func(rt *Runtime[*MemStore], id string) error { return rt.Cancel(ctx, id, alice) }, ErrCancelled, "Cancelled by user"},
		{"ByShutdown", func(rt *Runtime[*MemStore], _ string) error { return rt.Shutdown(ctx) }, ErrShutdown, "Cancelled by worker shutdown"},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rt := memRuntime(t)
				var calls atomic.Int32
				sub, err := rt.Submit(ctx, "k", func(context.Context, *Task) (any, error) {
					calls.Add(1)
					return nil, errors.New("always")
				}, alice, WithRetry(RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Hour}))
				require.NoError(t, err)
				synctest.Wait() // parked in the backoff
				require.NoError(t, c.cancel(rt, sub.ID))
				synctest.Wait()
				snap := mustStatus(t, rt, sub.ID)
				assert.Equal(t, StatusCancelled, snap.Status)
				assert.Equal(t, c.msg, snap.Error)
				assert.ErrorIs(t, snap.Err(), c.cause)
				assert.EqualValues(t, 1, calls.Load())
			})
		})
	}
}

func TestSequentialQueueRunsOneAtATimeInOrder(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	const n = 50
	var mu sync.Mutex
	var order []int
	var running, maxRunning atomic.Int32
	var last Submission
	for i := range n {
		sub, err := rt.SubmitSequential(ctx, "q", fmt.Sprint("k", i), func(context.Context, *Task) (any, error) {
			if r := running.Add(1); r > maxRunning.Load() {
				maxRunning.Store(r)
			}
			defer running.Add(-1)
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			return nil, nil
		}, alice)
		require.NoError(t, err)
		last = sub
	}
	settled(t, rt, last.ID)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, order, n)
	for i, v := range order {
		require.Equal(t, i, v, "FIFO order")
	}
	assert.EqualValues(t, 1, maxRunning.Load(), "one task at a time")
}

func TestQueuesRunIndependently(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	blocked := newGate()
	_, err := rt.SubmitSequential(ctx, "a", "blocker", blocked.fn, alice)
	require.NoError(t, err)
	wait(t, blocked.started, "queue a's head")
	other, err := rt.SubmitSequential(ctx, "b", "free", noop, alice)
	require.NoError(t, err)
	assert.Equal(t, StatusCompleted, settled(t, rt, other.ID).Status)
	blocked.open()
}

func TestQueueStatusReportsRunningPendingAndLoad(t *testing.T) {
	t.Parallel()
	s := NewMemStore()
	rt := newRuntime(t, s, Config{})
	info, err := rt.QueueStatus(ctx, "q", alice)
	require.NoError(t, err)
	assert.Equal(t, QueueInfo{Name: "q", State: QueueIdle, Pending: []string{}}, info)

	head := newGate()
	h, err := rt.SubmitSequential(ctx, "q", "head", head.fn, alice)
	require.NoError(t, err)
	wait(t, head.started, "head")
	p1, err := rt.SubmitSequential(ctx, "q", "p1", noop, alice)
	require.NoError(t, err)
	p2, err := rt.SubmitSequential(ctx, "q", "p2", noop, bob)
	require.NoError(t, err)

	info, err = rt.QueueStatus(ctx, "q", System)
	require.NoError(t, err)
	assert.Equal(t, QueueInfo{Name: "q", State: QueueProcessing, Running: h.ID, RunningCount: 1,
		Pending: []string{p1.ID, p2.ID}, PendingCount: 2, Load: 3}, info)

	info, err = rt.QueueStatus(ctx, "q", bob)
	require.NoError(t, err)
	assert.Equal(t, QueueInfo{Name: "q", State: QueueProcessing, RunningCount: 1,
		Pending: []string{p2.ID}, PendingCount: 2, Load: 3}, info, "bob sees only his own ids")

	s.SetQueueAuthorizer(func(q, user string) bool { return user != "bob" })
	_, err = rt.QueueStatus(ctx, "q", bob)
	assert.ErrorIs(t, err, ErrUnauthorized)

	head.open()
	settled(t, rt, p2.ID)
	eventually(t, func() bool {
		info, err := rt.QueueStatus(ctx, "q", System)
		require.NoError(t, err)
		return info.State == QueueIdle && info.Load == 0
	}, "queue to go idle")
}

// A queue and its processor are made by the queue's first registered
// run: a submission refused, or one that joins a run, makes none.
func TestOnlyARegisteredRunCreatesItsQueue(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	hasQueue := func(name string) bool {
		rt.mu.RLock()
		defer rt.mu.RUnlock()
		return rt.queues[name] != nil
	}
	g := newGate()
	sub, err := rt.Submit(ctx, "shared", g.fn, alice, WithScope(ScopeGlobal))
	require.NoError(t, err)
	_, err = rt.SubmitSequential(ctx, "refused", "shared", noop, bob, WithScope(ScopeGlobal))
	require.ErrorIs(t, err, ErrUnauthorized)
	joined, err := rt.SubmitSequential(ctx, "joined", "shared", noop, alice, WithScope(ScopeGlobal))
	require.NoError(t, err)
	require.True(t, joined.Joined)
	assert.False(t, hasQueue("refused"), "a refused submission makes no queue")
	assert.False(t, hasQueue("joined"), "a join makes no queue")

	first, err := rt.SubmitSequential(ctx, "made", "k", noop, alice)
	require.NoError(t, err)
	assert.True(t, hasQueue("made"), "the first registered run makes its queue")
	assert.Equal(t, StatusCompleted, settled(t, rt, first.ID).Status)
	g.open()
	settled(t, rt, sub.ID)
}

func TestQueueStatusQueuedBeforeTheProcessorFetches(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	q := &queue{name: "q"}
	rt.queues["q"] = q // a queue with no processor: items stay put
	waiting := rt.newRun(ctx, "x", "q", caller{system: true}, submitOptions{}, noop)
	cancelled := rt.newRun(ctx, "y", "q", caller{system: true}, submitOptions{}, noop)
	cancelled.cancel(ErrCancelled)
	q.items.push(waiting)
	q.items.push(cancelled)
	info, err := rt.QueueStatus(ctx, "q", System)
	require.NoError(t, err)
	assert.Equal(t, QueueQueued, info.State)
	assert.Equal(t, 1, info.Load, "a cancelled item is not pending")
	assert.Equal(t, []string{"x"}, info.Pending)
	delete(rt.queues, "q")
}

// A teardown stops the queues fetching before it drains, and records every
// item that never started CANCELLED with the shutdown message.
func TestShutdownAbandonsTheQueueBacklog(t *testing.T) {
	t.Parallel()
	rt := NewRuntime(NewMemStore(), Config{})
	head := newGate()
	h, err := rt.SubmitSequential(ctx, "q", "head", head.fn, alice)
	require.NoError(t, err)
	wait(t, head.started, "head")
	var ran atomic.Int32
	var backlog []string
	for i := range 5 {
		sub, err := rt.SubmitSequential(ctx, "q", fmt.Sprint("b", i), func(context.Context, *Task) (any, error) {
			ran.Add(1)
			return nil, nil
		}, alice)
		require.NoError(t, err)
		backlog = append(backlog, sub.ID)
	}
	require.NoError(t, rt.Shutdown(ctx))
	assert.Zero(t, ran.Load(), "no backlog item started during the teardown")
	for _, id := range backlog {
		snap := mustStatus(t, rt, id)
		assert.Equal(t, StatusCancelled, snap.Status)
		assert.Equal(t, "Cancelled by worker shutdown", snap.Error)
	}
	snap := mustStatus(t, rt, h.ID)
	assert.Equal(t, StatusCancelled, snap.Status)
	assert.ErrorIs(t, snap.Err(), ErrShutdown)

	_, err = rt.Submit(ctx, "late", noop, alice)
	assert.ErrorIs(t, err, ErrClosed)
	_, err = rt.SubmitSequential(ctx, "q", "late", noop, alice)
	assert.ErrorIs(t, err, ErrClosed)
	assert.ErrorIs(t, rt.Start(ctx), ErrClosed)
}

// An abandon write is fenced on the run id its item carried from
// registration, never on one re-read at teardown: a successor that took
// the key meanwhile is spared.
func TestAbandonIsFencedOnTheRunIDFromRegistration(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		want Status // the successor's status when rt1 shuts down
		// successor submits "k" in rt2, returning the gate to open once
		// rt1 has shut down, and waits until it is where the case wants.
		successor func(t *testing.T, rt2 *Runtime[*MemStore]) (Submission, *gate)
	}{
		{"RunningSuccessor", StatusRunning, func(t *testing.T, rt2 *Runtime[*MemStore]) (Submission, *gate) {
			g := newGate()
			sub, err := rt2.Submit(ctx, "k", g.fn, alice)
			require.NoError(t, err)
			wait(t, g.started, "successor")
			return sub, g
		}},
		{"PendingSuccessor", StatusPending, func(t *testing.T, rt2 *Runtime[*MemStore]) (Submission, *gate) {
			head := newGate()
			_, err := rt2.SubmitSequential(ctx, "q", "head2", head.fn, alice)
			require.NoError(t, err)
			wait(t, head.started, "rt2's head")
			sub, err := rt2.SubmitSequential(ctx, "q", "k", noop, alice)
			require.NoError(t, err)
			return sub, head
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := NewMemStore()
			rt1 := NewRuntime(s, Config{})
			rt2 := newRuntime(t, s, Config{})
			head := newGate()
			_, err := rt1.SubmitSequential(ctx, "q", "head", head.fn, alice)
			require.NoError(t, err)
			wait(t, head.started, "head")
			stale, err := rt1.SubmitSequential(ctx, "q", "k", noop, alice)
			require.NoError(t, err)
			require.NoError(t, rt1.Cancel(ctx, stale.ID, alice))

			fresh, release := c.successor(t, rt2)
			require.False(t, fresh.Joined)
			require.NoError(t, rt1.Shutdown(ctx))
			snap := mustStatus(t, rt2, fresh.ID)
			assert.Equal(t, fresh.RunID, snap.RunID)
			assert.Equal(t, c.want, snap.Status, "rt1's teardown did not touch the successor")
			release.open()
			assert.Equal(t, StatusCompleted, settled(t, rt2, fresh.ID).Status)
		})
	}
}

// A drain's cancellation is recorded as a shutdown on both submit paths.
func TestShutdownRecordsTheShutdownCauseOnBothPaths(t *testing.T) {
	t.Parallel()
	rt := NewRuntime(NewMemStore(), Config{})
	async, seq := newGate(), newGate()
	a, err := rt.Submit(ctx, "async", async.fn, alice)
	require.NoError(t, err)
	q, err := rt.SubmitSequential(ctx, "q", "seq", seq.fn, alice)
	require.NoError(t, err)
	completes := make(chan struct{})
	c, err := rt.Submit(ctx, "completes", func(ctx context.Context, _ *Task) (any, error) {
		close(completes)
		<-ctx.Done()
		return "finished anyway", nil
	}, alice)
	require.NoError(t, err)
	wait(t, async.started, "async")
	wait(t, seq.started, "seq")
	wait(t, completes, "completes")

	require.NoError(t, rt.Shutdown(ctx))
	for _, id := range []string{a.ID, q.ID} {
		snap := mustStatus(t, rt, id)
		assert.Equal(t, StatusCancelled, snap.Status)
		assert.Equal(t, "Cancelled by worker shutdown", snap.Error)
		assert.ErrorIs(t, snap.Err(), ErrShutdown)
	}
	assert.Equal(t, StatusCompleted, mustStatus(t, rt, c.ID).Status,
		"what a drained run records is its own doing")
}

// The first cause wins: a drain that lands after a person's cancel does
// not overwrite it.
func TestUserCancelCauseSurvivesShutdown(t *testing.T) {
	t.Parallel()
	rt := NewRuntime(NewMemStore(), Config{})
	started, release := make(chan struct{}), make(chan struct{})
	var task *Task
	sub, err := rt.Submit(ctx, "k", func(ctx context.Context, tk *Task) (any, error) {
		task = tk
		close(started)
		<-ctx.Done()
		<-release
		return nil, ctx.Err()
	}, alice)
	require.NoError(t, err)
	wait(t, started, "callback")
	require.NoError(t, rt.Cancel(ctx, sub.ID, alice))
	shut := make(chan error)
	go func() { shut <- rt.Shutdown(ctx) }()
	close(release)
	require.NoError(t, <-shut)
	assert.ErrorIs(t, task.CancelCause(), ErrCancelled)
	assert.Equal(t, "Cancelled by user", mustStatus(t, rt, sub.ID).Error)
}

// A teardown whose wait ends before a run settles leaves that run its
// handle, so recovery does not declare a live run dead; the run releases
// the handle itself when its callback returns.
func TestShutdownDoesNotManufactureZombies(t *testing.T) {
	t.Parallel()
	rt := NewRuntime(NewMemStore(), Config{})
	g := stubbornGate()
	sub, err := rt.Submit(ctx, "k", g.fn, alice)
	require.NoError(t, err)
	wait(t, g.started, "callback")

	expired, cancel := context.WithCancel(ctx)
	cancel() // do not wait
	err = rt.Shutdown(expired)
	require.ErrorIs(t, err, context.Canceled)

	n, err := rt.RecoverZombies(ctx)
	require.NoError(t, err)
	assert.Zero(t, n)
	assert.Equal(t, StatusRunning, mustStatus(t, rt, sub.ID).Status)

	g.open()
	require.NoError(t, rt.Shutdown(ctx), "a second Shutdown waits for what is left")
	assert.Equal(t, StatusCompleted, mustStatus(t, rt, sub.ID).Status)
	assert.Zero(t, rt.runs.len(), "the run released its own handle")
}

func TestShutdownWithDeadlineReportsUnsettledRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := NewRuntime(NewMemStore(), Config{})
		g := stubbornGate()
		_, err := rt.Submit(ctx, "k", g.fn, alice)
		require.NoError(t, err)
		synctest.Wait()
		deadline, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		err = rt.Shutdown(deadline)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Contains(t, err.Error(), "1 runs")
		g.open()
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// After Shutdown returns nil no record it owned is PENDING or RUNNING,
// however submissions and the teardown interleave.
func TestConcurrentSubmitAndShutdownLeaveNothingLive(t *testing.T) {
	t.Parallel()
	s := NewMemStore()
	rt := NewRuntime(s, Config{})
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 8 {
		wg.Go(func() {
			<-start
			for j := 0; ; j++ {
				key := fmt.Sprint("k", i, "-", j)
				var err error
				if j%2 == 0 {
					_, err = rt.Submit(ctx, key, sleepy, alice)
				} else {
					_, err = rt.SubmitSequential(ctx, fmt.Sprint("q", i%2), key, sleepy, alice)
				}
				if errors.Is(err, ErrClosed) {
					return
				}
				if !assert.NoError(t, err) {
					return
				}
			}
		})
	}
	close(start)
	eventually(t, func() bool {
		recs, _ := s.ListTasks(ctx, Filter{})
		return len(recs) > 20
	}, "some submissions")
	require.NoError(t, rt.Shutdown(ctx))
	wg.Wait()
	live, err := s.ListTasks(ctx, Filter{Statuses: []Status{StatusPending, StatusRunning}})
	require.NoError(t, err)
	assert.Empty(t, live)
}

// sleepy yields until its context ends or a few rounds pass.
func sleepy(ctx context.Context, _ *Task) (any, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(time.Millisecond):
		return nil, nil
	}
}

// Cancel racing completion: each task ends in exactly one terminal state,
// and a Cancel that returned nil always left it CANCELLED.
func TestCancelRacingCompletion(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	const n = 64
	subs := make([]Submission, n)
	for i := range n {
		var err error
		subs[i], err = rt.Submit(ctx, fmt.Sprint("k", i), returns(i, nil), alice)
		require.NoError(t, err)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = rt.Cancel(ctx, subs[i].ID, alice) })
	}
	wg.Wait()
	for i := range n {
		snap := settled(t, rt, subs[i].ID)
		switch {
		case errs[i] == nil:
			assert.Equal(t, StatusCancelled, snap.Status)
		case errors.Is(errs[i], ErrFinished):
			assert.Equal(t, StatusCompleted, snap.Status)
		default:
			t.Errorf("Cancel: %v", errs[i])
		}
	}
}

func TestRecoverZombiesFailsOnlyRecordsWithoutALiveRun(t *testing.T) {
	t.Parallel()
	s := NewMemStore()
	created := now().Add(-time.Hour)
	for _, r := range []Record{
		{ID: "alice::crashed", RunID: "dead.1", Watchers: []string{"alice"}, CreatedAt: created,
			State: State{Status: StatusRunning, Progress: 40, Attempt: 1, StartedAt: created}},
		{ID: "alice::orphan", RunID: "dead.2", Watchers: []string{"alice"}, CreatedAt: created,
			State: State{Status: StatusPending}},
		{ID: "alice::done", RunID: "dead.3", Watchers: []string{"alice"}, CreatedAt: created,
			State: State{Status: StatusCompleted, CompletedAt: created}},
	} {
		require.NoError(t, s.InsertTask(ctx, r))
	}
	rt := newRuntime(t, s, Config{RecoverZombies: true})
	live := newGate()
	sub, err := rt.Submit(ctx, "live", live.fn, alice)
	require.NoError(t, err)
	wait(t, live.started, "live run")
	require.NoError(t, rt.Start(ctx))
	assert.Error(t, rt.Start(ctx), "Start runs once")

	for _, id := range []string{"alice::crashed", "alice::orphan"} {
		snap := mustStatus(t, rt, id)
		assert.Equal(t, StatusFailed, snap.Status, id)
		assert.ErrorIs(t, snap.Err(), ErrAbandoned, id)
	}
	assert.Equal(t, 40, mustStatus(t, rt, "alice::crashed").Progress, "recovery keeps the state it found")
	assert.Equal(t, StatusCompleted, mustStatus(t, rt, "alice::done").Status)
	assert.Equal(t, StatusRunning, mustStatus(t, rt, sub.ID).Status, "a live run is not a zombie")
	n, err := rt.RecoverZombies(ctx)
	require.NoError(t, err)
	assert.Zero(t, n)
	live.open()
	settled(t, rt, sub.ID)
}

// listHook is a MemStore whose next ListTasks first calls before.
type listHook struct {
	*MemStore
	before func()
}

func (s *listHook) ListTasks(ctx context.Context, f Filter) ([]Record, error) {
	if h := s.before; h != nil {
		s.before = nil
		h()
	}
	return s.MemStore.ListTasks(ctx, f)
}

// An instance that takes its lease and registers a run while a recovery
// lists the live records is live to that recovery: it reads the live
// instances after the list, so every instance a listed run could belong
// to has its lease in the read.
func TestRecoveryKeepsTheRunOfAnInstanceThatStartedDuringIt(t *testing.T) {
	t.Parallel()
	mem := NewMemStore()
	hook := &listHook{MemStore: mem}
	recoverer := newRuntime(t, hook, Config{})
	newcomer := newRuntime(t, mem, Config{})
	g := newGate()
	var sub Submission
	hook.before = func() {
		var err error
		sub, err = newcomer.Submit(ctx, "k", g.fn, alice)
		require.NoError(t, err)
		wait(t, g.started, "the newcomer's run")
	}
	n, err := recoverer.RecoverZombies(ctx)
	require.NoError(t, err)
	assert.Zero(t, n, "no run was dead")
	assert.Equal(t, StatusRunning, mustStatus(t, newcomer, sub.ID).Status, "a live run is not a zombie")
	g.open()
	settled(t, newcomer, sub.ID)
	assert.Equal(t, StatusCompleted, mustStatus(t, newcomer, sub.ID).Status)
}

// insertHook is a store whose InsertTask calls after once it stored the
// record, and whose next GetTask calls read, if set, once it read.
type insertHook struct {
	bareStore
	after func(Record)
	read  atomic.Pointer[func()]
}

func (s *insertHook) InsertTask(ctx context.Context, rec Record) error {
	err := s.bareStore.InsertTask(ctx, rec)
	if err == nil && s.after != nil {
		s.after(rec)
	}
	return err
}

func (s *insertHook) GetTask(ctx context.Context, id string) (Record, error) {
	rec, err := s.bareStore.GetTask(ctx, id)
	if f := s.read.Swap(nil); f != nil {
		(*f)()
	}
	return rec, err
}

// A cancel that reads the record between a registration's insert and the
// publishing of its run's handle waits for the handle, which the task's
// lock holds back, before it writes. It then cancels the run's context,
// over a store with neither notices nor a sync loop to tell the run
// later, and holds the handle, whose flags let the run's end be reported
// once: by the cancel, not again by the run's fenced-out write.
func TestCancelDuringRegistrationReachesTheRun(t *testing.T) {
	t.Parallel()
	mem := NewMemStore()
	s := &insertHook{bareStore: bareStore{mem}}
	rec := &recorder{}
	rt := newRuntime(t, s, Config{Observers: []Observer{rec}})
	cancelled := make(chan error, 1)
	s.after = func(r Record) {
		s.after = nil
		read := make(chan struct{})
		f := func() { close(read) }
		s.read.Store(&f)
		go func() { cancelled <- rt.Cancel(ctx, r.ID, alice) }()
		<-read // the cancel read the record; the handle is not out yet
	}
	cause := make(chan error, 1)
	sub, err := rt.Submit(ctx, "k", func(ctx context.Context, _ *Task) (any, error) {
		select {
		case <-ctx.Done():
			cause <- context.Cause(ctx)
		case <-time.After(10 * time.Second):
			cause <- nil
		}
		return nil, nil
	}, alice)
	require.NoError(t, err)
	require.NoError(t, <-cancelled)
	// The run ends on the cancel's account, not on Shutdown's: its
	// callback sees the cancel, or never starts.
	deadline := time.Now().Add(5 * time.Second)
	for rt.handle(sub.ID, sub.RunID) != nil {
		require.True(t, time.Now().Before(deadline), "the run went on after its cancel")
		runtime.Gosched()
	}
	select {
	case err := <-cause:
		require.ErrorIs(t, err, ErrCancelled, "the run's context was cancelled by the cancel")
	default: // cancelled before its callback could start
	}
	assert.Equal(t, StatusCancelled, mustStatus(t, rt, sub.ID).Status)
	assert.Equal(t, 1, count(rec.kinds(sub.ID), EventFinished), "finished events")
}

// Run handles are per runtime: a new runtime over the same store sweeps
// the runs another runtime abandoned, and those runs' late writes are
// fenced out.
func TestRecoveryByANewRuntimeOverTheSameStore(t *testing.T) {
	t.Parallel()
	s := bareStore{NewMemStore()} // without leases, another runtime's run counts as dead
	crashed := newRuntime(t, s, Config{})
	g := stubbornGate()
	sub, err := crashed.Submit(ctx, "k", g.fn, alice)
	require.NoError(t, err)
	wait(t, g.started, "run")

	restarted := newRuntime(t, s, Config{RecoverZombies: true})
	require.NoError(t, restarted.Start(ctx))
	assert.Equal(t, StatusFailed, mustStatus(t, restarted, sub.ID).Status)
	g.open()
	wait(t, g.ran, "abandoned callback")
	require.NoError(t, crashed.Shutdown(ctx))
	assert.Equal(t, StatusFailed, mustStatus(t, restarted, sub.ID).Status, "the abandoned run's write was fenced out")
}

func TestCleanupSchedulerDeletesOldTerminalRecords(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := bareStore{NewMemStore()} // no recovery at Start: the RUNNING record stays
		old := now().Add(-2 * time.Hour)
		recent := now().Add(-10 * time.Minute)
		for _, r := range []Record{
			{ID: "old-done", RunID: "r1", CreatedAt: old, State: State{Status: StatusCompleted, CompletedAt: old}},
			{ID: "old-failed", RunID: "r2", CreatedAt: old, State: State{Status: StatusFailed, CompletedAt: old}},
			{ID: "recent", RunID: "r3", CreatedAt: recent, State: State{Status: StatusCompleted, CompletedAt: recent}},
			{ID: "old-running", RunID: "r4", CreatedAt: old, State: State{Status: StatusRunning, StartedAt: old}},
		} {
			require.NoError(t, s.InsertTask(ctx, r))
		}
		rt := newRuntime(t, s, Config{CleanupInterval: time.Minute, Retention: time.Hour})
		require.NoError(t, rt.Start(ctx))
		synctest.Wait()
		assert.Len(t, ids(t, s), 4, "nothing before the first tick")
		time.Sleep(time.Minute)
		synctest.Wait()
		assert.ElementsMatch(t, []string{"recent", "old-running"}, ids(t, s))

		n, err := rt.Cleanup(ctx, 0)
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		assert.Equal(t, []string{"old-running"}, ids(t, s))
		_, err = rt.Cleanup(ctx, -time.Second)
		assert.ErrorIs(t, err, ErrInvalidOption)
	})
}

func ids(t *testing.T, s Store) []string {
	t.Helper()
	recs, err := s.ListTasks(ctx, Filter{})
	require.NoError(t, err)
	out := make([]string, len(recs))
	for i := range recs {
		out[i] = recs[i].ID
	}
	return out
}

func TestStartValidatesConfigAndPrestartsQueues(t *testing.T) {
	t.Parallel()
	rt := newRuntime(t, NewMemStore(), Config{Queues: []string{"reports", "mail"}})
	require.NoError(t, rt.Start(ctx))
	rt.mu.RLock()
	assert.Len(t, rt.queues, 2)
	rt.mu.RUnlock()

	bad := NewRuntime(NewMemStore(), Config{Queues: []string{""}})
	assert.ErrorIs(t, bad.Start(ctx), ErrInvalidKey)
	for _, cfg := range []Config{{CleanupInterval: -time.Second}, {Retention: -time.Second}, {SyncInterval: -time.Second}} {
		assert.ErrorIs(t, NewRuntime(NewMemStore(), cfg).Start(ctx), ErrInvalidOption)
	}
}

// Two runtimes over one store have their own queues and processors:
// shutting one down does not stop the other's. Policy stays on the store
// and is shared.
func TestShutdownOfOneRuntimeLeavesAnothersQueuesRunning(t *testing.T) {
	t.Parallel()
	s := NewMemStore()
	rt1 := NewRuntime(s, Config{Queues: []string{"q"}})
	rt2 := newRuntime(t, s, Config{Queues: []string{"q"}})
	require.NoError(t, rt1.Start(ctx))
	require.NoError(t, rt2.Start(ctx))
	require.NoError(t, rt1.Shutdown(ctx))

	sub, err := rt2.SubmitSequential(ctx, "q", "k", returns("ok", nil), alice)
	require.NoError(t, err)
	assert.Equal(t, StatusCompleted, settled(t, rt2, sub.ID).Status)

	s.SetQueueAuthorizer(func(q, user string) bool { return q != "q" })
	_, err = rt2.SubmitSequential(ctx, "q", "k2", noop, alice)
	assert.ErrorIs(t, err, ErrUnauthorized, "the store's policy governs every runtime over it")
}

// durableStore hides MemStore's RecordClearer, as a durable store would
// not implement it.
type durableStore struct{ Store }

func TestResetClearsVolatileRecordsOnly(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		store Store
		kept  bool
	}{
		{"Volatile", NewMemStore(), false},
		{"Durable", durableStore{NewMemStore()}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rt := newRuntime(t, c.store, Config{})
			head := newGate()
			h, err := rt.SubmitSequential(ctx, "q", "head", head.fn, alice)
			require.NoError(t, err)
			wait(t, head.started, "head")
			p, err := rt.SubmitSequential(ctx, "q", "pending", noop, alice)
			require.NoError(t, err)

			require.NoError(t, rt.Reset(ctx))
			wait(t, head.ran, "head to see its context cancelled")
			recs, err := c.store.ListTasks(ctx, Filter{})
			require.NoError(t, err)
			if !c.kept {
				assert.Empty(t, recs)
				return
			}
			assert.Len(t, recs, 2, "a reset never deletes durable records")
			assert.Equal(t, StatusCancelled, mustStatus(t, rt, p.ID).Status)
			eventually(t, func() bool { return mustStatus(t, rt, h.ID).Status == StatusCancelled }, "head to record its cancel")

			sub, err := rt.Submit(ctx, "after", noop, alice)
			require.NoError(t, err, "the runtime stays open")
			settled(t, rt, sub.ID)
		})
	}
}

// With a sync interval, the live progress of a running task reaches
// the store, where another runtime (another process) reads it.
func TestSyncLoopPublishesRunningProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := bareStore{NewMemStore()} // the polling path: no notices
		rt := newRuntime(t, s, Config{SyncInterval: time.Second})
		require.NoError(t, rt.Start(ctx))
		other := newRuntime(t, s, Config{})
		step := make(chan int)
		sub, err := rt.Submit(ctx, "k", func(ctx context.Context, tk *Task) (any, error) {
			for p := range step {
				tk.SetProgress(p)
			}
			return nil, nil
		}, alice)
		require.NoError(t, err)
		stored := func() int {
			snap, err := other.Status(ctx, sub.ID, alice)
			require.NoError(t, err)
			return snap.Progress
		}

		step <- 40
		synctest.Wait()
		assert.Equal(t, 0, stored(), "not before the loop runs")
		time.Sleep(time.Second)
		synctest.Wait()
		assert.Equal(t, 40, stored())
		step <- 65
		time.Sleep(time.Second)
		synctest.Wait()
		assert.Equal(t, 65, stored())
		close(step)
		synctest.Wait()
		assert.Equal(t, StatusCompleted, mustStatus(t, other, sub.ID).Status)
	})
}

// A progress write is built from the state the run last wrote, so it
// never undoes a retry's attempt number, nor loses the run's start.
func TestSyncLoopProgressKeepsTheAttemptAndStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := bareStore{NewMemStore()} // the polling path: no notices
		rt := newRuntime(t, s, Config{SyncInterval: time.Second})
		require.NoError(t, rt.Start(ctx))
		release := make(chan struct{})
		sub, err := rt.Submit(ctx, "k", func(ctx context.Context, tk *Task) (any, error) {
			if tk.Attempt() == 1 {
				tk.SetProgress(10)
				return nil, errors.New("transient")
			}
			tk.SetProgress(20)
			<-release
			return nil, nil
		}, alice, WithRetry(RetryPolicy{MaxAttempts: 2, InitialBackoff: 1500 * time.Millisecond}))
		require.NoError(t, err)
		started, err := s.GetTask(ctx, sub.ID)
		require.NoError(t, err)
		require.False(t, started.StartedAt.IsZero())
		time.Sleep(2 * time.Second)
		synctest.Wait()
		rec, err := s.GetTask(ctx, sub.ID)
		require.NoError(t, err)
		assert.Equal(t, 2, rec.Attempt)
		assert.Equal(t, 20, rec.Progress)
		assert.Equal(t, started.StartedAt, rec.StartedAt, "the progress write keeps the start")
		close(release)
	})
}

// The sync loop ends a run whose record another process ended: cancelled
// there, recovered there as a zombie, or re-run there.
func TestSyncLoopCancelsRunsEndedElsewhere(t *testing.T) {
	for _, c := range []struct {
		name  string
		end   func(t *testing.T, s bareStore, other *Runtime[bareStore], id string)
		cause error
	}{
		{"CancelledElsewhere", func(t *testing.T, _ bareStore, other *Runtime[bareStore], id string) {
			require.NoError(t, other.Cancel(ctx, id, alice))
		}, ErrCancelled},
		{"RecoveredElsewhere", func(t *testing.T, _ bareStore, other *Runtime[bareStore], _ string) {
			n, err := other.RecoverZombies(ctx)
			require.NoError(t, err)
			require.Equal(t, 1, n)
		}, ErrAbandoned},
		{"RerunElsewhere", func(t *testing.T, s bareStore, other *Runtime[bareStore], id string) {
			rec, err := s.GetTask(ctx, id)
			require.NoError(t, err)
			rec.Status, rec.CompletedAt = StatusFailed, now()
			require.NoError(t, s.SetTask(ctx, rec))
			_, err = other.Submit(ctx, "k", noop, alice)
			require.NoError(t, err)
		}, ErrSuperseded},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := bareStore{NewMemStore()} // the polling path: no notices
				rt := newRuntime(t, s, Config{SyncInterval: time.Second})
				require.NoError(t, rt.Start(ctx))
				other := newRuntime(t, s, Config{})
				g := newGate()
				sub, err := rt.Submit(ctx, "k", g.fn, alice)
				require.NoError(t, err)
				wait(t, g.started, "callback")
				task := g.task.Load()
				synctest.Wait()

				c.end(t, s, other, sub.ID)
				synctest.Wait()
				assert.NoError(t, task.CancelCause(), "nothing reaches the run before the loop runs")
				time.Sleep(time.Second)
				synctest.Wait()
				assert.ErrorIs(t, task.CancelCause(), c.cause)
				select {
				case <-g.ran:
				default:
					t.Error("the callback did not return on its cancelled context")
				}
			})
		})
	}
}

// The sync loop leaves a run alone while its record is still its own.
func TestSyncLoopLeavesLiveRunsAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := bareStore{NewMemStore()} // the polling path: no notices
		rt := newRuntime(t, s, Config{SyncInterval: time.Second})
		require.NoError(t, rt.Start(ctx))
		g := newGate()
		sub, err := rt.Submit(ctx, "k", g.fn, alice)
		require.NoError(t, err)
		wait(t, g.started, "callback")
		task := g.task.Load()
		time.Sleep(time.Hour)
		synctest.Wait()
		assert.NoError(t, task.CancelCause())
		g.open()
		synctest.Wait()
		assert.Equal(t, StatusCompleted, mustStatus(t, rt, sub.ID).Status)
		assert.NoError(t, task.CancelCause(), "a finished run is not cancelled after the fact")
		time.Sleep(time.Hour)
		synctest.Wait()
		assert.NoError(t, task.CancelCause())
	})
}

// A Config the runtime cannot run with is refused by every call that
// would start its loops, not only by Start: a submission without Start
// neither panics on a negative interval nor runs on a lease that lapses
// between its renewals.
func TestMisconfiguredRuntimeRefusesWithoutStart(t *testing.T) {
	for name, cfg := range map[string]Config{
		"negative LeaseInterval":                {LeaseInterval: -time.Second},
		"negative SyncInterval":                 {SyncInterval: -time.Second},
		"negative RecoverInterval":              {RecoverInterval: -time.Second},
		"negative Retention":                    {Retention: -time.Second},
		"negative Limits.MaxWaiting":            {Limits: Limits{MaxWaiting: -1}},
		"negative OwnerLimits.Weight":           {Limits: Limits{Owner: OwnerLimits{Weight: -1}}},
		"Observers[1] is nil":                   {Observers: []Observer{ObserverFunc(func(context.Context, Event) {}), nil}},
		"Middleware[0] is nil":                  {Middleware: []Middleware{nil}},
		"LeaseTTL 1s must exceed LeaseInterval": {LeaseInterval: time.Second, LeaseTTL: time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			rt := newRuntime(t, NewMemStore(), cfg)
			_, err := rt.Submit(ctx, "k", noop, alice)
			assert.ErrorIs(t, err, ErrInvalidOption)
			assert.ErrorContains(t, err, name, "the error names the setting")
			assert.ErrorIs(t, err, ErrInvalidConfig, "the runtime's fault, not the caller's")
			_, err = rt.Wait(ctx, "alice::k", alice)
			assert.ErrorIs(t, err, ErrInvalidOption)
			assert.ErrorIs(t, rt.Ready(ctx), ErrInvalidConfig)
			for _, err := range rt.Subscribe(ctx, alice) {
				assert.ErrorIs(t, err, ErrInvalidConfig)
			}
			assert.ErrorIs(t, rt.Start(ctx), ErrInvalidOption)
		})
	}
	// A queue's bad name is a *ValidationError still.
	rt := newRuntime(t, NewMemStore(), Config{Queues: []string{""}})
	err := rt.Start(ctx)
	var ve *ValidationError
	assert.ErrorAs(t, err, &ve)
	assert.ErrorIs(t, err, ErrInvalidKey)
	assert.ErrorIs(t, err, ErrInvalidConfig)
}

// Ready answers what a submission would fail with before its record:
// nil on a runtime that can take work, the lease's error while the
// store cannot renew it, ErrClosed once Shutdown has begun.
func TestReadyReportsWhatASubmissionWouldMeet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &failingLeaser{MemStore: NewMemStore()}
		rt := NewRuntime(s, Config{Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, rt.Ready(ctx), "the first call takes the lease")
		s.fail.Store(true)
		time.Sleep(16 * time.Second) // past LeaseTTL: the lease may have ended
		err := rt.Ready(ctx)
		require.ErrorIs(t, err, errLeaseStore)
		_, serr := rt.Submit(ctx, "k", noop, alice)
		assert.ErrorIs(t, serr, errLeaseStore, "a submission meets the same")
		s.fail.Store(false)
		require.NoError(t, rt.Ready(ctx), "Ready renewed the lease")
		require.NoError(t, rt.Shutdown(ctx))
		assert.ErrorIs(t, rt.Ready(ctx), ErrClosed)
	})
}

// Ready fails from the first renewal that fails, while the lease still
// lives, not only once it may have ended: a store that is down or
// refuses writes fails every submission at its insert meanwhile. Ready
// answers nil again as soon as the store takes a renewal, and makes no
// store call while the last renewal succeeded.
func TestReadyFailsFromTheFirstRenewalThatFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &failingLeaser{MemStore: NewMemStore()}
		rt := NewRuntime(s, Config{Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, rt.Start(ctx))
		calls := s.calls.Load()
		require.NoError(t, rt.Ready(ctx))
		assert.Equal(t, calls, s.calls.Load(), "a store call while the lease is live and renewed")

		s.fail.Store(true)
		time.Sleep(rt.cfg.LeaseInterval + time.Millisecond) // the loop's renewal fails; the lease lives on
		synctest.Wait()
		require.Greater(t, s.calls.Load(), calls, "the loop renewed")
		err := rt.Ready(ctx)
		require.ErrorIs(t, err, errLeaseStore)
		assert.ErrorContains(t, err, "renewing the instance lease")

		s.fail.Store(false)
		calls = s.calls.Load()
		require.NoError(t, rt.Ready(ctx), "the store takes renewals again")
		assert.Equal(t, calls+1, s.calls.Load(), "Ready renewed, once")
		require.NoError(t, rt.Ready(ctx))
		assert.Equal(t, calls+1, s.calls.Load(), "a store call after a renewal succeeded")
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// Ready's own renewals, made while renewals fail, are reported to its
// caller and not logged: a probe every second would otherwise log a line
// a second, beside the loop's one an interval.
func TestReadyLogsNoRenewalOfItsOwn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &failingLeaser{MemStore: NewMemStore()}
		logger, logs := bufferLogger()
		rt := NewRuntime(s, Config{Logger: logger})
		require.NoError(t, rt.Start(ctx))
		s.fail.Store(true)
		time.Sleep(rt.cfg.LeaseInterval + time.Millisecond) // the loop's renewal fails, and is logged
		synctest.Wait()
		const line = "lease renewal failed"
		require.Equal(t, 1, strings.Count(logs.String(), line), logs.String())
		calls := s.calls.Load()
		for range 5 {
			require.ErrorIs(t, rt.Ready(ctx), errLeaseStore)
		}
		assert.Equal(t, calls+5, s.calls.Load(), "each Ready renewed")
		assert.Equal(t, 1, strings.Count(logs.String(), line), "Ready's renewals were logged")
		s.fail.Store(false)
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// A store that does not answer a renewal at all (a network that drops
// its packets) fails Ready once the renewal has waited for longer than
// a LeaseInterval, though the renewal is cut off only at the lease's
// end: every submission meanwhile waits on the same store.
func TestReadyFailsWhileARenewalGoesUnanswered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &hangingLeaser{MemStore: NewMemStore(), answer: make(chan struct{})}
		rt := NewRuntime(s, Config{Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, rt.Start(ctx))
		s.hang.Store(true)
		time.Sleep(rt.cfg.LeaseInterval + time.Millisecond) // the loop's renewal is sent, and hangs
		synctest.Wait()
		require.NoError(t, rt.Ready(ctx), "a renewal in flight for less than an interval")
		time.Sleep(rt.cfg.LeaseInterval)
		err := rt.Ready(ctx)
		require.ErrorIs(t, err, ErrUnavailable)
		assert.ErrorContains(t, err, "has not answered for 3.001s")
		s.hang.Store(false)
		close(s.answer) // the renewal is answered, and succeeds
		synctest.Wait()
		require.NoError(t, rt.Ready(ctx))
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// hangingLeaser is a MemStore whose lease renewals wait, while hang is
// set, until answer is closed or their ctx ends.
type hangingLeaser struct {
	*MemStore
	hang   atomic.Bool
	answer chan struct{}
}

func (s *hangingLeaser) RenewLease(ctx context.Context, instance string, ttl time.Duration) (bool, error) {
	if s.hang.Load() {
		select {
		case <-s.answer:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	return s.MemStore.RenewLease(ctx, instance, ttl)
}

// errLeaseStore is the error failingLeaser's renewals fail with.
var errLeaseStore = errors.New("lease table unreachable")

// failingLeaser is a MemStore whose lease renewals fail while fail is set.
type failingLeaser struct {
	*MemStore
	fail  atomic.Bool
	calls atomic.Int32 // renewals asked for
}

func (s *failingLeaser) RenewLease(ctx context.Context, instance string, ttl time.Duration) (bool, error) {
	s.calls.Add(1)
	if s.fail.Load() {
		return false, errLeaseStore
	}
	return s.MemStore.RenewLease(ctx, instance, ttl)
}

// A nil store is refused where it is given, not at the first call that
// reads it.
func TestNewRuntimePanicsOnANilStore(t *testing.T) {
	const want = "workers: NewRuntime with a nil Store"
	assert.PanicsWithValue(t, want, func() { NewRuntime[Store](nil, Config{}) })
	assert.PanicsWithValue(t, want, func() { NewRuntime((*MemStore)(nil), Config{}) })
}

// Wait reads the store after Shutdown as Status does, whether or not the
// runtime took its lease before: one that never did answered ErrClosed
// for a task that had completed.
func TestWaitAfterShutdownReadsTheStore(t *testing.T) {
	s := NewMemStore()
	runner := newRuntime(t, s, Config{})
	sub, err := runner.Submit(ctx, "done", func(context.Context, *Task) (any, error) { return "ok", nil }, alice)
	require.NoError(t, err)
	_, err = runner.Wait(ctx, sub.ID, alice)
	require.NoError(t, err)

	for _, leased := range []bool{false, true} {
		rt := NewRuntime(s, Config{})
		if leased {
			require.NoError(t, rt.Ready(ctx))
		}
		require.NoError(t, rt.Shutdown(ctx))
		snap, err := rt.Wait(ctx, sub.ID, alice)
		require.NoError(t, err, "leased before Shutdown: %v", leased)
		assert.Equal(t, StatusCompleted, snap.Status)
	}
}

// A backoff never comes out negative, which would retry at once: a
// Multiplier that grows it past what a Duration holds gives MaxBackoff,
// and a Multiplier that is not a number is refused, as a Jitter is.
func TestBackoffStaysWithinItsCapForAnyMultiplier(t *testing.T) {
	t.Parallel()
	policy := func(p RetryPolicy) RetryPolicy {
		t.Helper()
		var o submitOptions
		require.NoError(t, WithRetry(p)(&o))
		return o.retry
	}
	for _, p := range []RetryPolicy{
		{MaxAttempts: 3, MaxBackoff: time.Second, Multiplier: math.Inf(1)},
		{MaxAttempts: 3, MaxBackoff: math.MaxInt64, Multiplier: 1e12},
		{MaxAttempts: 3, MaxBackoff: math.MaxInt64, Multiplier: 1e12, Jitter: NoJitter},
	} {
		p = policy(p)
		for attempt := 1; attempt <= 4; attempt++ {
			d := p.backoff(attempt)
			require.Positive(t, d, "%+v attempt %d", p, attempt)
			require.LessOrEqual(t, d, p.MaxBackoff, "%+v attempt %d", p, attempt)
		}
	}
	var o submitOptions
	require.ErrorIs(t, WithRetry(RetryPolicy{MaxAttempts: 3, Multiplier: math.NaN()})(&o), ErrInvalidOption)
}

// A Shutdown that leaves a callback executing names its task in a
// *ShutdownError, which wraps ctx's error, and counts it once, whether
// a runner or a queue's processor executes it.
func TestShutdownErrorNamesTheRunsLeftExecuting(t *testing.T) {
	for _, c := range []struct {
		name  string
		width int
		queue string
	}{{"async", 0, ""}, {"queue", 1, "q"}, {"queue of two", 2, "q"}} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rt := NewRuntime(NewMemStore(), Config{Logger: slog.New(slog.DiscardHandler), Limits: Limits{QueueConcurrency: c.width}})
				g := stubbornGate()
				var sub Submission
				var err error
				if c.queue == "" {
					sub, err = rt.Submit(ctx, "stubborn", g.fn, alice)
				} else {
					sub, err = rt.SubmitSequential(ctx, c.queue, "stubborn", g.fn, alice)
				}
				require.NoError(t, err)
				<-g.started
				sctx, cancel := context.WithTimeout(ctx, time.Second)
				defer cancel()
				err = rt.Shutdown(sctx)
				require.ErrorIs(t, err, context.DeadlineExceeded)
				var se *ShutdownError
				require.ErrorAs(t, err, &se)
				assert.Equal(t, 1, se.Executing)
				assert.Equal(t, []string{sub.ID}, se.ExecutingIDs)
				assert.Empty(t, se.UnwrittenIDs)
				assert.Equal(t, "workers: shutdown left 1 runs or goroutines executing and 0 live records of this runtime unwritten (executing: "+sub.ID+"): context deadline exceeded", err.Error())
				g.open()
				synctest.Wait()
			})
		})
	}
}

// slowInsert is a store whose insert of a key with "slow" in it takes
// ten seconds, within its context, as an insert behind a row lock does.
type slowInsert struct{ bareStore }

func (s slowInsert) InsertTask(ctx context.Context, rec Record) error {
	if strings.Contains(rec.ID, "slow") {
		select {
		case <-time.After(10 * time.Second):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return s.bareStore.InsertTask(ctx, rec)
}

// A submission still registering when Shutdown begins does not put off
// the grace point: the runs in flight are cancelled at it, with the time
// left to record their ends, and not when ctx ends.
func TestShutdownCancelsAtTheGracePointWhileASubmissionStillRegisters(t *testing.T) {
	for _, grace := range []time.Duration{-1, 0} {
		t.Run(fmt.Sprint("grace=", grace), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rt := NewRuntime(slowInsert{bareStore{NewMemStore()}}, Config{Logger: slog.New(slog.DiscardHandler), ShutdownGrace: grace})
				var cancelledAt time.Time
				_, err := rt.Submit(ctx, "run", func(ctx context.Context, _ *Task) (any, error) {
					<-ctx.Done()
					cancelledAt = time.Now()
					return nil, context.Cause(ctx)
				}, alice)
				require.NoError(t, err)
				slow := make(chan error, 1)
				go func() {
					_, err := rt.Submit(ctx, "slow", noop, bob)
					slow <- err
				}()
				synctest.Wait() // the slow submission waits in its insert

				began := time.Now()
				sctx, cancel := context.WithTimeout(ctx, 4*time.Second)
				defer cancel()
				err = rt.Shutdown(sctx)
				want := 3 * time.Second // by default, three quarters of what ctx leaves
				if grace < 0 {
					want = 0 // at once
				}
				assert.Equal(t, want, cancelledAt.Sub(began), "when the run in flight was cancelled")
				var se *ShutdownError
				if errors.As(err, &se) {
					assert.Empty(t, se.ExecutingIDs, "the cancelled run returned at once")
					assert.Empty(t, se.UnwrittenIDs)
				}
				<-slow
			})
		})
	}
}

// stuckRelease is a store whose ReleaseLease ignores its context and
// waits until unstuck closes, as a call stuck in a driver that does not
// watch it.
type stuckRelease struct {
	*MemStore
	unstuck chan struct{}
}

func (s stuckRelease) ReleaseLease(ctx context.Context, instance string) error {
	<-s.unstuck
	return s.MemStore.ReleaseLease(context.WithoutCancel(ctx), instance)
}

// Shutdown returns by ctx's deadline plus a small constant even when the
// release of the lease, its last store call, ignores its context.
func TestShutdownIsBoundedByALeaseReleaseThatIgnoresItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := stuckRelease{NewMemStore(), make(chan struct{})}
		rt := NewRuntime(store, Config{Logger: slog.New(slog.DiscardHandler)})
		_, err := rt.Submit(ctx, "k", noop, alice)
		require.NoError(t, err)
		synctest.Wait()
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		began := time.Now()
		assert.NoError(t, rt.Shutdown(sctx), "everything settled")
		assert.LessOrEqual(t, time.Since(began), 2*shutdownSlack)
		close(store.unstuck)
		synctest.Wait()
	})
}

// An idle runtime told not to wait (an already-done ctx) has nothing to
// leave behind: its parked runner and its idle queue's processor end as
// Shutdown stops them, and are not counted as left executing.
func TestShutdownOfAnIdleRuntimeWithADoneContextLeavesNothing(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  Config
		use  func(rt *Runtime[*MemStore]) error
	}{
		{"parked runner", Config{}, func(rt *Runtime[*MemStore]) error {
			sub, err := rt.Submit(ctx, "k", noop, alice)
			if err == nil {
				_, err = rt.Wait(ctx, sub.ID, alice)
			}
			return err
		}},
		{"idle queue", Config{Queues: []string{"q"}}, func(rt *Runtime[*MemStore]) error { return rt.Start(ctx) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			for range 20 {
				c.cfg.Logger = slog.New(slog.DiscardHandler)
				rt := NewRuntime(NewMemStore(), c.cfg)
				require.NoError(t, c.use(rt))
				eventually(t, func() bool { return rt.runs.len() == 0 }, "the run to settle")
				done, cancel := context.WithCancel(ctx)
				cancel()
				require.NoError(t, rt.Shutdown(done))
			}
		})
	}
}

// A ShutdownError's message names at most five tasks of each kind.
func TestShutdownErrorMessageNamesAFewTasks(t *testing.T) {
	ids := func(prefix string, n int) (s []string) {
		for i := range n {
			s = append(s, prefix+strconv.Itoa(i))
		}
		return s
	}
	err := &ShutdownError{Executing: 7, Unwritten: 2, ExecutingIDs: ids("x", 7), UnwrittenIDs: ids("u", 2)}
	assert.Equal(t, "workers: shutdown left 7 runs or goroutines executing and 2 live records of this runtime unwritten (executing: x0, x1, x2, x3, x4 and 2 more; unwritten: u0, u1): the store refused their writes, or an earlier Shutdown or a Reset gave them up", err.Error())
	assert.Nil(t, errors.Unwrap(err))
}

// The Shutdown that settles everything releases the instance lease, even
// after an earlier one, told not to wait, left a callback executing and
// ended the runtime's life at its cutoff: other instances then see this
// one gone at once, not once its lease expires.
func TestALaterShutdownThatSettlesEverythingReleasesTheLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewMemStore()
		rt := NewRuntime(s, Config{Logger: slog.New(slog.DiscardHandler)})
		g := stubbornGate()
		_, err := rt.Submit(ctx, "stubborn", g.fn, alice)
		require.NoError(t, err)
		<-g.started
		done, cancel := context.WithCancel(ctx)
		cancel()
		var se *ShutdownError
		require.ErrorAs(t, rt.Shutdown(done), &se, "the callback is left executing")
		require.Error(t, rt.life.Err(), "the first Shutdown's cutoff ended the runtime's life")

		g.open()
		synctest.Wait()
		require.NoError(t, rt.Shutdown(ctx), "everything settled")
		live, err := s.LiveInstances(ctx)
		require.NoError(t, err)
		assert.NotContains(t, live, rt.instance, "the lease is released")
	})
}

// A run parked in its retry backoff when Shutdown begins begins no other
// attempt, even within the grace: it has no callback in flight to let
// finish, and it ends CANCELLED by the shutdown at once.
func TestShutdownStartsNoAttemptOfARunInItsBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := NewRuntime(NewMemStore(), Config{})
		var calls atomic.Int32
		sub, err := rt.Submit(ctx, "k", func(ctx context.Context, _ *Task) (any, error) {
			if calls.Add(1) == 1 {
				return nil, errors.New("transient")
			}
			<-ctx.Done()
			return nil, context.Cause(ctx)
		}, alice, WithRetry(RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second, Jitter: NoJitter}))
		require.NoError(t, err)
		synctest.Wait() // the first attempt failed; the run waits out its backoff

		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		start := time.Now()
		require.NoError(t, rt.Shutdown(sctx))
		assert.Zero(t, time.Since(start), "Shutdown waited for the run in its backoff")
		assert.EqualValues(t, 1, calls.Load(), "attempts begun")
		snap := mustStatus(t, rt, sub.ID)
		assert.Equal(t, StatusCancelled, snap.Status)
		assert.ErrorIs(t, snap.Err(), ErrShutdown)
	})
}

// A callback that panics after Shutdown cancelled it fails its run, with
// retries left or none: the panic is its own failure, not its answer to
// the cancel, no retry begins once the run is cancelled, and the record
// keeps the panic's cause and stack.
func TestARunThatPanicsAfterTheShutdownCancelFails(t *testing.T) {
	for _, attempts := range []int{1, 3} {
		t.Run(strconv.Itoa(attempts)+" attempts", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rt := NewRuntime(NewMemStore(), Config{Logger: slog.New(slog.DiscardHandler)})
				var calls atomic.Int32
				sub, err := rt.Submit(ctx, "k", func(ctx context.Context, _ *Task) (any, error) {
					calls.Add(1)
					<-ctx.Done()
					panic("flushing the buffer failed")
				}, alice, WithRetry(RetryPolicy{MaxAttempts: attempts}))
				require.NoError(t, err)
				synctest.Wait()
				require.NoError(t, rt.Shutdown(ctx))
				assert.EqualValues(t, 1, calls.Load(), "attempts")
				snap := mustStatus(t, rt, sub.ID)
				assert.Equal(t, StatusFailed, snap.Status, "recorded %s %q (%s)", snap.Status, snap.Error, snap.Cause)
				assert.Equal(t, CausePanicked, snap.Cause)
				assert.NotEmpty(t, snap.Stack)
			})
		})
	}
}

// The jitter keeps its bounds near the cap: a wait jittered past the cap
// spreads below it rather than landing on it, and a cap of a few
// nanoseconds is not cut to no wait at all.
func TestBackoffJitterNearTheCapStaysWithinItsFraction(t *testing.T) {
	t.Parallel()
	for _, most := range []time.Duration{1, 5, 9} {
		p := RetryPolicy{InitialBackoff: time.Second, MaxBackoff: most, Multiplier: 2, Jitter: DefaultJitter}
		for range 50 {
			d := p.backoff(1)
			require.GreaterOrEqual(t, float64(d), 0.9*float64(most), "MaxBackoff %v: wait %v", most, d)
			require.LessOrEqual(t, d, most, "MaxBackoff %v", most)
		}
	}
	p := RetryPolicy{InitialBackoff: time.Second, MaxBackoff: 2100 * time.Millisecond, Multiplier: 2, Jitter: DefaultJitter}
	atCap := 0
	for range 400 {
		if p.backoff(2) == p.MaxBackoff { // 2s nominal, jittered within 1.8s to 2.2s
			atCap++
		}
	}
	assert.Less(t, atCap, 10, "waits of 400 exactly at MaxBackoff")
}

// A run whose backoff runs out as Shutdown begins (a wait of no length,
// here) begins no other attempt: Shutdown's start wins over the timer.
func TestShutdownStartsNoAttemptAfterABackoffOfNoLength(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := NewRuntime(NewMemStore(), Config{})
		p := RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Nanosecond, MaxBackoff: time.Nanosecond}
		release := make(chan struct{})
		var later atomic.Int32
		for i := range 16 {
			var calls atomic.Int32
			_, err := rt.Submit(ctx, "k"+strconv.Itoa(i), func(ctx context.Context, _ *Task) (any, error) {
				if calls.Add(1) == 1 {
					<-release
					return nil, errors.New("transient")
				}
				later.Add(1)
				<-ctx.Done()
				return nil, context.Cause(ctx)
			}, alice, WithRetry(p))
			require.NoError(t, err)
		}
		synctest.Wait()
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- rt.Shutdown(sctx) }()
		synctest.Wait() // Shutdown waits out the grace for the callbacks
		close(release)
		synctest.Wait()
		assert.Zero(t, later.Load(), "attempts begun after Shutdown began")
		require.NoError(t, <-done)
	})
}
