package workers_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/storetest"
)

// With a store that hangs, Shutdown returns by its deadline plus the
// slack, names what it left, and leaves it for recovery, which ends it
// once the instance's lease has expired; a submission hung in its insert
// when Shutdown began ends its run CANCELLED once the store resumes.
// The fault cases of storetest, over a MemStore; the SQL stores run them
// too. The tests below need a MemStore: they run in synctest bubbles.
func TestFaults(t *testing.T) {
	storetest.RunFaults(t, func(*testing.T) workers.Store { return workers.NewMemStore() })
}

var (
	owner      = workers.MustOwner("alice")
	quiet      = slog.New(slog.DiscardHandler)
	liveStates = []workers.Status{workers.StatusPending, workers.StatusRunning}
)

// heedless is a callback that says when it starts, then ignores its
// context: it returns "late" only once released.
type heedless struct{ started, release chan struct{} }

func newHeedless() *heedless {
	return &heedless{started: make(chan struct{}), release: make(chan struct{})}
}

func (s *heedless) fn(context.Context, *workers.Task) (any, error) {
	close(s.started)
	<-s.release
	return "late", nil
}

// faulty returns a runtime, quiet, over a MemStore behind the faults f
// inject, with cfg otherwise.
func faulty(cfg workers.Config) (*workers.Runtime[workers.Store], *workers.MemStore, *storetest.Faults) {
	cfg.Logger = quiet
	f := &storetest.Faults{}
	mem := workers.NewMemStore()
	return workers.NewRuntime(storetest.Faulty(mem, f), cfg), mem, f
}

// endedAs asserts that the record id in s ended with status and cause.
func endedAs(t *testing.T, s workers.Store, id string, status workers.Status, cause workers.Cause) {
	t.Helper()
	r, err := s.GetTask(context.Background(), id)
	require.NoError(t, err)
	assert.Equal(t, status, r.Status)
	assert.Equal(t, cause, r.Cause)
}

func result(v any) workers.Func {
	return func(context.Context, *workers.Task) (any, error) { return v, nil }
}

func to(s workers.Status) func(*storetest.Call) bool {
	return func(c *storetest.Call) bool { return c.Next.Status == s }
}

func scoped(t *testing.T, key string) string {
	id, err := workers.ScopedTaskKey(key, owner)
	require.NoError(t, err)
	return id
}

func TestFaultShutdownBoundedWhenTheStoreHangs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &storetest.Faults{}
		mem := workers.NewMemStore()
		s := storetest.Faulty(mem, f)
		cfg := workers.Config{Logger: quiet, ShutdownGrace: -1}
		rt := workers.NewRuntime(s, cfg)
		started, returns := make(chan struct{}), make(chan struct{})
		sub, err := rt.Submit(t.Context(), "running", func(ctx context.Context, _ *workers.Task) (any, error) {
			close(started)
			<-returns
			return nil, ctx.Err()
		}, owner)
		require.NoError(t, err)
		<-started

		f.Add(storetest.Rule{Fault: storetest.Hang, Match: func(c *storetest.Call) bool { return c.Op != storetest.OpListen }})
		close(returns)
		synctest.Wait() // the callback returned; its outcome write hangs
		hungSubmit := make(chan error, 1)
		go func() {
			_, err := rt.Submit(context.Background(), "hung", result("late"), owner)
			hungSubmit <- err
		}()
		synctest.Wait() // the submission hangs in its insert

		const bound = time.Second
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		began := time.Now()
		err = rt.Shutdown(ctx)
		took := time.Since(began)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.LessOrEqual(t, took, bound+100*time.Millisecond, "Shutdown outlived its bound")
		assert.Contains(t, err.Error(), "left 1 runs or goroutines executing and 1 live records of this runtime unwritten",
			"the submission whose insert hangs, and the run whose callback returned and whose outcome write hangs")
		r, err := mem.GetTask(context.Background(), sub.ID)
		require.NoError(t, err)
		assert.Equal(t, workers.StatusRunning, r.Status, "left for recovery")

		// The store resumes: the hung submission's run ends at once.
		f.Heal()
		require.NoError(t, <-hungSubmit)
		synctest.Wait()
		endedAs(t, mem, scoped(t, "hung"), workers.StatusCancelled, workers.CauseShutdown)

		// Another runtime recovers the run left RUNNING once the dead
		// instance's lease has expired, and not before.
		other := workers.NewRuntime(s, cfg)
		n, err := other.RecoverZombies(context.Background())
		require.NoError(t, err)
		assert.Zero(t, n, "the shut-down instance's lease is still live")
		time.Sleep(15 * time.Second)
		// Once the store resumed, the run's own outcome write, if it was
		// still trying, lands; otherwise the run is recovered once the
		// lease has expired. Either way the record ends.
		n, err = other.RecoverZombies(context.Background())
		require.NoError(t, err)
		assert.LessOrEqual(t, n, 1)
		snap, err := other.Wait(context.Background(), sub.ID, owner)
		require.NoError(t, err)
		assert.Contains(t, []workers.Cause{workers.CauseShutdown, workers.CauseAbandoned}, snap.Cause)
		require.NoError(t, other.Shutdown(context.Background()))
	})
}

// Hang and delay faults only delay: a run whose writes hang until the
// store resumes, or are slowed, still completes.
func TestFaultHangAndDelayOnlyDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &storetest.Faults{}
		rt := workers.NewRuntime(storetest.Faulty(workers.NewMemStore(), f), workers.Config{Logger: quiet})
		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Fault: storetest.Delay, Delay: time.Second, Match: to(workers.StatusRunning)})
		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Fault: storetest.Hang, Match: to(workers.StatusCompleted)})
		sub, err := rt.Submit(context.Background(), "k", result("done"), owner)
		require.NoError(t, err)
		time.Sleep(time.Second) // the start's delay
		synctest.Wait()
		assert.Equal(t, 1, f.Hung(), "the outcome write hangs")
		f.Release()
		snap, err := rt.Wait(context.Background(), sub.ID, owner)
		require.NoError(t, err)
		assert.Equal(t, workers.StatusCompleted, snap.Status)
		require.NoError(t, rt.Shutdown(context.Background()))
	})
}

// The fault store passes through exactly the capabilities of the store
// it wraps.
func TestFaultyKeepsTheCapabilitiesOfItsStore(t *testing.T) {
	f := &storetest.Faults{}
	s := storetest.Faulty(workers.NewMemStore(), f)
	_, l := s.(workers.Leaser)
	_, n := s.(workers.Notifier)
	_, c := s.(workers.RecordClearer)
	assert.True(t, l && n && c, "over a MemStore")
	bare := storetest.Faulty(struct{ workers.Store }{workers.NewMemStore()}, f)
	_, l = bare.(workers.Leaser)
	_, n = bare.(workers.Notifier)
	_, c = bare.(workers.RecordClearer)
	assert.False(t, l || n || c, "over a bare Store")
	_, err := s.GetTask(context.Background(), "nobody")
	assert.ErrorIs(t, err, workers.ErrNotFound)
	assert.Equal(t, 1, f.Calls(storetest.OpGetTask))
	assert.True(t, strings.HasPrefix(storetest.ErrInjected.Error(), "storetest:"))
}

// The read that tells whether an ambiguous abandon write landed is cut
// off with Shutdown's bound too: a store that hangs then cannot hold
// Shutdown past its deadline plus the slack.
func TestFaultShutdownBoundedWhenTheLandedReadHangs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt, mem, f := faulty(workers.Config{ShutdownGrace: -1})
		started := make(chan struct{})
		_, err := rt.SubmitSequential(context.Background(), "q", "head", func(ctx context.Context, _ *workers.Task) (any, error) {
			close(started)
			<-ctx.Done()
			return nil, ctx.Err()
		}, owner)
		require.NoError(t, err)
		<-started
		item, err := rt.SubmitSequential(context.Background(), "q", "item", result("never"), owner)
		require.NoError(t, err)
		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Times: 1, Fault: storetest.FailAfter, Match: func(c *storetest.Call) bool {
			return c.Next.Cause == workers.CauseShutdown && slices.Equal(c.From, []workers.Status{workers.StatusPending})
		}})
		f.Add(storetest.Rule{Op: storetest.OpGetTask, Fault: storetest.Hang})

		const bound = time.Second
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		began := time.Now()
		err = rt.Shutdown(ctx)
		assert.LessOrEqual(t, time.Since(began), bound+100*time.Millisecond, "Shutdown outlived its bound")
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Contains(t, err.Error(), "1 live records of this runtime unwritten", "the abandon write it could not confirm")
		f.Heal()
		r, err := mem.GetTask(context.Background(), item.ID)
		require.NoError(t, err)
		assert.Equal(t, workers.StatusCancelled, r.Status, "the ambiguous write had landed")
	})
}

// A queue item's start write lands but reports a failure, its retries
// fail, and Shutdown cancels the run meanwhile: the start becomes the
// cancellation, written over the RUNNING record the first try may have
// left as well as over a PENDING one, so no RUNNING record outlives a
// Shutdown that reported everything written.
func TestFaultStartThatMayHaveLandedEndsCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt, mem, f := faulty(workers.Config{ShutdownGrace: -1})
		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Times: 1, Fault: storetest.FailAfter, Match: func(c *storetest.Call) bool {
			return c.Next.Status == workers.StatusRunning
		}})
		var failing atomic.Bool // every later run write fails while set
		failing.Store(true)
		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Fault: storetest.FailBefore, Match: func(*storetest.Call) bool {
			return failing.Load()
		}})
		item, err := rt.SubmitSequential(context.Background(), "q", "item", result("never"), owner)
		require.NoError(t, err)
		require.NoError(t, f.WaitInjected(context.Background(), storetest.OpTransitionTask, 2), "the start landed, then a retry failed")

		done := make(chan error, 1)
		go func() { done <- rt.Shutdown(context.Background()) }()
		time.Sleep(time.Second) // fake time: tries fail after Shutdown cancelled the run
		synctest.Wait()
		failing.Store(false)
		require.NoError(t, <-done)
		endedAs(t, mem, item.ID, workers.StatusCancelled, workers.CauseShutdown)
	})
}

// A queue item's start write lands but reports a failure, and its retry
// is refused for good: the start becomes the FAILED record saying so,
// written over the RUNNING record the first try left.
func TestFaultStartThatMayHaveLandedThenRefusedEndsFailed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt, mem, f := faulty(workers.Config{})
		toRunning := func(c *storetest.Call) bool { return c.Next.Status == workers.StatusRunning }
		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Times: 1, Fault: storetest.FailAfter, Match: toRunning})
		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Times: 1, Fault: storetest.FailBefore, Match: toRunning, Err: workers.ErrInvalidData})
		item, err := rt.SubmitSequential(context.Background(), "q", "item", result("never"), owner)
		require.NoError(t, err)
		time.Sleep(time.Second) // fake time: past the write's backoff
		synctest.Wait()
		endedAs(t, mem, item.ID, workers.StatusFailed, workers.CauseStore)
		require.NoError(t, rt.Shutdown(context.Background()))
	})
}

// An async run admitted at once is inserted RUNNING (attempt 1): that
// write is its durable start, and its one run write is its outcome. A
// queue item is inserted PENDING and writes its start when its turn
// comes.
func TestRunAdmittedAtOnceIsRegisteredRunning(t *testing.T) {
	f := &storetest.Faults{}
	var mu sync.Mutex
	calls := map[string][]storetest.Call{}
	f.Add(storetest.Rule{Fault: storetest.FailBefore, Match: func(c *storetest.Call) bool {
		if c.Op == storetest.OpInsertTask || c.Op == storetest.OpTransitionTask {
			mu.Lock()
			calls[c.ID] = append(calls[c.ID], *c)
			mu.Unlock()
		}
		return false // records, never faults
	}})
	rt := workers.NewRuntime(storetest.Faulty(workers.NewMemStore(), f), workers.Config{Logger: quiet})
	t.Cleanup(func() { require.NoError(t, rt.Shutdown(context.Background())) })
	async, err := rt.Submit(t.Context(), "async", result("a"), owner)
	require.NoError(t, err)
	seq, err := rt.SubmitSequential(t.Context(), "q", "seq", result("s"), owner)
	require.NoError(t, err)
	for _, id := range []string{async.ID, seq.ID} {
		snap, err := rt.Wait(t.Context(), id, owner)
		require.NoError(t, err)
		require.Equal(t, workers.StatusCompleted, snap.Status)
		assert.Equal(t, 1, snap.Attempt)
		assert.False(t, snap.StartedAt.IsZero())
	}
	mu.Lock()
	defer mu.Unlock()
	writes := func(id string) (ops []string) {
		for _, c := range calls[id] {
			st := c.Next
			if c.Record != nil {
				st = &c.Record.State
			}
			ops = append(ops, string(c.Op)+" "+string(st.Status))
		}
		return ops
	}
	assert.Equal(t, []string{"InsertTask running", "TransitionTask completed"}, writes(async.ID))
	assert.Equal(t, []string{"InsertTask pending", "TransitionTask running", "TransitionTask completed"}, writes(seq.ID))
	for _, c := range calls[async.ID][:1] {
		assert.Equal(t, 1, c.Record.State.Attempt)
		assert.Equal(t, c.Record.CreatedAt, c.Record.State.StartedAt)
	}
}

// A lost lease records a run waiting for its turn abandoned at once,
// behind a callback that does not return, even when that write fails,
// before it lands or after: it is retried, fenced, until the record holds
// it. A queue's waiting item is one such run; one waiting for a slot
// under Limits is another, and its owner's waiting place frees.
func TestFaultLostLeaseAbandonsAWaitingRunThroughAFailedWrite(t *testing.T) {
	limits := workers.Limits{MaxRunning: 1, Owner: workers.OwnerLimits{Waiting: 1}}
	for _, c := range []struct {
		name   string
		limits workers.Limits
		submit func(rt *workers.Runtime[workers.Store], key string, fn workers.Func) (workers.Submission, error)
	}{
		{"queue item", workers.Limits{}, func(rt *workers.Runtime[workers.Store], key string, fn workers.Func) (workers.Submission, error) {
			return rt.SubmitSequential(context.Background(), "q", key, fn, owner)
		}},
		{"waiting for a slot", limits, func(rt *workers.Runtime[workers.Store], key string, fn workers.Func) (workers.Submission, error) {
			return rt.Submit(context.Background(), key, fn, owner)
		}},
	} {
		eachFault(t, c.name+"/", func(t *testing.T, fault storetest.Fault) {
			rt, mem, f := faulty(workers.Config{LeaseInterval: time.Second, LeaseTTL: 3 * time.Second, Limits: c.limits})
			head := newHeedless()
			_, err := c.submit(rt, "head", head.fn)
			require.NoError(t, err)
			<-head.started
			waiting, err := c.submit(rt, "waiting", result(1))
			require.NoError(t, err)

			f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Times: 1, Fault: fault, Match: func(c *storetest.Call) bool {
				return c.ID == waiting.ID && c.Next.Status.Terminal()
			}})
			unreachable := f.Add(storetest.Rule{Op: storetest.OpRenewLease, Fault: storetest.FailBefore})
			time.Sleep(4 * time.Second) // the renewals fail for the lease's whole TTL
			unreachable()
			time.Sleep(time.Second) // the abandon write's retries
			synctest.Wait()

			assert.Equal(t, 1, f.Injected(storetest.OpTransitionTask), "the abandon write failed once")
			endedAs(t, mem, waiting.ID, workers.StatusFailed, workers.CauseAbandoned) // while the head still runs
			st, err := rt.Stats(t.Context(), workers.System)
			require.NoError(t, err)
			assert.Zero(t, st.Waiting, "the waiting place freed: %+v", st)
			close(head.release)
			require.NoError(t, rt.Shutdown(t.Context()))
		})
	}
}

// storeTimeout is the bound the StoreTimeout tests set in their bubbles.
const storeTimeout = 2 * time.Second

// A run's outcome write that the store never answers is cut off after
// StoreTimeout and tried again: whether the try had not landed (Hang) or
// had landed before the store froze (HangAfter), the run ends once, as
// it would have, a StoreTimeout late. Without the bound, the run waits
// for the store for as long as the store hangs.
func TestFaultARunWriteTheStoreNeverAnswersIsCutOff(t *testing.T) {
	for _, fault := range []storetest.Fault{storetest.Hang, storetest.HangAfter} {
		t.Run(fault.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				finished := make(chan workers.Event, 2)
				rt, mem, f := faulty(workers.Config{StoreTimeout: storeTimeout, Observers: []workers.Observer{
					workers.ObserverFunc(func(_ context.Context, e workers.Event) {
						if e.Kind == workers.EventFinished {
							finished <- e
						}
					}),
				}})
				f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Fault: fault, Times: 1, Match: to(workers.StatusCompleted)})
				began := time.Now()
				sub, err := rt.Submit(context.Background(), "k", result("done"), owner)
				require.NoError(t, err)
				timeout := time.NewTimer(time.Minute)
				select {
				case e := <-finished:
					assert.Equal(t, workers.StatusCompleted, e.Status)
				case <-timeout.C:
					t.Fatal("the run's outcome write never returned")
				}
				took := time.Since(began)
				assert.GreaterOrEqual(t, took, storeTimeout, "the hung try was waited for")
				assert.Less(t, took, storeTimeout+time.Second, "the try was cut off at StoreTimeout and tried again at once")
				assert.Zero(t, f.Hung())
				assert.Equal(t, 2, f.Calls(storetest.OpTransitionTask), "the hung try and the one after it")
				endedAs(t, mem, sub.ID, workers.StatusCompleted, workers.CauseCompleted)
				require.NoError(t, rt.Shutdown(context.Background()))
				assert.Empty(t, finished, "the run ended once")
			})
		})
	}
}

// The sync loop writes a run's progress under the run's write lock: a
// progress write the store never answers, before it lands or after, is
// cut off after StoreTimeout, and holds the run's own outcome write back
// no longer than that. (Not in a synctest bubble: the outcome write
// waits on a mutex, which does not let a bubble's clock advance.)
func TestFaultAProgressWriteTheStoreNeverAnswersIsCutOff(t *testing.T) {
	for _, fault := range []storetest.Fault{storetest.Hang, storetest.HangAfter} {
		t.Run(fault.String(), func(t *testing.T) {
			rt, mem, f := faulty(workers.Config{StoreTimeout: 2 * time.Second, SyncInterval: 20 * time.Millisecond})
			f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Fault: fault, Times: 1, Match: func(c *storetest.Call) bool {
				return c.Next.Status == workers.StatusRunning && c.Next.Progress == 50
			}})
			proceed := make(chan struct{})
			sub, err := rt.Submit(context.Background(), "k", func(_ context.Context, task *workers.Task) (any, error) {
				task.SetProgress(50)
				<-proceed
				return "done", nil
			}, owner)
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			require.NoError(t, f.WaitInjected(ctx, storetest.OpTransitionTask, 1), "the progress write hangs")
			// Injected, the write counts as hung a moment later, once it waits.
			for f.Hung() == 0 {
				require.NoError(t, ctx.Err(), "the progress write never hung")
				time.Sleep(time.Millisecond) // polling, with ctx's deadline
			}
			require.Equal(t, 1, f.Hung(), "the progress write still hangs as the callback returns")
			close(proceed)
			snap, err := rt.Wait(ctx, sub.ID, owner)
			require.NoError(t, err, "the run's outcome never landed")
			assert.Equal(t, workers.StatusCompleted, snap.Status)
			assert.Zero(t, f.Hung())
			endedAs(t, mem, sub.ID, workers.StatusCompleted, workers.CauseCompleted)
			require.NoError(t, rt.Shutdown(ctx))
		})
	}
}

// A pass of recovery, or of cleanup, that the store never answers is cut
// off after StoreTimeout: the next pass does the work.
func TestFaultALoopPassTheStoreNeverAnswersIsCutOff(t *testing.T) {
	ctx := context.Background()
	dead, finished := deadRun, finishedTask
	recovery := workers.Config{RecoverInterval: time.Second}
	cleanup := workers.Config{CleanupInterval: time.Second, Retention: time.Millisecond}
	for _, c := range []struct {
		loop  string
		cfg   workers.Config
		hang  storetest.Op
		fault storetest.Fault
		// leave leaves work for the loop and returns whether it is done.
		leave func(*testing.T, *workers.Runtime[workers.Store], *workers.MemStore) func() bool
	}{
		{"recovery's read", recovery, storetest.OpListTasks, storetest.Hang, dead},
		{"recovery's write", recovery, storetest.OpTransitionTask, storetest.Hang, dead},
		{"recovery's write, landed", recovery, storetest.OpTransitionTask, storetest.HangAfter, dead},
		{"cleanup", cleanup, storetest.OpDeleteFinished, storetest.Hang, finished},
		{"cleanup, landed", cleanup, storetest.OpDeleteFinished, storetest.HangAfter, finished},
	} {
		t.Run(c.loop, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c.cfg.StoreTimeout = storeTimeout
				rt, mem, f := faulty(c.cfg)
				require.NoError(t, rt.Start(ctx))
				done := c.leave(t, rt, mem)
				f.Add(storetest.Rule{Op: c.hang, Fault: c.fault, Times: 1})
				time.Sleep(time.Second) // the loop's first pass
				synctest.Wait()
				require.Equal(t, 1, f.Hung(), "the pass hangs")
				// Done, and the hung call cut off: a landed call does the
				// work and still hangs.
				for deadline := time.Now().Add(time.Minute); !done() || f.Hung() > 0; time.Sleep(100 * time.Millisecond) {
					require.True(t, time.Now().Before(deadline), "the %s hung for good", c.loop)
				}
				require.NoError(t, rt.Shutdown(ctx))
			})
		})
	}
}

// A record whose write never lands (a row lock a stuck transaction
// holds), or lands and then never answers, holds back no other: every
// pass cuts its write off, and goes on with the records after it. The
// stuck record listed first is the case that needs this; listed last, it
// is the control, which a pass that stopped at the stuck record passes
// too. A write that landed before it hung (HangAfter) leaves the record
// ended already, so only Hang's record is ended by a pass after the heal.
func TestFaultARecordRecoveryCannotEndHoldsBackNoOther(t *testing.T) {
	for _, fault := range []storetest.Fault{storetest.Hang, storetest.HangAfter} {
		for _, stuckFirst := range []bool{true, false} {
			synctest.Test(t, func(t *testing.T) {
				ctx := context.Background()
				rt, mem, f := faulty(workers.Config{StoreTimeout: storeTimeout, RecoverInterval: time.Second})
				require.NoError(t, rt.Start(ctx))
				var ids []string
				for i, key := range []string{"dead-a", "dead-b"} {
					id := scoped(t, key)
					created := time.Now().UTC().Truncate(time.Microsecond).Add(time.Duration(i) * time.Millisecond)
					require.NoError(t, mem.InsertTask(ctx, workers.Record{
						ID: id, RunID: "gone-instance." + key, Watchers: []string{"alice"}, CreatedAt: created,
						State: workers.State{Status: workers.StatusRunning, StartedAt: created, Attempt: 1},
					}))
					ids = append(ids, id)
				}
				stuck, other := ids[0], ids[1] // listed in this order
				if !stuckFirst {
					stuck, other = other, stuck
				}
				f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Fault: fault, Match: func(c *storetest.Call) bool { return c.ID == stuck }})
				time.Sleep(time.Minute) // many recovery passes
				synctest.Wait()
				rec, err := mem.GetTask(ctx, other)
				require.NoError(t, err)
				assert.Truef(t, rec.Status.Terminal(), "%v, stuck record listed first: %v; the other is %s", fault, stuckFirst, rec.Status)
				rec, err = mem.GetTask(ctx, stuck)
				require.NoError(t, err)
				if fault == storetest.HangAfter {
					assert.Equal(t, workers.StatusFailed, rec.Status, "its write landed before it hung")
					require.NoError(t, rt.Shutdown(ctx))
					return
				}
				assert.Equal(t, workers.StatusRunning, rec.Status, "its write never lands")
				f.Heal()
				time.Sleep(2 * time.Second) // a pass after the heal
				synctest.Wait()
				rec, err = mem.GetTask(ctx, stuck)
				require.NoError(t, err)
				assert.Equal(t, workers.StatusFailed, rec.Status, "recovered once its write lands")
				require.NoError(t, rt.Shutdown(ctx))
			})
		}
	}
}

// StoreTimeout bounds each call of the recovery loop, not its whole pass:
// a pass whose calls each answer within the bound recovers, however
// long the calls take together.
func TestFaultARecoveryPassLongerThanStoreTimeoutRecovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		rt, mem, f := faulty(workers.Config{StoreTimeout: storeTimeout, RecoverInterval: time.Second})
		require.NoError(t, rt.Start(ctx))
		f.Add(storetest.Rule{Op: storetest.OpListTasks, Fault: storetest.Delay, Delay: storeTimeout * 3 / 4})
		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Fault: storetest.Delay, Delay: storeTimeout * 3 / 4})
		id, created := scoped(t, "dead"), time.Now().UTC().Truncate(time.Microsecond)
		require.NoError(t, mem.InsertTask(ctx, workers.Record{
			ID: id, RunID: "gone-instance.1", Watchers: []string{"alice"}, CreatedAt: created,
			State: workers.State{Status: workers.StatusRunning, StartedAt: created, Attempt: 1},
		}))
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
			rec, err := mem.GetTask(ctx, id)
			require.NoError(t, err)
			if rec.Status.Terminal() {
				break
			}
			require.True(t, time.Now().Before(deadline), "no recovery pass got through")
		}
		endedAs(t, mem, id, workers.StatusFailed, workers.CauseAbandoned)
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// A submission whose insert failed and whose run is retired (its end
// written by a write that retries, since the insert may have landed)
// keeps its place under Limits until that run settles: a tenant retrying
// through a store outage (writes and reads failing alike, so that no
// read tells whether the insert landed) cannot pile up runs beyond its
// caps.
func TestFaultARetiredRunKeepsItsPlaceUnderLimits(t *testing.T) {
	for _, insert := range []storetest.Fault{storetest.FailBefore, storetest.FailAfter} {
		t.Run("insert "+insert.String(), func(t *testing.T) { retiredRunKeepsItsPlace(t, insert) })
	}
}

// retiredRunKeepsItsPlace is TestFaultARetiredRunKeepsItsPlaceUnderLimits
// with inserts that fail as insert says.
func retiredRunKeepsItsPlace(t *testing.T, insert storetest.Fault) {
	synctest.Test(t, func(t *testing.T) {
		rt, _, f := faulty(workers.Config{Limits: workers.Limits{MaxRunning: 1, Owner: workers.OwnerLimits{Running: 1, Waiting: 1}}})
		f.Add(storetest.Rule{Op: storetest.OpInsertTask, Fault: insert})
		stop := f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Fault: storetest.FailBefore})
		if insert == storetest.FailBefore {
			// The reads of the retired runs' records fail too: one that
			// answered would find no record, and end its run at once.
			retired := map[string]bool{scoped(t, "0"): true, scoped(t, "1"): true}
			stopWrites, stopReads := stop, f.Add(storetest.Rule{Op: storetest.OpGetTask, Fault: storetest.FailBefore,
				Match: func(c *storetest.Call) bool { return retired[c.ID] }})
			stop = func() { stopWrites(); stopReads() }
		}
		var injected, refused int
		for i := range 20 {
			_, err := rt.Submit(context.Background(), strconv.Itoa(i), result(1), owner)
			switch {
			case errors.Is(err, storetest.ErrInjected):
				injected++
			case errors.Is(err, workers.ErrQuotaExceeded):
				refused++
			default:
				t.Fatalf("submission %d: %v", i, err)
			}
		}
		assert.Equal(t, 2, injected, "a running place and a waiting place, each held by a retired run")
		assert.Equal(t, 18, refused)
		st, err := rt.Stats(context.Background(), workers.System)
		require.NoError(t, err)
		assert.Equal(t, 2, st.Running+st.Waiting, "both places are counted: %+v", st)

		stop() // the retired runs' ends land, and their places free
		f.Clear()
		time.Sleep(5 * time.Second)
		synctest.Wait()
		st, err = rt.Stats(context.Background(), workers.System)
		require.NoError(t, err)
		assert.Zero(t, st.Running+st.Waiting)
		_, err = rt.Submit(context.Background(), "after", result(1), owner)
		require.NoError(t, err)
		require.NoError(t, rt.Shutdown(context.Background()))
	})
}

// sharedNoNotices is a MemStore shared by processes without notices:
// the sync loop alone tells a run that another process ended its
// record.
type sharedNoNotices struct {
	workers.Store
	workers.Leaser
}

// The sync loop's read of a run's record, which the store never answers,
// is cut off after StoreTimeout: a later pass reads it again and cancels
// the run another process cancelled. Without the bound, the loop would
// wait on that read for as long as the store hangs.
func TestFaultASyncReadTheStoreNeverAnswersIsCutOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &storetest.Faults{}
		mem := workers.NewMemStore()
		rt := workers.NewRuntime(storetest.Faulty(sharedNoNotices{mem, mem}, f),
			workers.Config{Logger: quiet, StoreTimeout: storeTimeout, SyncInterval: time.Second})
		ctx := context.Background()
		cancelled := make(chan error, 1)
		sub, err := rt.Submit(ctx, "k", func(ctx context.Context, _ *workers.Task) (any, error) {
			<-ctx.Done()
			cancelled <- context.Cause(ctx)
			return nil, ctx.Err()
		}, owner)
		require.NoError(t, err)
		synctest.Wait()
		// Another process cancels the run: a write to the shared records.
		st := workers.State{Status: workers.StatusCancelled, Cause: workers.CauseCancelled, CompletedAt: time.Now()}
		ok, err := mem.TransitionTask(ctx, sub.ID, sub.RunID, liveStates, st)
		require.NoError(t, err)
		require.True(t, ok)
		f.Add(storetest.Rule{Op: storetest.OpGetTask, Fault: storetest.Hang, Times: 1})
		time.Sleep(time.Second) // the sync loop's pass, whose read hangs
		synctest.Wait()
		require.Equal(t, 1, f.Hung(), "the sync read hangs")
		timeout := time.NewTimer(time.Minute)
		select {
		case cause := <-cancelled:
			assert.ErrorIs(t, cause, workers.ErrCancelled)
		case <-timeout.C:
			t.Fatal("the sync loop never read the record again")
		}
		assert.Zero(t, f.Hung())
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// A queue item cancelled in another process while it waits reports its
// end here once, also when the read that finds that end fails, before it
// reaches the store or after. Over a store without notices that read
// follows its start, fenced out at its turn, and is tried again. Over one
// with notices it is the check the notice asks for: when it fails, the
// item waits for its turn, and its fenced-out start reports the end.
func TestFaultAWaitingItemEndedElsewhereReportsItsEndThroughAFailedRead(t *testing.T) {
	for _, notices := range []bool{false, true} {
		for _, fault := range []storetest.Fault{storetest.FailBefore, storetest.FailAfter} {
			t.Run(fmt.Sprintf("notices=%v/%s", notices, fault), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					var mu sync.Mutex
					var finished []workers.Event
					ends := func(id string) []workers.Event {
						mu.Lock()
						defer mu.Unlock()
						var out []workers.Event
						for _, e := range finished {
							if e.TaskID == id {
								out = append(out, e)
							}
						}
						return out
					}
					f := &storetest.Faults{}
					mem := workers.NewMemStore()
					var s workers.Store = struct{ workers.Store }{mem}
					if notices {
						s = mem
					}
					rt := workers.NewRuntime(storetest.Faulty(s, f), workers.Config{Logger: quiet, Observers: []workers.Observer{
						workers.ObserverFunc(func(_ context.Context, e workers.Event) {
							if e.Kind == workers.EventFinished {
								mu.Lock()
								finished = append(finished, e)
								mu.Unlock()
							}
						}),
					}})
					there := workers.NewRuntime(mem, workers.Config{Logger: quiet})
					release := make(chan struct{})
					_, err := rt.SubmitSequential(context.Background(), "q", "head", func(context.Context, *workers.Task) (any, error) {
						<-release
						return nil, nil
					}, owner)
					require.NoError(t, err)
					behind, err := rt.SubmitSequential(context.Background(), "q", "behind", result(1), owner)
					require.NoError(t, err)
					synctest.Wait()

					f.Add(storetest.Rule{Op: storetest.OpGetTask, Times: 1, Fault: fault, Match: func(c *storetest.Call) bool { return c.ID == behind.ID }})
					require.NoError(t, there.Cancel(context.Background(), behind.ID, owner))
					synctest.Wait()
					if notices {
						require.Equal(t, 1, f.Injected(storetest.OpGetTask), "the notice's check read failed")
						require.Empty(t, ends(behind.ID), "no end reported before the item's turn")
					}
					close(release)
					synctest.Wait()
					time.Sleep(time.Second) // the read's retry
					require.NoError(t, rt.Shutdown(context.Background()))
					require.NoError(t, there.Shutdown(context.Background()))

					assert.Equal(t, 1, f.Injected(storetest.OpGetTask), "the read failed once")
					got := ends(behind.ID)
					require.Len(t, got, 1, "finished events of the item")
					assert.Equal(t, workers.StatusCancelled, got[0].Status)
					assert.Equal(t, workers.CauseCancelled, got[0].Cause)
				})
			})
		}
	}
}

// A registration whose store calls hang holds its task's lock for as
// long as its own caller's context allows, which may be for ever. Every
// other wait for that lock ends with its own bound: a Submit or Cancel of
// the key with its caller's context, the recovery loop's with
// StoreTimeout, after which the pass goes on to the records after it and
// Shutdown ends the loop.
func TestFaultAHungRegistrationHoldsNoOtherCallerPastItsBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		rt, mem, f := faulty(workers.Config{StoreTimeout: storeTimeout, RecoverInterval: time.Second})
		require.NoError(t, rt.Start(ctx))
		sub, err := rt.Submit(ctx, "mine", result(nil), owner)
		require.NoError(t, err)
		instance := workers.InstanceOf(sub.RunID)

		// Two live records no run holds: one of this runtime's own
		// instance (a run it lost, say), listed first, and one of an
		// instance long gone.
		held, dead := scoped(t, "held"), scoped(t, "dead")
		created := time.Now().UTC().Truncate(time.Microsecond).Add(-time.Hour)
		for i, r := range []struct{ id, runID string }{{held, instance + ".900000"}, {dead, "gone-instance.1"}} {
			at := created.Add(time.Duration(i) * time.Millisecond)
			require.NoError(t, mem.InsertTask(ctx, workers.Record{
				ID: r.id, RunID: r.runID, Watchers: []string{"alice"}, CreatedAt: at,
				State: workers.State{Status: workers.StatusRunning, StartedAt: at, Attempt: 1},
			}))
		}
		// A submission of the held key, with no deadline, whose read of
		// the record it collided with never comes back.
		f.Add(storetest.Rule{Op: storetest.OpGetTask, Fault: storetest.Hang, Match: func(c *storetest.Call) bool { return c.ID == held }})
		hung := make(chan error, 1)
		go func() {
			_, err := rt.Submit(ctx, "held", result(nil), owner)
			hung <- err
		}()
		synctest.Wait()

		for _, call := range []struct {
			name string
			do   func(context.Context) error
		}{
			{"Submit", func(ctx context.Context) error { _, err := rt.Submit(ctx, "held", result(nil), owner); return err }},
			{"Cancel", func(ctx context.Context) error { return rt.Cancel(ctx, held, owner) }},
		} {
			bounded, cancel := context.WithTimeout(ctx, time.Second)
			start := time.Now()
			done := make(chan error, 1)
			go func() { done <- call.do(bounded) }()
			select {
			case err := <-done:
				assert.ErrorIs(t, err, context.DeadlineExceeded, call.name)
				assert.Equal(t, time.Second, time.Since(start), "a %s waits for the key's lock as long as its context allows", call.name)
			case <-time.After(time.Minute):
				t.Errorf("a %s with a deadline of a second still waits for the key's lock after a minute", call.name)
				cancel()
				f.Heal() // so that the bubble's goroutines end
				<-hung
				require.NoError(t, rt.Shutdown(ctx))
				return
			}
			cancel()
		}

		time.Sleep(time.Minute) // many recovery passes, all while the submission hangs
		synctest.Wait()
		rec, err := mem.GetTask(ctx, dead)
		require.NoError(t, err)
		assert.Equal(t, workers.StatusFailed, rec.Status, "recovery goes on past the record whose lock is held")
		select {
		case err := <-hung:
			t.Fatalf("the hung submission returned: %v", err)
		default:
		}

		shut, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		err = rt.Shutdown(shut)
		f.Heal()
		t.Logf("shutdown: %v; submission: %v", err, <-hung)
		synctest.Wait() // goleak, in TestMain, sees what Shutdown left running
	})
}

// A run abandoned when the lease was lost, whose callback ignores its
// context, is ended by its own runtime's recovery once the store answers,
// whether or not the lease is back: with the lease regained, no other
// replica would recover it, and its record would stay RUNNING for as long
// as the callback runs, joined by every submission of its key elsewhere
// and replaced by one here.
//
// Recovery's write of that end may fail, before it lands or after: the
// next pass ends the record, or finds it ended. Either way the observers
// hear of that end once, from the recovery, and not again from the run's
// fenced-out write.
func TestFaultARunAbandonedWithTheLeaseEndsOnceTheLeaseIsBack(t *testing.T) {
	for _, fault := range []storetest.Fault{0, storetest.FailBefore, storetest.FailAfter} {
		name := "no fault"
		if fault != 0 {
			name = fault.String()
		}
		t.Run(name, func(t *testing.T) { abandonedRunEndsOnceTheLeaseIsBack(t, fault) })
	}
}

func abandonedRunEndsOnceTheLeaseIsBack(t *testing.T, fault storetest.Fault) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		ends := map[string][]workers.EventKind{} // by run id
		obs := workers.ObserverFunc(func(_ context.Context, e workers.Event) {
			if e.Kind == workers.EventFinished || e.Kind == workers.EventRecovered {
				mu.Lock()
				ends[e.RunID] = append(ends[e.RunID], e.Kind)
				mu.Unlock()
			}
		})
		cfg := workers.Config{LeaseInterval: time.Second, LeaseTTL: 3 * time.Second, Observers: []workers.Observer{obs}}
		rt, mem, f := faulty(cfg)
		require.NoError(t, rt.Start(t.Context()))
		run := newHeedless()
		sub, err := rt.Submit(t.Context(), "stubborn", run.fn, owner)
		require.NoError(t, err)
		<-run.started

		if fault != 0 {
			f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Times: 1, Fault: fault, Match: func(c *storetest.Call) bool {
				return c.ID == sub.ID && c.Next.Cause == workers.CauseAbandoned
			}})
		}
		unreachable := f.Add(storetest.Rule{Op: storetest.OpRenewLease, Fault: storetest.FailBefore})
		time.Sleep(4 * time.Second) // the renewals fail for the lease's whole TTL
		unreachable()
		time.Sleep(3 * time.Second) // renewals land again, and recovery passes run
		synctest.Wait()
		if fault != 0 {
			assert.Equal(t, 1, f.Injected(storetest.OpTransitionTask), "recovery's write failed once")
		}
		live, err := mem.LiveInstances(t.Context())
		require.NoError(t, err)
		require.Contains(t, live, workers.InstanceOf(sub.RunID), "the lease is back")

		rec, err := mem.GetTask(t.Context(), sub.ID)
		require.NoError(t, err)
		assert.Equal(t, workers.StatusFailed, rec.Status, "ended while the callback still runs")
		assert.Equal(t, workers.CauseAbandoned, rec.Cause)
		waiting, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		snap, err := rt.Wait(waiting, sub.ID, owner)
		cancel()
		if err != nil || rec.Status != workers.StatusFailed {
			t.Errorf("Wait: %v", err)
			close(run.release) // so that the bubble's goroutines end
			require.NoError(t, rt.Shutdown(t.Context()))
			return
		}
		assert.Equal(t, workers.StatusFailed, snap.Status)

		cfg.Logger = quiet
		peer := workers.NewRuntime(mem, cfg)
		again, err := peer.Submit(t.Context(), "stubborn", result(1), owner)
		require.NoError(t, err)
		assert.False(t, again.Joined, "a submission elsewhere does not join the abandoned run")
		_, err = peer.Wait(t.Context(), again.ID, owner) // before peer's Shutdown, which would cancel it if it had not begun
		require.NoError(t, err)

		close(run.release)
		require.NoError(t, rt.Shutdown(t.Context()))
		require.NoError(t, peer.Shutdown(t.Context()))
		rec, err = mem.GetTask(t.Context(), sub.ID)
		require.NoError(t, err)
		assert.Equal(t, again.RunID, rec.RunID, "the late callback's result lands nowhere")
		assert.Equal(t, workers.StatusCompleted, rec.Status)
		// The recovery reported the run's end; the run's own write,
		// fenced out once its callback returned, reported nothing more.
		mu.Lock()
		defer mu.Unlock()
		assert.Equal(t, []workers.EventKind{workers.EventRecovered}, ends[sub.RunID], "the ends the observers heard of the abandoned run")
	})
}

// A run Shutdown left executing, recovered elsewhere since, reads its
// record once its callback returns, for the observers' end. That read
// may fail: a failure that passes is tried again, and the observers hear
// the end; one that lasts gives up within the last write's bound, and
// they hear nothing, with no goroutine left behind.
func TestFaultTheReadOfARunsEndAfterShutdownMayFail(t *testing.T) {
	for _, lasting := range []bool{false, true} {
		t.Run(fmt.Sprintf("lasting=%v", lasting), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var mu sync.Mutex
				var finished []workers.Event
				cfg := workers.Config{LeaseInterval: time.Second, LeaseTTL: 3 * time.Second, Logger: quiet}
				withObserver := cfg
				withObserver.Observers = []workers.Observer{workers.ObserverFunc(func(_ context.Context, e workers.Event) {
					if e.Kind == workers.EventFinished {
						mu.Lock()
						finished = append(finished, e)
						mu.Unlock()
					}
				})}
				f := &storetest.Faults{}
				mem := workers.NewMemStore()
				here, peer := workers.NewRuntime(storetest.Faulty(mem, f), withObserver), workers.NewRuntime(mem, cfg)
				require.NoError(t, peer.Start(t.Context()))
				run := newHeedless()
				sub, err := here.Submit(t.Context(), "stubborn", run.fn, owner)
				require.NoError(t, err)
				<-run.started
				short, cancel := context.WithTimeout(t.Context(), time.Second)
				defer cancel()
				require.Error(t, here.Shutdown(short), "the run is left executing")
				time.Sleep(10 * time.Second) // the lease expires, and the peer recovers the run
				synctest.Wait()
				endedAs(t, mem, sub.ID, workers.StatusFailed, workers.CauseAbandoned)

				rule := storetest.Rule{Op: storetest.OpGetTask, Fault: storetest.FailBefore, Match: func(c *storetest.Call) bool { return c.ID == sub.ID }}
				if !lasting {
					rule.Times = 1
				}
				f.Add(rule)
				close(run.release)
				time.Sleep(time.Minute) // past the last write's bound
				synctest.Wait()
				assert.Positive(t, f.Injected(storetest.OpGetTask), "the read failed")
				mu.Lock()
				defer mu.Unlock()
				if lasting {
					assert.Empty(t, finished, "no end the runtime could not read")
				} else if assert.Len(t, finished, 1, "the end, read again") {
					assert.Equal(t, workers.CauseAbandoned, finished[0].Cause)
				}
				require.NoError(t, peer.Shutdown(t.Context()))
			})
		})
	}
}

// deadRun leaves in mem the run of an instance that holds no lease, for
// recovery, and returns whether recovery has ended it.
func deadRun(t *testing.T, _ *workers.Runtime[workers.Store], mem *workers.MemStore) func() bool {
	ctx := context.Background()
	id, created := scoped(t, "dead"), time.Now().UTC().Truncate(time.Microsecond)
	require.NoError(t, mem.InsertTask(ctx, workers.Record{
		ID: id, RunID: "gone-instance.1", Watchers: []string{"alice"}, CreatedAt: created,
		State: workers.State{Status: workers.StatusRunning, StartedAt: created, Attempt: 1},
	}))
	return func() bool {
		rec, err := mem.GetTask(ctx, id)
		require.NoError(t, err)
		return rec.Status == workers.StatusFailed && rec.Cause == workers.CauseAbandoned
	}
}

// finishedTask runs a task to its end on rt, for cleanup, and returns
// whether cleanup has deleted its record from mem.
func finishedTask(t *testing.T, rt *workers.Runtime[workers.Store], mem *workers.MemStore) func() bool {
	ctx := context.Background()
	done, err := rt.Submit(ctx, "done", result("r"), owner)
	require.NoError(t, err)
	_, err = rt.Wait(ctx, done.ID, owner)
	require.NoError(t, err)
	return func() bool {
		_, err := mem.GetTask(ctx, done.ID)
		return errors.Is(err, workers.ErrNotFound)
	}
}
