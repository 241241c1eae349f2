package workers

import (
	"context"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A queue left empty ends its processor and leaves Stats within two
// reap intervals; a queue with an item waiting, or running, stays; and a
// submission to a retired queue's name starts it again, in order.
func TestIdleQueuesAreRetired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := NewRuntime(NewMemStore(), Config{})
		const tenants = 100
		for i := range tenants {
			sub, err := rt.SubmitSequential(ctx, "tenant-"+strconv.Itoa(i), "k", noop, alice)
			require.NoError(t, err)
			settled(t, rt, sub.ID)
		}
		busy := newGate()
		_, err := rt.SubmitSequential(ctx, "busy", "head", busy.fn, alice)
		require.NoError(t, err)
		<-busy.started
		behind, err := rt.SubmitSequential(ctx, "busy", "behind", noop, alice)
		require.NoError(t, err)
		synctest.Wait()
		rt.mu.RLock()
		var idle []*queue
		for name, q := range rt.queues {
			if name != "busy" {
				idle = append(idle, q)
			}
		}
		rt.mu.RUnlock()
		st, err := rt.Stats(ctx, System)
		require.NoError(t, err)
		require.Len(t, st.Queues, tenants+1)

		time.Sleep(2*queueReapInterval + time.Second)
		synctest.Wait()
		st, err = rt.Stats(ctx, System)
		require.NoError(t, err)
		require.Len(t, st.Queues, 1, "only the busy queue is left")
		assert.Equal(t, "busy", st.Queues[0].Name)
		for _, q := range idle {
			select {
			case <-q.exited:
			default:
				t.Errorf("queue %s: its processor did not end", q.name)
			}
		}
		assert.Equal(t, StatusPending, mustStatus(t, rt, behind.ID).Status, "the busy queue's item still waits")

		// A retired queue's name takes submissions again, in order.
		first := newGate()
		one, err := rt.SubmitSequential(ctx, "tenant-7", "again-1", first.fn, alice)
		require.NoError(t, err)
		<-first.started
		two, err := rt.SubmitSequential(ctx, "tenant-7", "again-2", noop, alice)
		require.NoError(t, err)
		synctest.Wait()
		assert.Equal(t, StatusPending, mustStatus(t, rt, two.ID).Status, "behind the first, in its queue")
		first.open()
		assert.Equal(t, StatusCompleted, settled(t, rt, one.ID).Status)
		assert.Equal(t, StatusCompleted, settled(t, rt, two.ID).Status)

		busy.open()
		assert.Equal(t, StatusCompleted, settled(t, rt, behind.ID).Status)
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// Submissions racing the reaper all run, each once, in order per queue,
// under the race detector. (Whether a retirement falls between a
// submission's lookup of its queue and its push is left to chance here;
// TestASubmissionToAQueueRetiredUnderItRuns makes it happen.)
func TestSubmissionsRacingTheReaperAllRun(t *testing.T) {
	rt := newRuntime(t, NewMemStore(), Config{})
	stop := make(chan struct{})
	reaped := make(chan struct{})
	go func() {
		defer close(reaped)
		for {
			select {
			case <-stop:
				return
			default:
				rt.reapQueues(ctx)
				runtime.Gosched()
			}
		}
	}()
	const queues, each = 4, 200
	var subs []Submission
	ran := make([][]int, queues) // each queue's items, in the order they ran: written by its processor only
	for i := range each {
		for q := range queues {
			sub, err := rt.SubmitSequential(ctx, "q"+strconv.Itoa(q), strconv.Itoa(q)+"-"+strconv.Itoa(i), func(context.Context, *Task) (any, error) {
				ran[q] = append(ran[q], i)
				return nil, nil
			}, alice)
			require.NoError(t, err)
			subs = append(subs, sub)
		}
	}
	for _, sub := range subs {
		assert.Equal(t, StatusCompleted, settled(t, rt, sub.ID).Status)
	}
	close(stop)
	<-reaped
	for q := range queues {
		assert.True(t, slices.IsSorted(ran[q]), "queue %d ran its items in order", q)
		assert.Len(t, ran[q], each)
	}
}

// A submission that looked its queue up just before the reaper retired
// it goes to the queue that succeeds it, and runs.
func TestASubmissionToAQueueRetiredUnderItRuns(t *testing.T) {
	rt := newRuntime(t, NewMemStore(), Config{})
	first, err := rt.SubmitSequential(ctx, "q", "first", noop, alice)
	require.NoError(t, err)
	settled(t, rt, first.ID)
	var once sync.Once
	rt.hooks.Store(&hooks{enqueue: func() {
		once.Do(func() {
			rt.reapQueues(ctx) // empty: marked idle
			rt.reapQueues(ctx) // still: retired
		})
	}})
	second, err := rt.SubmitSequential(ctx, "q", "second", noop, alice)
	require.NoError(t, err)
	assert.Equal(t, StatusCompleted, settled(t, rt, second.ID).Status)
	st, err := rt.Stats(ctx, System)
	require.NoError(t, err)
	require.Len(t, st.Queues, 1, "the queue that succeeds it")
}

// reapQueues returns once the processors of the queues it retired have
// ended, so that Shutdown, which waits for its loops, leaves none of
// them running. With one processor for Go to run goroutines on, a
// processor that reapQueues only woke has not run when it returns.
func TestRetiredQueuesProcessorsEndBeforeTheReapReturns(t *testing.T) {
	rt := newRuntime(t, NewMemStore(), Config{})
	sub, err := rt.SubmitSequential(ctx, "q", "k", noop, alice)
	require.NoError(t, err)
	settled(t, rt, sub.ID)
	rt.mu.RLock()
	q := rt.queues["q"]
	rt.mu.RUnlock()
	require.NotNil(t, q)

	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	rt.reapQueues(ctx) // empty: marked idle
	rt.reapQueues(ctx) // still: retired
	select {
	case <-q.exited:
	default:
		t.Error("reapQueues returned before the retired queue's processor ended")
	}
}

// useQueuesOneAfterAnother submits one task to each of n queues in turn,
// each once the one before settled, and fails t if the goroutines then
// exceed those counted before by more than queuesKept idle processors
// and two (the loops' own). It runs in a synctest bubble.
func useQueuesOneAfterAnother(t *testing.T, rt *Runtime[*MemStore], n, before int) {
	t.Helper()
	for i := range n {
		sub, err := rt.SubmitSequential(ctx, "q-"+strconv.Itoa(i), "k", noop, alice)
		require.NoError(t, err)
		settled(t, rt, sub.ID)
	}
	synctest.Wait()
	assert.LessOrEqual(t, runtime.NumGoroutine(), before+queuesKept+2, "goroutines held after %d queues used one after another", n)
}

// A submitter that uses queue after queue, each briefly (here under
// Limits of one), holds no more than queuesKept idle processors: a new
// queue beyond them retires the empty ones at once, not at the reaper's
// pace. A busy queue is kept, and Shutdown waits for the processors of
// those retired so.
func TestQueuesUsedOneAfterAnotherHoldBoundedGoroutines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := NewRuntime(NewMemStore(), Config{Limits: Limits{
			MaxRunning: 2, MaxWaiting: 1, Owner: OwnerLimits{Running: 2, Waiting: 1},
		}})
		_, err := rt.Submit(ctx, "warm", noop, alice) // the loops the first submission starts
		require.NoError(t, err)
		synctest.Wait()
		before := runtime.NumGoroutine()
		busy := newGate()
		_, err = rt.SubmitSequential(ctx, "busy", "head", busy.fn, alice)
		require.NoError(t, err)
		<-busy.started
		useQueuesOneAfterAnother(t, rt, 4*queuesKept, before)
		st, err := rt.Stats(ctx, System)
		require.NoError(t, err)
		assert.True(t, slices.ContainsFunc(st.Queues, func(q QueueLoad) bool { return q.Name == "busy" }), "the busy queue is kept")
		busy.open()
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// The bound holds after a busy spell too: once 300 queues busy at once
// have drained, and the reaper has retired them, queue names used one
// after another again hold no more than about queuesKept idle
// processors.
func TestQueuesUsedOneAfterAnotherAfterABusySpellHoldBoundedGoroutines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := NewRuntime(NewMemStore(), Config{})
		_, err := rt.Submit(ctx, "warm", noop, alice) // the loops the first submission starts
		require.NoError(t, err)
		synctest.Wait()
		before := runtime.NumGoroutine()
		const busyQueues = 300
		gates := make([]*gate, busyQueues)
		subs := make([]Submission, busyQueues)
		for i := range busyQueues {
			gates[i] = newGate()
			subs[i], err = rt.SubmitSequential(ctx, "busy-"+strconv.Itoa(i), "busy-"+strconv.Itoa(i), gates[i].fn, alice)
			require.NoError(t, err)
			<-gates[i].started
		}
		for i := range busyQueues {
			gates[i].open()
			settled(t, rt, subs[i].ID)
		}
		time.Sleep(2*queueReapInterval + time.Second) // the reaper retires them all
		synctest.Wait()
		st, err := rt.Stats(ctx, System)
		require.NoError(t, err)
		require.Empty(t, st.Queues, "every queue retired by the reaper")

		useQueuesOneAfterAnother(t, rt, 400, before)
		require.NoError(t, rt.Shutdown(ctx))
	})
}
