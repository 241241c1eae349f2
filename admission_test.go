package workers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// time.Sleep in this file appears only inside synctest bubbles, where it
// advances the fake clock: it stands for work a callback does, or lets
// timeouts expire, and never waits for a condition.

// highWater counts callbacks executing now and the most ever at once.
type highWater struct{ now, max atomic.Int64 }

func (h *highWater) enter() {
	n := h.now.Add(1)
	for m := h.max.Load(); n > m && !h.max.CompareAndSwap(m, n); m = h.max.Load() {
	}
}

func (h *highWater) leave() { h.now.Add(-1) }

func TestLimitsBoundRunningAndEveryTaskCompletes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const owners, each = 10, 1000
		rt := newRuntime(t, NewMemStore(), Config{Limits: Limits{MaxRunning: 8, Owner: OwnerLimits{Running: 2}}})
		var all highWater
		per := make([]highWater, owners)
		var done atomic.Int64
		allDone := make(chan struct{})
		var wg sync.WaitGroup
		for o := range owners {
			owner := MustOwner(fmt.Sprint("owner-", o))
			fn := func(context.Context, *Task) (any, error) {
				all.enter()
				per[o].enter()
				time.Sleep(time.Millisecond) // the work
				per[o].leave()
				all.leave()
				if done.Add(1) == owners*each {
					close(allDone)
				}
				return nil, nil
			}
			wg.Go(func() {
				for i := range each {
					if _, err := rt.Submit(ctx, strconv.Itoa(i), fn, owner); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		<-allDone       // the bubble's clock runs the work meanwhile
		synctest.Wait() // and the last outcomes are written
		assert.LessOrEqual(t, all.max.Load(), int64(8), "callbacks executing at once")
		assert.Equal(t, int64(8), all.max.Load(), "the cap is reached: the test saturates it")
		for o := range per {
			assert.LessOrEqual(t, per[o].max.Load(), int64(2), "owner %d's callbacks executing at once", o)
		}
		snaps, err := rt.List(ctx, System, WithStatus(StatusCompleted))
		require.NoError(t, err)
		assert.Len(t, snaps, owners*each, "every task completes")
		st, err := rt.Stats(ctx, System)
		require.NoError(t, err)
		assert.Zero(t, st.Running)
		assert.Zero(t, st.Waiting)
		assert.Empty(t, st.Owners, "idle owners are forgotten")
	})
}

func TestWaitingTasksHoldNoGoroutine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newRuntime(t, NewMemStore(), Config{Limits: Limits{MaxRunning: 8}})
		before := runtime.NumGoroutine()
		release := make(chan struct{})
		var ran atomic.Int64
		fn := func(context.Context, *Task) (any, error) { <-release; ran.Add(1); return nil, nil }
		const n = 20000
		for i := range n {
			_, err := rt.Submit(ctx, strconv.Itoa(i), fn, alice)
			require.NoError(t, err)
		}
		synctest.Wait()
		// 8 running callbacks, and the loops the first submission starts
		// over a MemStore (lease renewal, the notice listener and its
		// checker, the sync loop), with room for two more.
		assert.LessOrEqual(t, runtime.NumGoroutine(), before+8+4+2, "goroutines with 20,000 submitted and 8 running")
		st, err := rt.Stats(ctx, System)
		require.NoError(t, err)
		assert.Equal(t, 8, st.Running)
		assert.Equal(t, n-8, st.Waiting)
		close(release)
		synctest.Wait()
		assert.EqualValues(t, n, ran.Load())
	})
}

func TestFairDispatchAcrossOwners(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const limit = 8
		rt := newRuntime(t, NewMemStore(), Config{Limits: Limits{MaxRunning: limit}})
		var mu sync.Mutex
		var started []string
		allDone := make(chan struct{})
		fn := func(_ context.Context, tk *Task) (any, error) {
			mu.Lock()
			started = append(started, tk.ID())
			if len(started) == 1002 {
				defer close(allDone)
			}
			mu.Unlock()
			time.Sleep(time.Millisecond)
			return nil, nil
		}
		for i := range 1000 {
			_, err := rt.Submit(ctx, strconv.Itoa(i), fn, alice)
			require.NoError(t, err)
		}
		synctest.Wait()
		b, err := rt.Submit(ctx, "first", fn, bob)
		require.NoError(t, err)
		sys, err := rt.Submit(ctx, "sys", fn, System)
		require.NoError(t, err)
		<-allDone       // the last has started; the bubble's clock runs the work
		synctest.Wait() // and every callback has returned
		st, err := rt.Stats(ctx, System)
		require.NoError(t, err)
		require.Zero(t, st.Running+st.Waiting, "every task ran")
		require.Len(t, started, 1002)
		// Three owners wait (alice, bob, System): one round is three
		// dispatches, and it begins with the first of the next limit
		// completions. Callbacks dispatched at one instant begin in any
		// order, so the bound is that batch: within limit completions.
		for _, id := range []string{b.ID, sys.ID} {
			at := slices.Index(started, id)
			assert.Less(t, at, 2*limit, "%s started as task %d: alice's backlog delayed it past the cap's number of completions", id, at+1)
		}
	})
}

func TestTimeoutHoldsTheSlotUntilTheCallbackReturns(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limits Limits
	}{
		{"runtime cap", Limits{MaxRunning: 1}},
		{"owner cap", Limits{Owner: OwnerLimits{Running: 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rt := newRuntime(t, NewMemStore(), Config{Limits: tc.limits})
				release := make(chan struct{})
				stuck, err := rt.Submit(ctx, "stuck", func(context.Context, *Task) (any, error) {
					<-release // ignores its context
					return nil, nil
				}, alice, WithTimeout(time.Minute))
				require.NoError(t, err)
				var nextRan atomic.Bool
				next, err := rt.Submit(ctx, "next", func(context.Context, *Task) (any, error) {
					nextRan.Store(true)
					return nil, nil
				}, alice)
				require.NoError(t, err)

				time.Sleep(time.Hour)
				synctest.Wait()
				snap := mustStatus(t, rt, stuck.ID)
				assert.Equal(t, StatusFailed, snap.Status, "the record says timed out at once")
				assert.ErrorIs(t, snap.Err(), ErrTimeout)
				assert.Equal(t, StatusPending, mustStatus(t, rt, next.ID).Status)
				assert.False(t, nextRan.Load(), "a task took the slot of a timed-out callback that still runs")
				st, err := rt.Stats(ctx, System)
				require.NoError(t, err)
				assert.Equal(t, 1, st.Running)
				assert.Equal(t, []OwnerLoad{{Owner: "alice", Running: 1, Waiting: 1}}, st.Owners)

				close(release)
				synctest.Wait()
				assert.Equal(t, StatusCompleted, mustStatus(t, rt, next.ID).Status, "the slot frees when the callback returns")
			})
		})
	}
}

func TestQuotaRefusalWritesNothingAndJoinsAreFree(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewMemStore()
		rt := newRuntime(t, s, Config{Limits: Limits{Owner: OwnerLimits{Running: 1, Waiting: 2}}})
		head := newGate()
		hs, err := rt.Submit(ctx, "head", head.fn, alice)
		require.NoError(t, err)
		w1, err := rt.Submit(ctx, "w1", noop, alice)
		require.NoError(t, err)
		_, err = rt.SubmitSequential(ctx, "q", "w2", noop, alice)
		require.NoError(t, err)
		synctest.Wait()

		_, err = rt.Submit(ctx, "over", noop, alice)
		require.ErrorIs(t, err, ErrQuotaExceeded)
		var qe *QuotaError
		require.ErrorAs(t, err, &qe)
		assert.Equal(t, "alice", qe.Owner)
		assert.Equal(t, QuotaOwnerWaiting, qe.Limit)
		assert.Equal(t, 2, qe.Max)
		assert.Equal(t, 2, qe.Current)
		assert.GreaterOrEqual(t, qe.RetryAfter(), time.Second)
		_, err = s.GetTask(ctx, "alice::over")
		assert.ErrorIs(t, err, ErrNotFound, "a refused submission writes nothing")

		for _, sub := range []Submission{hs, w1} {
			j, err := rt.Submit(ctx, sub.ID[len("alice::"):], noop, alice)
			require.NoError(t, err, "a join at the cap costs no quota")
			assert.True(t, j.Joined)
			assert.Equal(t, sub.RunID, j.RunID)
		}
		_, err = rt.Submit(ctx, "bobs", noop, bob)
		require.NoError(t, err, "another owner is not refused for alice's load")
		synctest.Wait()

		st, err := rt.Stats(ctx, System)
		require.NoError(t, err)
		assert.Equal(t, []OwnerLoad{{Owner: "alice", Running: 1, Waiting: 2}}, st.Owners, "joins took no place; bob's task ran")
		head.open()
	})
}

func TestOwnerLimitsHook(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewMemStore()
		down := errors.New("billing down")
		rt := newRuntime(t, s, Config{Limits: Limits{OwnerLimits: func(_ context.Context, o Owner) (OwnerLimits, error) {
			switch o.ID() {
			case "alice":
				return OwnerLimits{Running: 1, Waiting: 1}, nil
			case "carol":
				return OwnerLimits{}, down
			case "dave":
				return OwnerLimits{Waiting: -1}, nil // a bug of the hook's, not "no cap"
			}
			return OwnerLimits{Running: 1, Waiting: 3}, nil
		}}})
		g := newGate()
		for i := range 4 {
			_, err := rt.Submit(ctx, strconv.Itoa(i), g.fn, bob)
			require.NoError(t, err, "bob's tier lets 1 run and 3 wait")
		}
		_, err := rt.Submit(ctx, "a0", g.fn, alice)
		require.NoError(t, err)
		_, err = rt.Submit(ctx, "a1", g.fn, alice)
		require.NoError(t, err)
		_, err = rt.Submit(ctx, "a2", g.fn, alice)
		require.ErrorIs(t, err, ErrQuotaExceeded, "alice's tier lets 1 wait")
		_, err = rt.Submit(ctx, "c", g.fn, carol)
		require.ErrorIs(t, err, down, "the hook's error refuses the submission")
		_, err = s.GetTask(ctx, "carol::c")
		assert.ErrorIs(t, err, ErrNotFound)
		_, err = rt.Submit(ctx, "d", g.fn, MustOwner("dave"))
		require.ErrorIs(t, err, ErrInvalidConfig, "a negative cap from the hook refuses the submission")
		require.NotErrorIs(t, err, ErrInvalidOption, "the hook's answer is no mistake of the caller's")
		_, err = s.GetTask(ctx, "dave::d")
		assert.ErrorIs(t, err, ErrNotFound)
		_, err = rt.Submit(ctx, "sys", noop, System)
		require.NoError(t, err, "System is under no owner limits")
		g.open()
	})
}

func TestWaitingTaskIsPendingVisibleAndCancellable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newRuntime(t, NewMemStore(), Config{Limits: Limits{MaxRunning: 1}})
		head := newGate()
		_, err := rt.Submit(ctx, "head", head.fn, alice)
		require.NoError(t, err)
		var ran atomic.Bool
		w, err := rt.Submit(ctx, "waiting", func(context.Context, *Task) (any, error) {
			ran.Store(true)
			return nil, nil
		}, alice, WithWatchers(bob))
		require.NoError(t, err)
		synctest.Wait()

		snap, err := rt.Status(ctx, w.ID, bob)
		require.NoError(t, err, "a watcher sees the waiting task")
		assert.Equal(t, StatusPending, snap.Status)
		_, err = rt.Status(ctx, w.ID, carol)
		assert.ErrorIs(t, err, ErrNotFound)

		require.NoError(t, rt.Cancel(ctx, w.ID, bob))
		assert.Equal(t, StatusCancelled, mustStatus(t, rt, w.ID).Status)
		head.open()
		synctest.Wait()
		assert.False(t, ran.Load(), "a cancelled waiting task never starts")
		snap = mustStatus(t, rt, w.ID)
		assert.Equal(t, StatusCancelled, snap.Status)
		assert.True(t, snap.StartedAt.IsZero())
		st, err := rt.Stats(ctx, System)
		require.NoError(t, err)
		assert.Zero(t, st.Waiting+st.Running)
	})
}

func TestShutdownCancelsWaitingTasks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := NewRuntime(NewMemStore(), Config{Limits: Limits{MaxRunning: 1}, ShutdownGrace: time.Minute})
		hs, err := rt.Submit(ctx, "head", func(context.Context, *Task) (any, error) {
			time.Sleep(time.Second) // finishes within the grace period
			return "head", nil
		}, alice)
		require.NoError(t, err)
		var ran atomic.Int64
		fn := func(context.Context, *Task) (any, error) { ran.Add(1); return nil, nil }
		var subs []Submission
		for _, k := range []string{"a", "b"} {
			sub, err := rt.Submit(ctx, k, fn, bob)
			require.NoError(t, err)
			subs = append(subs, sub)
		}
		for _, k := range []string{"s1", "s2"} {
			sub, err := rt.SubmitSequential(ctx, "q", k, fn, carol)
			require.NoError(t, err)
			subs = append(subs, sub)
		}
		synctest.Wait()
		sctx, cancel := context.WithTimeout(ctx, time.Hour)
		defer cancel()
		require.NoError(t, rt.Shutdown(sctx))
		assert.Zero(t, ran.Load(), "no waiting task started during the shutdown, though the head's slot freed")
		for _, sub := range subs {
			snap := mustStatus(t, rt, sub.ID)
			assert.Equal(t, StatusCancelled, snap.Status, sub.ID)
			assert.Equal(t, CauseShutdown, snap.Cause, sub.ID)
			assert.ErrorIs(t, snap.Err(), ErrShutdown)
		}
		assert.Equal(t, StatusCompleted, mustStatus(t, rt, hs.ID).Status, "the head ran on within the grace period")
	})
}

func TestQueueConcurrencyKeepsStartOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewMemStore()
		rt := newRuntime(t, s, Config{Limits: Limits{QueueConcurrency: 3}})
		var hw highWater
		ids := make([]string, 30)
		var finished atomic.Int32
		allDone := make(chan struct{}) // closed by the last callback
		for i := range ids {
			sub, err := rt.SubmitSequential(ctx, "q", strconv.Itoa(i), func(context.Context, *Task) (any, error) {
				hw.enter()
				defer hw.leave()
				for _, id := range ids[:i] {
					if rec, err := s.GetTask(ctx, id); err != nil || rec.Status == StatusPending {
						t.Errorf("item %d started while %s was %s (%v)", i, id, rec.Status, err)
					}
				}
				time.Sleep(time.Duration(30-i) * time.Millisecond) // later items are shorter
				if finished.Add(1) == int32(len(ids)) {
					close(allDone)
				}
				return nil, nil
			}, alice)
			require.NoError(t, err)
			ids[i] = sub.ID
		}
		synctest.Wait()
		info, err := rt.QueueStatus(ctx, "q", System)
		require.NoError(t, err)
		assert.Equal(t, 3, info.RunningCount)
		assert.Equal(t, 27, info.PendingCount)
		<-allDone       // the bubble's clock runs the work meanwhile
		synctest.Wait() // and the last outcomes land
		assert.Equal(t, int64(3), hw.max.Load())
		for _, id := range ids {
			assert.Equal(t, StatusCompleted, mustStatus(t, rt, id).Status)
		}
	})
}

func TestStatsIsForSystemOnly(t *testing.T) {
	rt := newRuntime(t, NewMemStore(), Config{})
	_, err := rt.Stats(ctx, alice)
	assert.ErrorIs(t, err, ErrUnauthorized)
	_, err = rt.Stats(ctx, nil)
	assert.ErrorIs(t, err, ErrNoAuthority)
	st, err := rt.Stats(ctx, System)
	require.NoError(t, err)
	assert.Equal(t, Stats{}, st)
}

func TestLimitsValidatedAtStart(t *testing.T) {
	for _, l := range []Limits{{MaxRunning: -1}, {MaxWaiting: -1}, {QueueConcurrency: -1}, {Owner: OwnerLimits{Waiting: -1}}, {Owner: OwnerLimits{Weight: -1}}} {
		rt := NewRuntime(NewMemStore(), Config{Limits: l})
		assert.ErrorIs(t, rt.Start(ctx), ErrInvalidOption, "%+v", l)
		require.NoError(t, rt.Shutdown(ctx))
	}
}

func TestRuntimeWideWaitingCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewMemStore()
		rt := newRuntime(t, s, Config{Limits: Limits{MaxRunning: 1, MaxWaiting: 2}})
		g := newGate()
		for i, who := range []Owner{alice, bob, carol} {
			_, err := rt.Submit(ctx, strconv.Itoa(i), g.fn, who)
			require.NoError(t, err)
		}
		_, err := rt.Submit(ctx, "over", g.fn, MustOwner("dave"))
		var qe *QuotaError
		require.ErrorAs(t, err, &qe)
		assert.Equal(t, QuotaRuntimeWaiting, qe.Limit)
		_, err = s.GetTask(ctx, "dave::over")
		assert.ErrorIs(t, err, ErrNotFound)
		g.open()
	})
}

func TestSequentialItemWaitsForASlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newRuntime(t, NewMemStore(), Config{Limits: Limits{MaxRunning: 1}})
		head := newGate()
		_, err := rt.Submit(ctx, "head", head.fn, alice)
		require.NoError(t, err)
		var ran atomic.Bool
		item, err := rt.SubmitSequential(ctx, "q", "item", func(context.Context, *Task) (any, error) {
			ran.Store(true)
			return nil, nil
		}, bob)
		require.NoError(t, err)
		synctest.Wait()
		assert.False(t, ran.Load(), "the queue item started past the runtime cap")
		info, err := rt.QueueStatus(ctx, "q", bob)
		require.NoError(t, err)
		assert.Equal(t, []string{item.ID}, info.Pending, "an item waiting for a slot is pending")
		st, err := rt.Stats(ctx, System)
		require.NoError(t, err)
		assert.Equal(t, []QueueLoad{{Name: "q", Waiting: 1}}, st.Queues)
		assert.Equal(t, 1, st.Waiting)

		head.open()
		synctest.Wait()
		assert.Equal(t, StatusCompleted, mustStatus(t, rt, item.ID).Status)
	})
}

func TestResetEndsWaitingTasks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newRuntime(t, NewMemStore(), Config{Limits: Limits{MaxRunning: 1}})
		head := stubbornGate() // keeps its slot through the Reset
		_, err := rt.Submit(ctx, "head", head.fn, alice)
		require.NoError(t, err)
		var ran atomic.Bool
		_, err = rt.Submit(ctx, "waiting", func(context.Context, *Task) (any, error) {
			ran.Store(true)
			return nil, nil
		}, alice)
		require.NoError(t, err)
		synctest.Wait()
		require.NoError(t, rt.Reset(ctx))
		synctest.Wait()
		st, err := rt.Stats(ctx, System)
		require.NoError(t, err)
		assert.Equal(t, Stats{Running: 1, Owners: []OwnerLoad{{Owner: "alice", Running: 1}}}, st, "Reset ended the waiting task at once")
		head.open()
		synctest.Wait()
		assert.False(t, ran.Load(), "a waiting task started after Reset")
	})
}

func TestIdleOwnersAreBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newRuntime(t, NewMemStore(), Config{Limits: Limits{Owner: OwnerLimits{Running: 1}}})
		for i := range idleOwners + 500 {
			_, err := rt.Submit(ctx, "k", noop, MustOwner(fmt.Sprint("owner-", i)))
			require.NoError(t, err)
		}
		synctest.Wait()
		rt.adm.mu.Lock()
		n := len(rt.adm.owners)
		rt.adm.mu.Unlock()
		assert.LessOrEqual(t, n, idleOwners, "admission keeps at most idleOwners idle owners")
	})
}

// An owner who comes and goes keeps its entry while more than idleOwners
// others are busy: the bound is on idle entries, not on all of them.
func TestAnIdleOwnerKeepsItsEntryBesideManyBusyOnes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newRuntime(t, NewMemStore(), Config{Limits: Limits{Owner: OwnerLimits{Running: 1}}})
		g := newGate()
		for i := range idleOwners + 10 {
			_, err := rt.Submit(ctx, "k", g.fn, MustOwner(fmt.Sprint("owner-", i)))
			require.NoError(t, err)
		}
		entry := func() *ownerLoad {
			rt.adm.mu.Lock()
			defer rt.adm.mu.Unlock()
			return rt.adm.owners["carol"]
		}
		// idleCounted checks that admission counts as idle exactly the
		// entries with nothing running or waiting.
		idleCounted := func(when string) {
			rt.adm.mu.Lock()
			defer rt.adm.mu.Unlock()
			n := 0
			for _, o := range rt.adm.owners {
				if o.running == 0 && o.waiting == 0 && o.queued == 0 {
					n++
				}
			}
			require.Equal(t, n, rt.adm.idle, "idle entries %s", when)
		}
		var first *ownerLoad
		for i := range 3 {
			run := newGate()
			_, err := rt.Submit(ctx, strconv.Itoa(i), run.fn, carol)
			require.NoError(t, err)
			synctest.Wait()
			idleCounted("while carol's run runs")
			run.open()
			synctest.Wait()
			idleCounted("once it settled")
			o := entry()
			require.NotNil(t, o, "carol's entry went with her run")
			if first == nil {
				first = o
			}
			require.Same(t, first, o, "carol's entry was made anew")
		}
		g.open()
		synctest.Wait()
		rt.adm.mu.Lock()
		defer rt.adm.mu.Unlock()
		assert.Equal(t, idleOwners, rt.adm.idle)
		assert.Len(t, rt.adm.owners, idleOwners)
	})
}

func TestCancelFreesAQueueItemsWaitingPlaceAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newRuntime(t, NewMemStore(), Config{Limits: Limits{Owner: OwnerLimits{Waiting: 1}}})
		head := newGate()
		_, err := rt.SubmitSequential(ctx, "q", "head", head.fn, alice)
		require.NoError(t, err)
		synctest.Wait()
		var ran atomic.Int64
		fn := func(context.Context, *Task) (any, error) { ran.Add(1); return nil, nil }
		item, err := rt.SubmitSequential(ctx, "q", "item", fn, alice)
		require.NoError(t, err)
		_, err = rt.SubmitSequential(ctx, "q", "over", fn, alice)
		require.ErrorIs(t, err, ErrQuotaExceeded)

		require.NoError(t, rt.Cancel(ctx, item.ID, alice))
		next, err := rt.SubmitSequential(ctx, "q", "next", fn, alice)
		require.NoError(t, err, "the cancelled item's waiting place is free while the head still runs")
		head.open()
		synctest.Wait()
		assert.EqualValues(t, 1, ran.Load(), "only the next item ran")
		assert.Equal(t, StatusCompleted, mustStatus(t, rt, next.ID).Status)
		assert.Equal(t, StatusCancelled, mustStatus(t, rt, item.ID).Status)
		st, err := rt.Stats(ctx, System)
		require.NoError(t, err)
		assert.Zero(t, st.Running+st.Waiting)
	})
}

// A runtime that loses its lease records its waiting tasks abandoned at
// once, though the callbacks holding the slots ignore their context.
func TestLostLeaseEndsWaitingTasksAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, lapsed := lapsing()
		rt := NewRuntime(s, Config{LeaseInterval: time.Second, Limits: Limits{MaxRunning: 1}})
		head := stubbornGate()
		_, err := rt.Submit(ctx, "head", head.fn, alice)
		require.NoError(t, err)
		var ran atomic.Bool
		w, err := rt.Submit(ctx, "waiting", func(context.Context, *Task) (any, error) {
			ran.Store(true)
			return nil, nil
		}, alice)
		require.NoError(t, err)
		lapsed.Store(true)
		time.Sleep(2 * time.Second) // a renewal or two: the lease is found lapsed
		synctest.Wait()
		snap := mustStatus(t, rt, w.ID)
		assert.Equal(t, CauseAbandoned, snap.Cause, "the waiting task is ended while the head still holds the slot")
		head.open()
		synctest.Wait()
		assert.False(t, ran.Load())
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// Cancels racing slot hand-offs leave the accounting exact: every task
// ends, the cancelled ones never run, and nothing stays counted.
func TestCancelsRacingDispatchKeepTheCountsExact(t *testing.T) {
	t.Parallel()
	rt := newRuntime(t, NewMemStore(), Config{Limits: Limits{MaxRunning: 2, Owner: OwnerLimits{Running: 1}}})
	const n = 400
	var ran sync.Map
	ids := make(chan string, n) // room for every id: a submitter never waits
	var submitters, canceller sync.WaitGroup
	for _, who := range []Owner{alice, bob} {
		submitters.Go(func() {
			for i := range n / 2 {
				queue := ""
				if i%3 == 0 {
					queue = "q-" + who.ID()
				}
				fn := func(_ context.Context, tk *Task) (any, error) { ran.Store(tk.ID(), true); return nil, nil }
				sub, err := submitOn(rt, queue, strconv.Itoa(i), fn, who)
				if err != nil {
					t.Error(err)
					return
				}
				ids <- sub.ID
			}
		})
	}
	cancelled := make(map[string]bool)
	canceller.Go(func() {
		k := 0
		for id := range ids {
			if k++; k%2 == 0 {
				if err := rt.Cancel(ctx, id, System); err == nil {
					cancelled[id] = true
				} else if !errors.Is(err, ErrFinished) {
					t.Error(err)
				}
			}
		}
	})
	// Once the submitters have sent every id, the canceller ends with
	// the last; every task must then end and the counts drain.
	submitters.Wait()
	close(ids)
	canceller.Wait()
	eventually(t, func() bool {
		st, err := rt.Stats(ctx, System)
		require.NoError(t, err)
		snaps, err := rt.List(ctx, System)
		require.NoError(t, err)
		return len(snaps) == n && st.Running+st.Waiting == 0
	}, "every task to end and the counts to drain")
	snaps, err := rt.List(ctx, System)
	require.NoError(t, err)
	for _, s := range snaps {
		require.True(t, s.Status.Terminal(), "%s is %s", s.ID, s.Status)
		if cancelled[s.ID] {
			assert.Equal(t, StatusCancelled, s.Status)
			_, started := ran.Load(s.ID)
			assert.False(t, started && s.StartedAt.IsZero(), "%s ran without a start", s.ID)
		}
	}
	rt.adm.mu.Lock()
	defer rt.adm.mu.Unlock()
	assert.Zero(t, rt.adm.running)
	assert.Zero(t, rt.adm.waiting)
	for id, o := range rt.adm.owners {
		assert.Zero(t, o.running, id)
		assert.Zero(t, o.waiting, id)
		assert.Empty(t, o.fifo, id)
		assert.Zero(t, o.queued, id)
		assert.False(t, o.inRing, id)
	}
	assert.Nil(t, rt.adm.ring)
}

func TestWeightsShareSaturatedDispatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newRuntime(t, NewMemStore(), Config{Limits: Limits{MaxRunning: 1,
			OwnerLimits: func(_ context.Context, o Owner) (OwnerLimits, error) {
				if o == alice {
					return OwnerLimits{Weight: 3}, nil
				}
				return OwnerLimits{}, nil
			}}})
		var mu sync.Mutex
		var order []byte
		fn := func(_ context.Context, tk *Task) (any, error) {
			mu.Lock()
			order = append(order, tk.ID()[0])
			mu.Unlock()
			time.Sleep(time.Millisecond)
			return nil, nil
		}
		for _, who := range []Owner{alice, bob} {
			for i := range 30 {
				_, err := rt.Submit(ctx, strconv.Itoa(i), fn, who)
				require.NoError(t, err)
			}
		}
		time.Sleep(time.Second)
		synctest.Wait()
		require.Len(t, order, 60)
		assert.Equal(t, "a"+"aaab"+"aaab"+"aaab"+"aaab", string(order[:17]), "alice starts three tasks per turn, bob one")
	})
}

// A waiting run, for the tests of remote cancels: alice's task behind
// her head, which holds what it waits for.
type waiting struct {
	name   string
	limits Limits // the runtime's: alice may have one task waiting
	queue  string // the queue both go in, or "" for a task waiting for a slot
	stream bool   // a Subscribe, never ranged, follows the runtime's tasks
}

var waitings = []waiting{
	{name: "queue item", limits: Limits{Owner: OwnerLimits{Waiting: 1}}, queue: "q"},
	// A stream makes a run's live state at its submission, before it
	// begins.
	{name: "queue item followed by a stream", limits: Limits{Owner: OwnerLimits{Waiting: 1}}, queue: "q", stream: true},
	{name: "task waiting for a slot", limits: Limits{MaxRunning: 1, Owner: OwnerLimits{Waiting: 1}}},
}

// behindAHead returns a runtime over s, and another over mem, the
// MemStore under s, which here hears through its notices. Alice's head
// runs on here, and her task behind waits for it as w says; ran is
// closed if that task ever runs.
func (w waiting) behindAHead(t *testing.T, s Store, mem *MemStore) (here *Runtime[Store], there *Runtime[*MemStore], head *gate, behind Submission, ran chan struct{}) {
	t.Helper()
	here = newRuntime(t, s, Config{Limits: w.limits})
	resynced := make(chan struct{})
	var once sync.Once
	here.hooks.Store(&hooks{resynced: func() { once.Do(func() { close(resynced) }) }})
	there = newRuntime(t, mem, Config{})
	if w.stream {
		sctx, cancel := context.WithCancel(ctx)
		t.Cleanup(cancel)
		_ = here.Subscribe(sctx, System)
	}
	head = newGate()
	_, err := submitOn(here, w.queue, "head", head.fn, alice)
	require.NoError(t, err)
	wait(t, head.started, "the head to start")
	ran = make(chan struct{})
	behind, err = submitOn(here, w.queue, "behind", func(context.Context, *Task) (any, error) {
		close(ran)
		return nil, nil
	}, alice)
	require.NoError(t, err)
	listening(t, mem, 1) // here hears the other runtime's writes
	wait(t, resynced, "the check that follows the listener's first resync")
	return here, there, head, behind, ran
}

// endedWithoutRunning checks that third, submitted in the place the
// cancelled task behind gave back, completed, and that behind ended
// CANCELLED without running (ran is closed if it ran).
func endedWithoutRunning(t *testing.T, here *Runtime[Store], third, behind Submission, ran chan struct{}) {
	t.Helper()
	assert.Equal(t, StatusCompleted, settled(t, here, third.ID).Status)
	assert.Equal(t, StatusCancelled, mustStatus(t, here, behind.ID).Status)
	select {
	case <-ran:
		t.Fatal("the cancelled task ran")
	default:
	}
}

// A queue item, or a task waiting for a slot, cancelled through another
// runtime frees its owner's waiting quota here as soon as the notice
// comes, as a local Cancel does, not when its turn comes.
func TestRemoteCancelOfAWaitingRunFreesItsQuota(t *testing.T) {
	for _, w := range waitings {
		t.Run(w.name, func(t *testing.T) {
			s := NewMemStore()
			here, there, head, behind, ran := w.behindAHead(t, s, s)
			_, err := submitOn(here, w.queue, "third", noop, alice)
			require.ErrorIs(t, err, ErrQuotaExceeded, "alice's one waiting place is taken")

			require.NoError(t, there.Cancel(ctx, behind.ID, alice))
			var third Submission
			eventually(t, func() bool {
				third, err = submitOn(here, w.queue, "third", noop, alice)
				if err != nil {
					require.ErrorIs(t, err, ErrQuotaExceeded)
				}
				return err == nil
			}, "the cancelled task to free alice's waiting place")
			head.open()
			endedWithoutRunning(t, here, third, behind, ran)
		})
	}
}

// failingRead is a MemStore whose next GetTask of the task id armed
// names fails, as a dropped connection would; failed is closed when it
// has.
type failingRead struct {
	*MemStore
	armed  atomic.Pointer[string]
	failed chan struct{}
}

func (s *failingRead) GetTask(ctx context.Context, id string) (Record, error) {
	if p := s.armed.Load(); p != nil && *p == id && s.armed.CompareAndSwap(p, nil) {
		close(s.failed)
		return Record{}, errors.New("connection reset by peer")
	}
	return s.MemStore.GetTask(ctx, id)
}

// When the read that checks a waiting task after a remote cancel fails,
// the task keeps its place and quota until its turn, and then ends
// without running: the cancel stands.
func TestRemoteCancelOfAWaitingRunWhoseCheckFails(t *testing.T) {
	for _, w := range waitings {
		t.Run(w.name, func(t *testing.T) {
			s := &failingRead{MemStore: NewMemStore(), failed: make(chan struct{})}
			here, there, head, behind, ran := w.behindAHead(t, s, s.MemStore)

			s.armed.Store(&behind.ID)
			require.NoError(t, there.Cancel(ctx, behind.ID, alice))
			wait(t, s.failed, "the check's read to fail")
			_, err := submitOn(here, w.queue, "third", noop, alice)
			require.ErrorIs(t, err, ErrQuotaExceeded, "unchecked, the task holds its place")

			head.open()
			var third Submission
			eventually(t, func() bool {
				third, err = submitOn(here, w.queue, "third", noop, alice)
				return err == nil
			}, "the task to end at its turn")
			endedWithoutRunning(t, here, third, behind, ran)
		})
	}
}

// A refusal at the runtime's waiting cap hints at the time that waiting
// takes to drain through every running slot, not through the refused
// owner's own.
func TestRuntimeWaitingRefusalHintsAtTheRuntimesPace(t *testing.T) {
	a := newAdmission(Limits{MaxRunning: 8, MaxWaiting: 16, Owner: OwnerLimits{Running: 1}}, func(*Task) {})
	a.avg, a.running, a.waiting = 10*time.Second, 8, 16
	r, err := a.reserve(ctx, caller{userID: "carol"}, false)
	require.NotNil(t, r)
	var qe *QuotaError
	require.ErrorAs(t, err, &qe)
	assert.Equal(t, QuotaRuntimeWaiting, qe.Limit)
	assert.Equal(t, 30*time.Second, qe.RetryAfter(), "16 waiting through 8 slots at 10s each, and this one")
}

// Items cancelled while they wait in a sequential queue leave it in
// batches, not only at their turn: under Limits each cancel gives its
// waiting place back at once, so a tenant that submits and cancels over
// and over behind a long-running head would otherwise grow the queue,
// and the runs held, without bound.
func TestCancelledQueueItemsDoNotPileUpBehindALongHead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newRuntime(t, NewMemStore(), Config{Limits: Limits{MaxWaiting: 1, Owner: OwnerLimits{Waiting: 1}}})
		head := newGate()
		_, err := rt.SubmitSequential(ctx, "q", "head", head.fn, alice)
		require.NoError(t, err)
		synctest.Wait()
		const n = 5000
		for i := range n {
			sub, err := rt.SubmitSequential(ctx, "q", strconv.Itoa(i), noop, alice)
			require.NoError(t, err, "the cancelled items' places were given back")
			require.NoError(t, rt.Cancel(ctx, sub.ID, alice))
		}
		synctest.Wait() // the dropped items end
		st, err := rt.Stats(ctx, System)
		require.NoError(t, err)
		assert.Less(t, st.Queues[0].Waiting, queueDropMin, "items the queue still holds")
		assert.Less(t, rt.runs.len(), queueDropMin+1, "runs held")
		rec, err := rt.Store().GetTask(ctx, "alice::0")
		require.NoError(t, err)
		assert.Equal(t, StatusCancelled, rec.Status)
		close(head.release)
		synctest.Wait()
		st, err = rt.Stats(ctx, System)
		require.NoError(t, err)
		assert.Zero(t, st.Queues[0].Waiting+st.Running)
	})
}

// hangingWrites is a lapsing store whose run writes, once hang is set,
// wait until their context ends.
type hangingWrites struct {
	*renewing
	hang atomic.Bool
}

func (s *hangingWrites) TransitionTask(ctx context.Context, id, runID string, from []Status, next State) (bool, error) {
	if s.hang.Load() {
		<-ctx.Done()
		return false, ctx.Err()
	}
	return s.renewing.TransitionTask(ctx, id, runID, from, next)
}

// A lost lease ends the tasks waiting for a slot through a bounded
// number of goroutines, not one each: its writes go to a store that is
// likely out of reach, where each may wait long.
func TestLostLeaseEndsWaitingTasksThroughBoundedGoroutines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inner, lapsed := lapsing()
		s := &hangingWrites{renewing: inner}
		rt := NewRuntime(s, Config{LeaseInterval: time.Second, Logger: slog.New(slog.DiscardHandler), Limits: Limits{MaxRunning: 1}})
		head := stubbornGate()
		_, err := rt.Submit(ctx, "head", head.fn, alice)
		require.NoError(t, err)
		const n = 500
		for i := range n {
			_, err := rt.Submit(ctx, strconv.Itoa(i), noop, alice)
			require.NoError(t, err)
		}
		synctest.Wait()
		before := runtime.NumGoroutine()
		s.hang.Store(true)
		lapsed.Store(true)
		time.Sleep(2 * time.Second) // a renewal or two: the lease is found lapsed
		synctest.Wait()
		assert.LessOrEqual(t, runtime.NumGoroutine()-before, abandonWriters+4, "goroutines ending the %d waiting tasks", n)
		s.hang.Store(false)
		head.open()
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// Without MaxRunning, a refusal at the runtime's waiting cap hints at the
// time its waiting takes to drain through the slots running now.
func TestRuntimeWaitingRefusalWithoutMaxRunningHintsAtTheRunningSlots(t *testing.T) {
	a := newAdmission(Limits{MaxWaiting: 100, Owner: OwnerLimits{Running: 10}}, func(*Task) {})
	a.avg, a.waiting, a.running = time.Second, 100, 10
	a.owners["carol"] = &ownerLoad{id: "carol", running: 10}
	_, err := a.reserve(ctx, caller{userID: "carol"}, false)
	var qe *QuotaError
	require.ErrorAs(t, err, &qe)
	assert.Equal(t, QuotaRuntimeWaiting, qe.Limit)
	assert.Equal(t, 11*time.Second, qe.RetryAfter(), "100 waiting through the 10 running slots at 1s each, and this one")
}

// heldInsert is a store whose InsertTask of the task id holds until
// release is closed; entered is closed when it begins.
type heldInsert struct {
	Store
	id               string
	entered, release chan struct{}
}

func (s *heldInsert) InsertTask(ctx context.Context, rec Record) error {
	if rec.ID == s.id {
		close(s.entered)
		<-s.release
	}
	return s.Store.InsertTask(ctx, rec)
}

// Shutdown stops admission and the queues as it closes the intake, not
// once the submissions still registering are in: a task waiting for a
// slot, and a queue item, are recorded CANCELLED while Shutdown waits
// for a slow registration, and neither starts when the head's slot
// frees meanwhile.
func TestShutdownStopsWaitingTasksBeforeItWaitsForASubmission(t *testing.T) {
	s := &heldInsert{Store: NewMemStore(), id: "bob::slow", entered: make(chan struct{}), release: make(chan struct{})}
	rt := NewRuntime(s, Config{Limits: Limits{MaxRunning: 1}})
	head := newGate()
	_, err := rt.Submit(ctx, "head", head.fn, alice)
	require.NoError(t, err)
	wait(t, head.started, "the head to start")
	var ran atomic.Bool
	fn := func(context.Context, *Task) (any, error) { ran.Store(true); return nil, nil }
	waiting, err := rt.Submit(ctx, "waiting", fn, alice)
	require.NoError(t, err)
	item, err := rt.SubmitSequential(ctx, "q", "item", fn, alice)
	require.NoError(t, err)
	slow := make(chan error, 1)
	go func() {
		_, err := rt.Submit(ctx, "slow", noop, bob)
		slow <- err
	}()
	wait(t, s.entered, "the slow submission's insert")

	shut := make(chan error, 1)
	go func() { shut <- rt.Shutdown(ctx) }()
	for _, id := range []string{waiting.ID, item.ID} {
		eventually(t, func() bool {
			r, err := s.GetTask(ctx, id)
			require.NoError(t, err)
			return r.Status == StatusCancelled
		}, id+" recorded CANCELLED while Shutdown waits for the slow submission")
	}
	head.open()
	close(s.release)
	require.NoError(t, <-slow)
	require.NoError(t, <-shut)
	assert.False(t, ran.Load(), "a waiting task started during the shutdown")
	assert.Equal(t, CauseShutdown, mustStatus(t, rt, waiting.ID).Cause)
}

// requireOpen fails the test if ch is closed.
func requireOpen(t *testing.T, ch <-chan struct{}, msg string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatal(msg)
	default:
	}
}

// requireClosed fails the test unless ch is closed.
func requireClosed(t *testing.T, ch <-chan struct{}, msg string) {
	t.Helper()
	select {
	case <-ch:
	default:
		t.Fatal(msg)
	}
}

// An owner whose running cap the OwnerLimits hook raises gets its
// waiting tasks started by its next submission, even one that goes to
// wait in a busy queue, not only when one of its runs settles; a lowered
// cap keeps them waiting.
func TestARaisedOwnerCapStartsWaitingTasksAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var cap atomic.Int64
		cap.Store(1)
		rt := newRuntime(t, NewMemStore(), Config{Limits: Limits{OwnerLimits: func(_ context.Context, o Owner) (OwnerLimits, error) {
			if o != alice {
				return OwnerLimits{}, nil
			}
			return OwnerLimits{Running: int(cap.Load())}, nil
		}}})
		head, second, busy, item := newGate(), newGate(), newGate(), newGate()
		_, err := rt.Submit(ctx, "head", head.fn, alice)
		require.NoError(t, err)
		_, err = rt.Submit(ctx, "second", second.fn, alice)
		require.NoError(t, err)
		_, err = rt.SubmitSequential(ctx, "q", "busy", busy.fn, bob)
		require.NoError(t, err)
		synctest.Wait()
		requireOpen(t, second.started, "the second task started past alice's cap of 1")

		cap.Store(3)
		_, err = rt.SubmitSequential(ctx, "q", "item", item.fn, alice) // waits behind bob's
		require.NoError(t, err)
		synctest.Wait()
		requireClosed(t, second.started, "alice's cap went to 3 and her waiting task did not start")

		cap.Store(1)
		third := newGate()
		_, err = rt.Submit(ctx, "third", third.fn, alice)
		require.NoError(t, err)
		head.open()
		synctest.Wait()
		requireOpen(t, third.started, "alice's cap went back to 1 with 2 running, and her task started")
		second.open()
		synctest.Wait()
		requireClosed(t, third.started, "alice's runs settled and her waiting task did not start")
		third.open()
		busy.open()
		item.open()
	})
}

// A submission that joins a live run goes on when the OwnerLimits hook
// fails, as it does past a quota: a join takes nothing the limits guard.
// One that would start a new run is refused with the hook's error, or,
// should the hook panic, with its panic as an error.
func TestAJoinGoesOnWhenTheOwnerLimitsHookFails(t *testing.T) {
	for _, panics := range []bool{false, true} {
		t.Run(fmt.Sprint("panics=", panics), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				down := errors.New("billing down")
				var failing atomic.Bool
				s := NewMemStore()
				rt := newRuntime(t, s, Config{Limits: Limits{OwnerLimits: func(context.Context, Owner) (OwnerLimits, error) {
					switch {
					case !failing.Load():
						return OwnerLimits{Running: 1}, nil
					case panics:
						panic(down)
					}
					return OwnerLimits{}, down
				}}})
				refused := func(err error, msg string) {
					t.Helper()
					if panics {
						require.ErrorContains(t, err, `owner limits of "alice": the hook panicked: billing down`, msg)
					} else {
						require.ErrorIs(t, err, down, msg)
					}
				}
				g := newGate()
				first, err := rt.Submit(ctx, "k", g.fn, alice)
				require.NoError(t, err)
				synctest.Wait()

				failing.Store(true)
				joined, err := rt.Submit(ctx, "k", g.fn, alice)
				require.NoError(t, err, "a join takes no quota, so the hook's answer is not needed")
				assert.True(t, joined.Joined)
				assert.Equal(t, first.RunID, joined.RunID)
				_, err = rt.Submit(ctx, "other", g.fn, alice)
				refused(err, "a new run is refused")
				_, err = s.GetTask(ctx, "alice::other")
				require.ErrorIs(t, err, ErrNotFound, "a refused submission writes nothing")

				g.open()
				synctest.Wait()
				_, err = rt.Submit(ctx, "k", g.fn, alice)
				refused(err, "a finished key's new run is refused")
				st, err := rt.Stats(ctx, System)
				require.NoError(t, err)
				assert.Zero(t, st.Running+st.Waiting)
			})
		})
	}
}

// An answer of the OwnerLimits hook that comes back after one asked
// later is not applied: the later call saw the newer caps. Here the
// first call is slow and answers a cap of 1, the second answers 2 at
// once, and both of alice's tasks run.
func TestASlowOwnerLimitsAnswerDoesNotReplaceANewerOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		slow := make(chan struct{})
		var calls atomic.Int32
		rt := newRuntime(t, NewMemStore(), Config{Limits: Limits{OwnerLimits: func(context.Context, Owner) (OwnerLimits, error) {
			if calls.Add(1) == 1 {
				<-slow
				return OwnerLimits{Running: 1}, nil // what the caps were when asked
			}
			return OwnerLimits{Running: 2}, nil
		}}})
		first, second := newGate(), newGate()
		submitted := make(chan error, 1)
		go func() {
			_, err := rt.Submit(ctx, "first", first.fn, alice)
			submitted <- err
		}()
		synctest.Wait() // the first call waits for its answer
		_, err := rt.Submit(ctx, "second", second.fn, alice)
		require.NoError(t, err)
		synctest.Wait()
		requireClosed(t, second.started, "the second task did not start under a cap of 2")
		close(slow)
		require.NoError(t, <-submitted)
		synctest.Wait()
		requireClosed(t, first.started, "the slow answer's cap of 1 replaced the newer cap of 2")
		first.open()
		second.open()
	})
}

// Admission stops as Shutdown closes the intake, before it drains the
// queues: a slot freed while it works through them (here, stalled on one
// queue's lock) starts no waiting task, which is recorded CANCELLED with
// the backlog.
func TestShutdownStartsNoWaitingTaskWhileItDrainsTheQueues(t *testing.T) {
	rt := newRuntime(t, NewMemStore(), Config{Limits: Limits{MaxRunning: 1}})
	// A queue exists, idle.
	qs, err := rt.SubmitSequential(ctx, "q", "q-item", noop, alice)
	require.NoError(t, err)
	_, err = rt.Wait(ctx, qs.ID, alice)
	require.NoError(t, err)

	head := newGate()
	_, err = rt.Submit(ctx, "head", head.fn, alice)
	require.NoError(t, err)
	wait(t, head.started, "head to start")
	var ran atomic.Bool
	waiter, err := rt.Submit(ctx, "waiter", func(context.Context, *Task) (any, error) { ran.Store(true); return nil, nil }, bob)
	require.NoError(t, err)
	require.Equal(t, StatusPending, mustStatus(t, rt, waiter.ID).Status, "waits for the only slot")

	rt.mu.RLock()
	q := rt.queues["q"]
	rt.mu.RUnlock()
	q.mu.Lock() // Shutdown stalls in emptyQueues, after the intake closed
	shut := make(chan error, 1)
	go func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shut <- rt.Shutdown(c)
	}()
	eventually(t, rt.gate.isClosed, "the intake to close")
	headTask := head.task.Load()
	head.open()
	wait(t, headTask.doneChan(), "head to settle") // its slot frees
	q.mu.Unlock()
	require.NoError(t, <-shut)

	assert.False(t, ran.Load(), "a waiting task started after Shutdown closed the intake")
	assert.Equal(t, StatusCancelled, mustStatus(t, rt, waiter.ID).Status)
}

// A refusal's retry hint, the waiting ahead draining at the recent pace,
// stays between a second and five minutes however long the pace and the
// line, where their product used to overflow and read as a second.
func TestARefusalsRetryHintIsBoundedForAnyPaceAndLine(t *testing.T) {
	a := newAdmission(Limits{Owner: OwnerLimits{Waiting: 1}}, func(*Task) {})
	o := &ownerLoad{id: "alice"}
	for _, c := range []struct {
		avg            time.Duration
		current, lanes int
		want           time.Duration
	}{
		{0, 10, 1, time.Second},
		{100 * time.Millisecond, 0, 1, time.Second},
		{2 * time.Second, 9, 2, 10 * time.Second},
		{time.Hour, 3_000_000, 1, 5 * time.Minute},
		{time.Duration(math.MaxInt64 / 2), math.MaxInt32, 1, 5 * time.Minute},
		{time.Second, math.MaxInt, 0, 5 * time.Minute},
	} {
		a.avg = c.avg
		var qe *QuotaError
		require.ErrorAs(t, a.refusal(QuotaOwnerWaiting, 1, c.current, c.lanes, o), &qe)
		assert.Equal(t, c.want, qe.Retry, "pace %v, %d waiting over %d lanes", c.avg, c.current, c.lanes)
	}
}
