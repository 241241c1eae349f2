package workers_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/storetest"
)

// bothFaults are the two faults of a store call that answers with an
// error: before it reaches the store, and after it landed.
var bothFaults = []storetest.Fault{storetest.FailBefore, storetest.FailAfter}

// eachFault runs test once per fault of bothFaults, in a synctest bubble,
// as the subtest named prefix and the fault.
func eachFault(t *testing.T, prefix string, test func(t *testing.T, fault storetest.Fault)) {
	t.Helper()
	for _, fault := range bothFaults {
		t.Run(prefix+fault.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { test(t, fault) })
		})
	}
}

// A run that waited for a slot under Limits is registered PENDING and
// writes its start when the slot frees. That write fails once, before it
// lands or after: it is tried again, and the run completes once, its
// callback called once, on its first attempt.
func TestFaultTheStartOfARunThatWaitedForASlotFails(t *testing.T) {
	eachFault(t, "", func(t *testing.T, fault storetest.Fault) {
		rt, mem, f := faulty(workers.Config{Limits: workers.Limits{MaxRunning: 1}})
		head := newHeedless()
		_, err := rt.Submit(context.Background(), "head", head.fn, owner)
		require.NoError(t, err)
		<-head.started
		var calls atomic.Int32
		waiting, err := rt.Submit(context.Background(), "waiting", func(context.Context, *workers.Task) (any, error) {
			calls.Add(1)
			return "done", nil
		}, owner)
		require.NoError(t, err)
		synctest.Wait()
		endedAs(t, mem, waiting.ID, workers.StatusPending, workers.CauseNone)

		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Times: 1, Fault: fault, Match: func(c *storetest.Call) bool {
			return c.ID == waiting.ID && c.Next.Status == workers.StatusRunning
		}})
		close(head.release)
		snap, err := rt.Wait(context.Background(), waiting.ID, owner)
		require.NoError(t, err)
		assert.Equal(t, 1, f.Injected(storetest.OpTransitionTask), "the start failed once")
		assert.Equal(t, workers.StatusCompleted, snap.Status, "error %q", snap.Error)
		assert.Equal(t, 1, snap.Attempt)
		assert.Equal(t, int32(1), calls.Load())
		endedAs(t, mem, waiting.ID, workers.StatusCompleted, workers.CauseCompleted)
		require.NoError(t, rt.Shutdown(context.Background()))
	})
}

// A submission whose insert lands after Shutdown began has its run
// cancelled at once; the write of that end fails once, before it lands or
// after. It is tried again within Shutdown's bound: the record ends
// CANCELLED by the shutdown, and Shutdown reports everything settled.
func TestFaultTheEndOfARunRegisteredAsShutdownBeganFails(t *testing.T) {
	eachFault(t, "", func(t *testing.T, fault storetest.Fault) {
		rt, mem, f := faulty(workers.Config{})
		// Take the lease first, so the submission below only inserts.
		first, err := rt.Submit(context.Background(), "first", result(1), owner)
		require.NoError(t, err)
		_, err = rt.Wait(context.Background(), first.ID, owner)
		require.NoError(t, err)

		late := scoped(t, "late")
		f.Add(storetest.Rule{Op: storetest.OpInsertTask, Fault: storetest.Delay, Delay: time.Second})
		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Times: 1, Fault: fault, Match: func(c *storetest.Call) bool {
			return c.ID == late && c.Next.Cause == workers.CauseShutdown
		}})
		var calls atomic.Int32
		submitted := make(chan error, 1)
		go func() {
			_, err := rt.Submit(context.Background(), "late", func(context.Context, *workers.Task) (any, error) {
				calls.Add(1)
				return "ran", nil
			}, owner)
			submitted <- err
		}()
		synctest.Wait() // the submission is in its insert

		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, rt.Shutdown(ctx))
		require.NoError(t, <-submitted, "the insert landed: the submission was acknowledged")
		assert.Equal(t, 1, f.Injected(storetest.OpTransitionTask), "the end's write failed once")
		assert.Zero(t, calls.Load(), "the callback of a run registered after Shutdown began ran")
		endedAs(t, mem, late, workers.StatusCancelled, workers.CauseShutdown)
	})
}

// A run's end that Shutdown decides at once fails once, before it lands
// or after, and is made again: a run waiting out a retry backoff ends
// CANCELLED by the shutdown, and one whose callback panicked after the
// cancel ends FAILED with the panic. Either way Shutdown returns nil,
// and no other attempt begins.
func TestFaultAnEndShutdownDecidesFails(t *testing.T) {
	for _, c := range []struct {
		name  string
		fn    func(calls *atomic.Int32) workers.Func
		retry workers.RetryPolicy
		want  workers.Status
		cause workers.Cause
	}{
		{"in a backoff/", func(calls *atomic.Int32) workers.Func {
			return func(context.Context, *workers.Task) (any, error) {
				calls.Add(1)
				return nil, errors.New("transient")
			}
		}, workers.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Minute, Jitter: workers.NoJitter}, workers.StatusCancelled, workers.CauseShutdown},
		{"panicked after the cancel/", func(calls *atomic.Int32) workers.Func {
			return func(ctx context.Context, _ *workers.Task) (any, error) {
				calls.Add(1)
				<-ctx.Done()
				panic("flushing the buffer failed")
			}
		}, workers.RetryPolicy{MaxAttempts: 3}, workers.StatusFailed, workers.CausePanicked},
	} {
		eachFault(t, c.name, func(t *testing.T, fault storetest.Fault) {
			rt, mem, f := faulty(workers.Config{})
			var calls atomic.Int32
			sub, err := rt.Submit(context.Background(), "k", c.fn(&calls), owner, workers.WithRetry(c.retry))
			require.NoError(t, err)
			synctest.Wait() // in its backoff, or waiting for the cancel
			f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Times: 1, Fault: fault, Match: func(call *storetest.Call) bool {
				return call.ID == sub.ID && call.Next.Cause == c.cause
			}})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			require.NoError(t, rt.Shutdown(ctx))
			if c.want == workers.StatusCancelled {
				assert.Less(t, time.Since(start), 7500*time.Millisecond, "Shutdown waited for the grace point")
			}
			assert.Equal(t, 1, f.Injected(storetest.OpTransitionTask), "the end's write failed once")
			assert.EqualValues(t, 1, calls.Load(), "attempts")
			endedAs(t, mem, sub.ID, c.want, c.cause)
		})
	}
}

// A submission whose insert failed after it landed, to a sequential queue
// or waiting for a slot under Limits, leaves a PENDING record: its
// retired run ends it, fenced on its own run id, even when that write
// fails once too, before it lands or after; the record is never joined,
// and the key runs again.
func TestFaultAGhostPendingInsertIsEndedNotJoined(t *testing.T) {
	for _, path := range []string{"queue", "slot"} {
		eachFault(t, path+"/", func(t *testing.T, fault storetest.Fault) {
			rt, mem, f := faulty(workers.Config{Limits: workers.Limits{MaxRunning: 1}})
			submit := func(key string, fn workers.Func) (workers.Submission, error) {
				if path == "queue" {
					return rt.SubmitSequential(context.Background(), "q", key, fn, owner)
				}
				return rt.Submit(context.Background(), key, fn, owner)
			}
			var head *heedless
			if path == "slot" {
				head = newHeedless()
				_, err := rt.Submit(context.Background(), "head", head.fn, owner)
				require.NoError(t, err)
				<-head.started
			}
			id := scoped(t, "k")
			f.Add(storetest.Rule{Op: storetest.OpInsertTask, Times: 1, Fault: storetest.FailAfter})
			f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Times: 1, Fault: fault, Match: func(c *storetest.Call) bool {
				return c.ID == id && c.Next.Status.Terminal()
			}})
			var calls atomic.Int32
			_, err := submit("k", func(context.Context, *workers.Task) (any, error) {
				calls.Add(1)
				return "lost", nil
			})
			require.ErrorIs(t, err, storetest.ErrInjected)
			time.Sleep(time.Second) // the retired run's write, and its retry
			synctest.Wait()
			assert.Equal(t, 1, f.Injected(storetest.OpTransitionTask), "the end's write failed once")
			endedAs(t, mem, id, workers.StatusFailed, workers.CauseAbandoned)
			assert.Zero(t, calls.Load(), "the callback of a submission that failed ran")

			if head != nil {
				close(head.release)
			}
			again, err := submit("k", result("done"))
			require.NoError(t, err)
			assert.False(t, again.Joined)
			snap, err := rt.Wait(context.Background(), again.ID, owner)
			require.NoError(t, err)
			assert.Equal(t, workers.StatusCompleted, snap.Status)
			require.NoError(t, rt.Shutdown(context.Background()))
		})
	}
}

// A submission of a key whose live record another instance wrote asks the
// store which instances hold a live lease; that read fails, before it
// reaches the store or after: Submit returns the error and writes
// nothing, and the next submission replaces the record of a dead
// instance, or joins the run of a live one.
func TestFaultTheLivenessReadOfARegistrationFails(t *testing.T) {
	for _, peerLive := range []bool{false, true} {
		name := "dead instance/"
		if peerLive {
			name = "live instance/"
		}
		eachFault(t, name, func(t *testing.T, fault storetest.Fault) {
			ctx := context.Background()
			rt, mem, f := faulty(workers.Config{})
			require.NoError(t, rt.Start(ctx))
			id := scoped(t, "k")
			var peer *workers.Runtime[*workers.MemStore]
			var peerRun *heedless
			if peerLive {
				peer = workers.NewRuntime(mem, workers.Config{Logger: quiet})
				peerRun = newHeedless()
				_, err := peer.Submit(ctx, "k", peerRun.fn, owner)
				require.NoError(t, err)
				<-peerRun.started
			} else {
				created := time.Now().UTC().Truncate(time.Microsecond)
				require.NoError(t, mem.InsertTask(ctx, workers.Record{
					ID: id, RunID: "gone-instance.1", Watchers: []string{"alice"}, CreatedAt: created,
					State: workers.State{Status: workers.StatusRunning, StartedAt: created, Attempt: 1},
				}))
			}
			before, err := mem.GetTask(ctx, id)
			require.NoError(t, err)

			f.Add(storetest.Rule{Op: storetest.OpLiveInstances, Times: 1, Fault: fault})
			_, err = rt.Submit(ctx, "k", result("mine"), owner)
			require.ErrorIs(t, err, storetest.ErrInjected)
			after, err := mem.GetTask(ctx, id)
			require.NoError(t, err)
			assert.Equal(t, before, after, "a submission that failed changed the record")

			again, err := rt.Submit(ctx, "k", result("mine"), owner)
			require.NoError(t, err)
			assert.Equal(t, peerLive, again.Joined)
			if peerLive {
				assert.Equal(t, before.RunID, again.RunID)
				close(peerRun.release)
			}
			snap, err := rt.Wait(ctx, id, owner)
			require.NoError(t, err)
			assert.Equal(t, workers.StatusCompleted, snap.Status)
			require.NoError(t, rt.Shutdown(ctx))
			if peer != nil {
				require.NoError(t, peer.Shutdown(ctx))
			}
		})
	}
}

// A background loop's read, or cleanup's delete, fails before it reaches
// the store or after: the pass that made it does nothing more, and the
// next pass does the work.
func TestFaultALoopCallThatFailsIsMadeAgainByTheNextPass(t *testing.T) {
	ctx := context.Background()
	dead, finished := deadRun, finishedTask
	// cancelledElsewhere leaves a run of the runtime's that another
	// process cancelled, for the sync loop to find.
	cancelledElsewhere := func(t *testing.T, rt *workers.Runtime[workers.Store], mem *workers.MemStore) func() bool {
		var ended atomic.Bool
		sub, err := rt.Submit(ctx, "k", func(ctx context.Context, _ *workers.Task) (any, error) {
			<-ctx.Done()
			ended.Store(errors.Is(context.Cause(ctx), workers.ErrCancelled))
			return nil, ctx.Err()
		}, owner)
		require.NoError(t, err)
		synctest.Wait()
		st := workers.State{Status: workers.StatusCancelled, Cause: workers.CauseCancelled, CompletedAt: time.Now()}
		ok, err := mem.TransitionTask(ctx, sub.ID, sub.RunID, liveStates, st)
		require.NoError(t, err)
		require.True(t, ok)
		return ended.Load
	}
	recovery := workers.Config{RecoverInterval: time.Second}
	cleanup := workers.Config{CleanupInterval: time.Second, Retention: time.Millisecond}
	syncing := workers.Config{SyncInterval: time.Second}
	for _, c := range []struct {
		loop  string
		cfg   workers.Config
		op    storetest.Op
		store func(*workers.MemStore) workers.Store
		// leave leaves work for the loop and returns whether it is done.
		leave func(*testing.T, *workers.Runtime[workers.Store], *workers.MemStore) func() bool
	}{
		{"recovery's list", recovery, storetest.OpListTasks, nil, dead},
		{"recovery's liveness read", recovery, storetest.OpLiveInstances, nil, dead},
		{"cleanup", cleanup, storetest.OpDeleteFinished, nil, finished},
		// Over a store without notices: the sync loop alone finds the end.
		{"sync read", syncing, storetest.OpGetTask, func(m *workers.MemStore) workers.Store { return sharedNoNotices{m, m} }, cancelledElsewhere},
	} {
		eachFault(t, c.loop+"/", func(t *testing.T, fault storetest.Fault) {
			c.cfg.Logger = quiet
			f := &storetest.Faults{}
			mem := workers.NewMemStore()
			var s workers.Store = mem
			if c.store != nil {
				s = c.store(mem)
			}
			rt := workers.NewRuntime(storetest.Faulty(s, f), c.cfg)
			require.NoError(t, rt.Start(ctx))
			f.Add(storetest.Rule{Op: c.op, Times: 1, Fault: fault})
			done := c.leave(t, rt, mem)
			time.Sleep(1500 * time.Millisecond) // the loop's first pass
			synctest.Wait()
			require.Equal(t, 1, f.Injected(c.op), "the first pass's call failed")
			for deadline := time.Now().Add(time.Minute); !done(); time.Sleep(100 * time.Millisecond) {
				require.True(t, time.Now().Before(deadline), "no pass of the %s did the work", c.loop)
			}
			require.NoError(t, rt.Shutdown(ctx))
		})
	}
}

// Shutdown's release of the lease fails, before it reaches the store or
// after: the runs had all settled, so Shutdown still returns nil, the
// failure is only logged, and no record is left live. A lease the
// release did not end expires by itself, after which recovery anywhere
// finds nothing of the instance's to end.
func TestFaultShutdownsLeaseReleaseFails(t *testing.T) {
	eachFault(t, "", func(t *testing.T, fault storetest.Fault) {
		ctx := context.Background()
		cfg := workers.Config{LeaseInterval: time.Second, LeaseTTL: 3 * time.Second}
		rt, mem, f := faulty(cfg)
		sub, err := rt.Submit(ctx, "k", result("done"), owner)
		require.NoError(t, err)
		_, err = rt.Wait(ctx, sub.ID, owner)
		require.NoError(t, err)
		instance := workers.InstanceOf(sub.RunID)

		f.Add(storetest.Rule{Op: storetest.OpReleaseLease, Times: 1, Fault: fault})
		require.NoError(t, rt.Shutdown(ctx))
		assert.Equal(t, 1, f.Injected(storetest.OpReleaseLease))
		live, err := mem.LiveInstances(ctx)
		require.NoError(t, err)
		assert.Equal(t, fault == storetest.FailBefore, slices.Contains(live, instance),
			"the lease lives on only if the release never reached the store")

		time.Sleep(4 * time.Second) // past the lease's TTL
		live, err = mem.LiveInstances(ctx)
		require.NoError(t, err)
		assert.NotContains(t, live, instance, "the lease expired")
		recs, err := mem.ListTasks(ctx, workers.Filter{Statuses: liveStates})
		require.NoError(t, err)
		assert.Empty(t, recs)
	})
}

// Recovery's write of a dead run's end fails after it landed: recovery
// reads the record, finds its end there, and counts and reports the
// recovery as its own. The next pass would not list the record again,
// so the observers would otherwise never hear of that end, nor would
// RecoverZombies count it. A write that did not land (fail-before) is
// an error of the pass, and a later pass ends the record.
func TestFaultARecoveryWriteThatLandedIsReported(t *testing.T) {
	eachFault(t, "", func(t *testing.T, fault storetest.Fault) {
		ctx := context.Background()
		recovered := make(chan workers.Event, 4)
		rt, mem, f := faulty(workers.Config{Observers: []workers.Observer{
			workers.ObserverFunc(func(_ context.Context, e workers.Event) {
				if e.Kind == workers.EventRecovered {
					recovered <- e
				}
			}),
		}})
		id, created := scoped(t, "dead"), time.Now().UTC().Truncate(time.Microsecond)
		require.NoError(t, mem.InsertTask(ctx, workers.Record{
			ID: id, RunID: "gone-instance.1", Watchers: []string{"alice"}, CreatedAt: created,
			State: workers.State{Status: workers.StatusRunning, StartedAt: created, Attempt: 1},
		}))
		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Times: 1, Fault: fault})
		n, err := rt.RecoverZombies(ctx)
		if fault == storetest.FailAfter {
			require.NoError(t, err, "the write landed")
			assert.Equal(t, 1, n)
		} else {
			require.ErrorIs(t, err, storetest.ErrInjected)
			assert.Zero(t, n)
			n, err = rt.RecoverZombies(ctx)
			require.NoError(t, err)
			assert.Equal(t, 1, n)
		}
		endedAs(t, mem, id, workers.StatusFailed, workers.CauseAbandoned)
		require.Len(t, recovered, 1, "the observers hear of the recovery once")
		e := <-recovered
		assert.Equal(t, id, e.TaskID)
		assert.Equal(t, "gone-instance.1", e.RunID)
		n, err = rt.RecoverZombies(ctx)
		require.NoError(t, err)
		assert.Zero(t, n)
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// The store's notices are how a run learns at once that another process
// ended its record. Listen fails as it starts: the runtime listens again
// after a LeaseInterval, and the resync that starts every listen has the
// run checked against its record, so a cancel made elsewhere meanwhile
// still reaches the callback, with no sync loop to stand in. (Listen
// blocks until its context ends, so a fault after it reached the store
// is one of its end, which Shutdown makes.)
func TestFaultAListenThatFailsIsMadeAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		f := &storetest.Faults{}
		mem := workers.NewMemStore()
		f.Add(storetest.Rule{Op: storetest.OpListen, Times: 1, Fault: storetest.FailBefore})
		rt := workers.NewRuntime(storetest.Faulty(mem, f),
			workers.Config{Logger: quiet, LeaseInterval: time.Second, SyncInterval: time.Hour})
		cancelled := make(chan error, 1)
		sub, err := rt.Submit(ctx, "k", func(ctx context.Context, _ *workers.Task) (any, error) {
			<-ctx.Done()
			cancelled <- context.Cause(ctx)
			return nil, ctx.Err()
		}, owner)
		require.NoError(t, err)
		synctest.Wait()
		require.Equal(t, 1, f.Injected(storetest.OpListen), "the first Listen failed")

		there := workers.NewRuntime(mem, workers.Config{Logger: quiet})
		require.NoError(t, there.Cancel(ctx, sub.ID, owner))
		timeout := time.NewTimer(time.Minute)
		select {
		case cause := <-cancelled:
			assert.ErrorIs(t, cause, workers.ErrCancelled)
		case <-timeout.C:
			t.Fatal("the run never learnt of the cancel made elsewhere")
		}
		assert.Equal(t, 2, f.Calls(storetest.OpListen), "listened again")
		require.NoError(t, rt.Shutdown(ctx))
		require.NoError(t, there.Shutdown(ctx))
		endedAs(t, mem, sub.ID, workers.StatusCancelled, workers.CauseCancelled)
	})
}

// Recovery's read-back of a write that reported an error may fail too,
// before it reaches the store or after: the pass then returns the write's
// error and counts nothing, as it did before it read back; the record,
// ended all the same, is listed by no later pass.
func TestFaultARecoveryReadBackThatFailsLeavesTheWritesError(t *testing.T) {
	eachFault(t, "", func(t *testing.T, fault storetest.Fault) {
		ctx := context.Background()
		rt, mem, f := faulty(workers.Config{})
		id, created := scoped(t, "dead"), time.Now().UTC().Truncate(time.Microsecond)
		require.NoError(t, mem.InsertTask(ctx, workers.Record{
			ID: id, RunID: "gone-instance.1", Watchers: []string{"alice"}, CreatedAt: created,
			State: workers.State{Status: workers.StatusRunning, StartedAt: created, Attempt: 1},
		}))
		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Times: 1, Fault: storetest.FailAfter})
		f.Add(storetest.Rule{Op: storetest.OpGetTask, Times: 1, Fault: fault})
		n, err := rt.RecoverZombies(ctx)
		require.ErrorIs(t, err, storetest.ErrInjected)
		assert.Zero(t, n)
		assert.Equal(t, 1, f.Injected(storetest.OpGetTask), "the read-back was made, and failed")
		endedAs(t, mem, id, workers.StatusFailed, workers.CauseAbandoned)
		n, err = rt.RecoverZombies(ctx)
		require.NoError(t, err)
		assert.Zero(t, n, "an ended record is not recovered again")
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// lostConn is a store error that says the connection was lost.
var lostConn = fmt.Errorf("%w: connection reset by peer", workers.ErrUnavailable)

// A registering write, an insert or the replace of a finished record,
// fails once because the store lost its connection, before it lands or
// after: it is made again, and Submit succeeds with one run, whose
// callback runs once and whose record is the run's, completed. After a
// try that landed, the retry finds the record taken and reads it: it
// holds the submission's own run.
func TestFaultARegisteringWriteOnALostConnectionIsMadeAgain(t *testing.T) {
	for _, op := range []storetest.Op{storetest.OpInsertTask, storetest.OpReplaceTask} {
		eachFault(t, string(op)+"/", func(t *testing.T, fault storetest.Fault) {
			rt, mem, f := faulty(workers.Config{})
			if op == storetest.OpReplaceTask {
				first, err := rt.Submit(context.Background(), "k", result("first"), owner)
				require.NoError(t, err)
				_, err = rt.Wait(context.Background(), first.ID, owner)
				require.NoError(t, err)
			}
			f.Add(storetest.Rule{Op: op, Times: 1, Fault: fault, Err: lostConn})
			var calls atomic.Int32
			sub, err := rt.Submit(context.Background(), "k", func(context.Context, *workers.Task) (any, error) {
				calls.Add(1)
				return "done", nil
			}, owner)
			require.NoError(t, err)
			assert.False(t, sub.Joined)
			assert.Equal(t, 2, f.Calls(op), "the write was made again")
			if op == storetest.OpInsertTask {
				assert.Zero(t, f.Calls(storetest.OpReplaceTask), "the retry's read found the landed try")
			}
			snap, err := rt.Wait(context.Background(), sub.ID, owner)
			require.NoError(t, err)
			assert.Equal(t, workers.StatusCompleted, snap.Status)
			assert.Equal(t, sub.RunID, snap.RunID)
			assert.EqualValues(t, 1, calls.Load())
			rec, err := mem.GetTask(context.Background(), sub.ID)
			require.NoError(t, err)
			assert.Equal(t, sub.RunID, rec.RunID)
			require.NoError(t, rt.Shutdown(context.Background()))
		})
	}
}

// A registering insert keeps failing with a lost connection: it is made
// four times in all, and Submit returns the error. Should a try have
// landed, its record is ended as abandoned, fenced on the run's own id,
// as after any insert that may have landed; the callback never runs.
func TestFaultARegisteringWriteGivesUpOnAConnectionStillLost(t *testing.T) {
	eachFault(t, "", func(t *testing.T, fault storetest.Fault) {
		rt, mem, f := faulty(workers.Config{})
		f.Add(storetest.Rule{Op: storetest.OpInsertTask, Fault: fault, Err: lostConn})
		var calls atomic.Int32
		_, err := rt.Submit(context.Background(), "k", func(context.Context, *workers.Task) (any, error) {
			calls.Add(1)
			return "lost", nil
		}, owner)
		require.ErrorIs(t, err, workers.ErrUnavailable)
		assert.Equal(t, 4, f.Calls(storetest.OpInsertTask))
		id := scoped(t, "k")
		if fault == storetest.FailAfter {
			synctest.Wait() // the retired run's write
			endedAs(t, mem, id, workers.StatusFailed, workers.CauseAbandoned)
		} else {
			_, err := mem.GetTask(context.Background(), id)
			require.ErrorIs(t, err, workers.ErrNotFound)
		}
		assert.Zero(t, calls.Load())
		require.NoError(t, rt.Shutdown(context.Background()))
	})
}

// leaseLostOnce returns a started runtime over a faulty MemStore (lease
// interval 1 s, TTL 3 s) whose renewals failed on a lost connection
// until its lease was lost, at 4.5 s in the caller's bubble; the next
// lost renewals will fail with fault (before they reach the store, or
// after they landed), and those after succeed.
func leaseLostOnce(t *testing.T, lost int, fault storetest.Fault) (*workers.Runtime[workers.Store], *workers.MemStore, *storetest.Faults) {
	t.Helper()
	rt, mem, f := faulty(workers.Config{LeaseInterval: time.Second, LeaseTTL: 3 * time.Second})
	require.NoError(t, rt.Start(t.Context()))
	unreachable := f.Add(storetest.Rule{Op: storetest.OpRenewLease, Fault: storetest.FailBefore, Err: lostConn})
	time.Sleep(4500 * time.Millisecond) // the renewals fail past the lease's end: lost
	unreachable()
	f.Add(storetest.Rule{Op: storetest.OpRenewLease, Times: lost, Fault: fault, Err: lostConn})
	return rt, mem, f
}

// A submission that finds the lease lost renews it first, and a renewal
// that fails on a lost connection is made again: the submission
// registers on the lease its retry took, and its run completes. A
// renewal that keeps failing fails the submission, which registers
// nothing.
func TestFaultASubmissionsLeaseRenewalOnALostConnectionIsMadeAgain(t *testing.T) {
	for name, c := range map[string]struct {
		lost    int // the submission's renewals that fail
		renewed bool
	}{
		"lost once":   {1, true},
		"lost thrice": {3, true},
		"still lost":  {4, false},
	} {
		eachFault(t, name+"/", func(t *testing.T, fault storetest.Fault) {
			rt, mem, f := leaseLostOnce(t, c.lost, fault)
			before := f.Calls(storetest.OpRenewLease)
			sub, err := rt.Submit(context.Background(), "k", result("done"), owner)
			if !c.renewed {
				require.ErrorIs(t, err, workers.ErrUnavailable)
				assert.ErrorContains(t, err, "renewing the instance lease")
				assert.Equal(t, before+4, f.Calls(storetest.OpRenewLease), "four tries")
				_, err = mem.GetTask(context.Background(), scoped(t, "k"))
				require.ErrorIs(t, err, workers.ErrNotFound)
			} else {
				require.NoError(t, err)
				assert.Equal(t, before+c.lost+1, f.Calls(storetest.OpRenewLease))
				synctest.Wait()
				endedAs(t, mem, sub.ID, workers.StatusCompleted, workers.CauseCompleted)
			}
			require.NoError(t, rt.Shutdown(context.Background()))
		})
	}
}

// Once the lease is lost, a renewal of the loop that fails on a lost
// connection is made again at once, not an interval later: a submission
// that comes meanwhile finds the lease taken anew and renews nothing of
// its own.
func TestFaultTheLoopsRenewalOfALostLeaseOnALostConnectionIsMadeAgain(t *testing.T) {
	eachFault(t, "", func(t *testing.T, fault storetest.Fault) {
		rt, mem, f := leaseLostOnce(t, 1, fault)
		time.Sleep(time.Second) // the loop's renewal at 5 s is lost, and made again
		before := f.Calls(storetest.OpRenewLease)
		sub, err := rt.Submit(context.Background(), "k", result("done"), owner)
		require.NoError(t, err)
		assert.Equal(t, before, f.Calls(storetest.OpRenewLease), "no renewal of the submission's own")
		synctest.Wait()
		endedAs(t, mem, sub.ID, workers.StatusCompleted, workers.CauseCompleted)
		require.NoError(t, rt.Shutdown(context.Background()))
	})
}

// While the lease lives, a renewal of the loop that fails on a lost
// connection is not made again before the next interval: had the lost
// try landed, the retry would report an extension of a lease the lost
// try may have taken anew.
func TestFaultTheLoopsRenewalOfALiveLeaseIsNotMadeAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt, _, f := faulty(workers.Config{LeaseInterval: time.Second, LeaseTTL: 3 * time.Second})
		require.NoError(t, rt.Start(t.Context()))
		time.Sleep(500 * time.Millisecond)
		before := f.Calls(storetest.OpRenewLease)
		f.Add(storetest.Rule{Op: storetest.OpRenewLease, Times: 1, Fault: storetest.FailAfter, Err: lostConn})
		time.Sleep(time.Second) // the renewal at 1 s is lost
		assert.Equal(t, before+1, f.Calls(storetest.OpRenewLease), "one renewal, not made again")
		require.NoError(t, rt.Shutdown(context.Background()))
	})
}

// Shutdown begins while a registering write backs off before its retry:
// the backoff ends at once (Shutdown waits for the submissions in
// progress), and Submit returns the lost try's error without a retry.
// Should the lost try have landed, its record is ended as abandoned, as
// after any insert that may have landed.
func TestFaultARegisteringWriteStopsBackingOffWhenShutdownBegins(t *testing.T) {
	eachFault(t, "", func(t *testing.T, fault storetest.Fault) {
		rt, mem, f := faulty(workers.Config{})
		f.Add(storetest.Rule{Op: storetest.OpInsertTask, Fault: fault, Err: lostConn})
		start := time.Now()
		var err error
		var took time.Duration
		submitted := make(chan struct{})
		go func() {
			defer close(submitted)
			_, err = rt.Submit(context.Background(), "k", result("lost"), owner)
			took = time.Since(start)
		}()
		synctest.Wait() // the submission backs off
		require.Equal(t, 1, f.Calls(storetest.OpInsertTask))
		require.NoError(t, rt.Shutdown(context.Background()))
		<-submitted
		require.ErrorIs(t, err, workers.ErrUnavailable)
		assert.Zero(t, took, "the backoff did not wait")
		assert.Equal(t, 1, f.Calls(storetest.OpInsertTask), "no retry after Shutdown began")
		if fault == storetest.FailAfter {
			endedAs(t, mem, scoped(t, "k"), workers.StatusFailed, workers.CauseAbandoned)
		} else {
			_, err = mem.GetTask(context.Background(), scoped(t, "k"))
			require.ErrorIs(t, err, workers.ErrNotFound)
		}
	})
}

// A registering insert is lost after it landed, and its retry cannot tell
// so: the read that would, after the retry finds the record taken, fails
// (before it reaches the store, or after), or the retry is refused for
// good, which says nothing of the lost try. Whether it landed is unknown,
// so Submit returns the lost try's error and the run is retired, its
// record ended as abandoned, not left live under a run nobody executes.
func TestFaultARegisteringWriteThatMayHaveLandedIsRetiredWhenTheRetryCannotTell(t *testing.T) {
	for name, rule := range map[string]storetest.Rule{
		"read fails/fail-before": {Op: storetest.OpGetTask, Times: 1, Fault: storetest.FailBefore},
		"read fails/fail-after":  {Op: storetest.OpGetTask, Times: 1, Fault: storetest.FailAfter},
		"retry refused for good": {Op: storetest.OpInsertTask, Nth: 2, Fault: storetest.FailBefore, Err: workers.ErrInvalidData},
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rt, mem, f := faulty(workers.Config{})
				f.Add(storetest.Rule{Op: storetest.OpInsertTask, Nth: 1, Fault: storetest.FailAfter, Err: lostConn})
				f.Add(rule)
				_, err := rt.Submit(context.Background(), "k", result("lost"), owner)
				require.ErrorIs(t, err, workers.ErrUnavailable)
				assert.Equal(t, 2, f.Calls(storetest.OpInsertTask))
				synctest.Wait() // the retired run's write
				endedAs(t, mem, scoped(t, "k"), workers.StatusFailed, workers.CauseAbandoned)
				require.NoError(t, rt.Shutdown(context.Background()))
			})
		})
	}
}

// slowLeaser is a MemStore whose renewals fail with lostConn while down,
// and whose next renewals, one per entry of plan, fail with lostConn
// after that entry's wait, having landed first under FailAfter; the next
// after them panics if panic is set.
type slowLeaser struct {
	*workers.MemStore
	fault storetest.Fault // of the planned renewals: FailBefore or FailAfter
	down  atomic.Bool
	panic atomic.Bool // the next renewal panics
	plan  chan time.Duration
	calls atomic.Int32
}

func (s *slowLeaser) RenewLease(ctx context.Context, instance string, ttl time.Duration) (bool, error) {
	s.calls.Add(1)
	if s.down.Load() {
		return false, lostConn
	}
	select {
	case d := <-s.plan:
		if s.fault == storetest.FailAfter {
			if _, err := s.MemStore.RenewLease(ctx, instance, ttl); err != nil {
				return false, err
			}
		}
		select {
		case <-time.After(d):
			return false, lostConn
		case <-ctx.Done():
			return false, ctx.Err()
		}
	default:
	}
	if s.panic.CompareAndSwap(true, false) {
		panic("a store's bug")
	}
	return s.MemStore.RenewLease(ctx, instance, ttl)
}

// slowLost returns a runtime over a slowLeaser whose lease was lost,
// with plan to come, its renewals failing with fault (LeaseInterval 1 s,
// LeaseTTL 3 s). Call it inside a synctest bubble.
func slowLost(t *testing.T, fault storetest.Fault, plan ...time.Duration) (*workers.Runtime[*slowLeaser], *slowLeaser) {
	t.Helper()
	s := &slowLeaser{MemStore: workers.NewMemStore(), fault: fault, plan: make(chan time.Duration, len(plan))}
	rt := workers.NewRuntime(s, workers.Config{Logger: quiet, LeaseInterval: time.Second, LeaseTTL: 3 * time.Second})
	require.NoError(t, rt.Start(t.Context()))
	s.down.Store(true)
	time.Sleep(4500 * time.Millisecond) // the renewals fail past the lease's end: lost
	for _, d := range plan {
		s.plan <- d
	}
	s.down.Store(false)
	return rt, s
}

// The retries of a lost lease's renewal on a lost connection take no
// longer than the one interval its first try may take: a store whose
// every renewal fails slowly fails the submission within LeaseInterval,
// with the lost connection's error.
func TestFaultTheRetriesOfALostLeasesRenewalTakeOneIntervalAtMost(t *testing.T) {
	eachFault(t, "", func(t *testing.T, fault storetest.Fault) {
		rt, _ := slowLost(t, fault, 900*time.Millisecond, 900*time.Millisecond, 900*time.Millisecond, 900*time.Millisecond)
		start := time.Now()
		_, err := rt.Submit(context.Background(), "k", result("done"), owner)
		require.ErrorIs(t, err, workers.ErrUnavailable)
		assert.ErrorContains(t, err, "renewing the instance lease")
		assert.LessOrEqual(t, time.Since(start), time.Second)
		require.NoError(t, rt.Shutdown(context.Background()))
	})
}

// A renewal retried on a lost connection that panics (a store's bug,
// which the submitter's caller recovers, as net/http does) leaves
// nothing of the retry behind: the lease is renewed again once the store
// answers, and submissions register.
func TestFaultARetriedRenewalThatPanicsLeavesTheLeaseRenewable(t *testing.T) {
	eachFault(t, "", func(t *testing.T, fault storetest.Fault) {
		rt, s := slowLost(t, fault, 0) // the submission's renewal fails at once
		s.panic.Store(true)            // and its retry panics
		func() {
			defer func() { _ = recover() }()
			_, _ = rt.Submit(context.Background(), "k", result("done"), owner)
			t.Error("Submit returned: want the store's panic")
		}()
		time.Sleep(5 * time.Second) // the loop renews meanwhile
		_, err := rt.Submit(context.Background(), "k2", result("done"), owner)
		require.NoError(t, err)
		require.NoError(t, rt.Shutdown(context.Background()))
	})
}

// A submission that waited on a renewal whose maker gave up on its
// retries (its context ended in a backoff) does not take that renewal's
// one failure for the answer: it renews the lease itself, and registers.
func TestFaultASubmissionWaitingOnARenewalItsMakerGaveUpOnRenewsItself(t *testing.T) {
	eachFault(t, "", func(t *testing.T, fault storetest.Fault) {
		rt, s := slowLost(t, fault, 50*time.Millisecond)
		before := s.calls.Load()
		ctxA, cancelA := context.WithCancel(context.Background())
		errA, errB := make(chan error, 1), make(chan error, 1)
		go func() { _, err := rt.Submit(ctxA, "a", result("a"), owner); errA <- err }()
		time.Sleep(10 * time.Millisecond)
		go func() { _, err := rt.Submit(context.Background(), "b", result("b"), owner); errB <- err }()
		time.Sleep(42 * time.Millisecond) // a's renewal failed at 50 ms: it backs off
		cancelA()
		require.ErrorIs(t, <-errA, context.Canceled)
		require.NoError(t, <-errB)
		assert.Equal(t, int32(2), s.calls.Load()-before, "a's renewal, then b's own")
		require.NoError(t, rt.Shutdown(context.Background()))
	})
}

// Shutdown beginning while a submission backs off between its lease
// renewal's tries fails the submission with ErrClosed, as it fails any
// submission that finds it begun.
func TestFaultShutdownDuringALeaseRenewalsBackoffFailsTheSubmissionWithErrClosed(t *testing.T) {
	eachFault(t, "", func(t *testing.T, fault storetest.Fault) {
		rt, _, _ := leaseLostOnce(t, 4, fault)
		errs := make(chan error, 1)
		go func() { _, err := rt.Submit(context.Background(), "k", result("x"), owner); errs <- err }()
		synctest.Wait() // in its first backoff
		require.NoError(t, rt.Shutdown(context.Background()))
		require.ErrorIs(t, <-errs, workers.ErrClosed)
	})
}
