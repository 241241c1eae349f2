package workers_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/storetest"
)

// A run whose retry write (RUNNING, attempt 2) fails, whether before it
// lands or after, while Shutdown cancels it does not begin another
// attempt once the store answers again: it records the cancellation
// instead.
func TestFaultNoRetryAttemptBeginsAfterTheRunWasCancelled(t *testing.T) {
	for _, fault := range []storetest.Fault{storetest.FailBefore, storetest.FailAfter} {
		t.Run(fault.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rt, mem, f := faulty(workers.Config{ShutdownGrace: -1})
				var failing atomic.Bool
				failing.Store(true)
				f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Fault: fault, Match: func(c *storetest.Call) bool {
					return failing.Load() && c.Next.Status == workers.StatusRunning && c.Next.Attempt == 2
				}})
				var attempts, afterCancel atomic.Int32
				sub, err := rt.Submit(context.Background(), "k", func(ctx context.Context, _ *workers.Task) (any, error) {
					if ctx.Err() != nil {
						afterCancel.Add(1)
					}
					attempts.Add(1)
					return nil, errors.New("flaky")
				}, owner, workers.WithRetry(workers.RetryPolicy{MaxAttempts: 3, InitialBackoff: 10 * time.Millisecond}))
				require.NoError(t, err)
				require.NoError(t, f.WaitInjected(context.Background(), storetest.OpTransitionTask, 1), "the retry write fails")

				done := make(chan error, 1)
				go func() { done <- rt.Shutdown(context.Background()) }()
				time.Sleep(100 * time.Millisecond) // fake time: Shutdown cancelled the run; its retry write still fails
				synctest.Wait()
				failing.Store(false)
				require.NoError(t, <-done)

				assert.Zero(t, afterCancel.Load(), "an attempt started after the run was cancelled")
				assert.Equal(t, int32(1), attempts.Load())
				endedAs(t, mem, sub.ID, workers.StatusCancelled, workers.CauseShutdown)
			})
		})
	}
}

// When a run's outcome and its fallback are both refused for good, the
// run counts its record as unwritten, and Shutdown, whose ctx never ended,
// reports it with an error of its own, not one that wraps a nil cause:
// whether the refused write landed nothing (the record is left live, for
// recovery) or landed all the same (the record ended, unknown to the run).
func TestFaultShutdownErrorForRecordsTheStoreRefused(t *testing.T) {
	for _, c := range []struct {
		fault  storetest.Fault
		stored workers.Status
	}{
		{storetest.FailBefore, workers.StatusRunning},
		{storetest.FailAfter, workers.StatusCompleted},
	} {
		t.Run(c.fault.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rt, mem, f := faulty(workers.Config{})
				f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Fault: c.fault, Err: workers.ErrInvalidData,
					Match: func(c *storetest.Call) bool { return c.Next.Status.Terminal() }})
				sub, err := rt.Submit(context.Background(), "k", result("r"), owner)
				require.NoError(t, err)
				synctest.Wait()
				r, err := mem.GetTask(context.Background(), sub.ID)
				require.NoError(t, err)
				require.Equal(t, c.stored, r.Status)

				err = rt.Shutdown(context.Background())
				require.Error(t, err)
				assert.NotContains(t, err.Error(), "%!w", "Shutdown's error wraps a nil error")
				assert.Equal(t, "workers: shutdown left 0 runs or goroutines executing and 1 live records of this runtime unwritten (unwritten: "+sub.ID+"): the store refused their writes, or an earlier Shutdown or a Reset gave them up", err.Error())
				var se *workers.ShutdownError
				require.ErrorAs(t, err, &se)
				assert.Equal(t, []string{sub.ID}, se.UnwrittenIDs, "the record left, named")
				assert.Empty(t, se.ExecutingIDs)
				assert.NoError(t, se.Err, "ctx never ended")
			})
		})
	}
}

// stubborn is a MemStore whose InsertTask, TransitionTask (to a terminal
// status) and DeleteFinished each take a set time and ignore their
// context, as a database call stuck in a driver that does not watch it
// does. Shutdown's doc counts on such calls. Use it in a synctest bubble,
// where the time it takes is the fake clock's.
type stubborn struct {
	*workers.MemStore
	insert, finish, cleanup atomic.Int64 // durations; 0 = as MemStore
}

func (s *stubborn) InsertTask(ctx context.Context, rec workers.Record) error {
	time.Sleep(time.Duration(s.insert.Load()))
	return s.MemStore.InsertTask(context.WithoutCancel(ctx), rec)
}

func (s *stubborn) TransitionTask(ctx context.Context, id, runID string, from []workers.Status, next workers.State) (bool, error) {
	if next.Status.Terminal() {
		time.Sleep(time.Duration(s.finish.Load()))
		ctx = context.WithoutCancel(ctx)
	}
	return s.MemStore.TransitionTask(ctx, id, runID, from, next)
}

func (s *stubborn) DeleteFinished(ctx context.Context, cutoff time.Time) (int, error) {
	time.Sleep(time.Duration(s.cleanup.Load()))
	return s.MemStore.DeleteFinished(context.WithoutCancel(ctx), cutoff)
}

// A submission still registering when Shutdown's wait for the intake runs
// out may register its run while Shutdown waits for a background loop:
// that run is not among those Shutdown listed first, and the submission
// is no longer inside when Shutdown counts them at the end. Shutdown
// still counts the run, and does not return nil (nor release the lease)
// while it executes.
func TestFaultShutdownCountsARunRegisteredAfterItsIntakeWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &stubborn{MemStore: workers.NewMemStore()}
		rt := workers.NewRuntime(s, workers.Config{Logger: quiet, CleanupInterval: time.Second})
		require.NoError(t, rt.Start(context.Background()))
		s.cleanup.Store(int64(1080 * time.Millisecond)) // the tick at 1s returns at 2.08s
		s.insert.Store(int64(2040 * time.Millisecond))  // the insert returns at 2.04s
		s.finish.Store(int64(10 * time.Second))
		submitted := make(chan error, 1)
		var id string
		go func() {
			sub, err := rt.Submit(context.Background(), "late", result("r"), owner)
			id = sub.ID
			submitted <- err
		}()
		time.Sleep(1500 * time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond) // ends at 2s
		defer cancel()
		err := rt.Shutdown(ctx)
		require.NoError(t, <-submitted, "the submission was acknowledged")
		rec, gerr := s.MemStore.GetTask(context.Background(), id)
		require.NoError(t, gerr)
		if err == nil {
			assert.True(t, rec.Status.Terminal(), "Shutdown returned nil with the acknowledged run's record %s", rec.Status)
		}
		assert.Error(t, err, "a run was still executing when Shutdown returned")
		time.Sleep(11 * time.Second) // the stuck write returns: the bubble's goroutines end
	})
}

// A Cancel whose write fails, before it lands or after, and whose read to
// tell fails too, returns the store error. The callback, which runs in
// this very runtime, is cancelled all the same (over a store without
// notices no sync loop would ever tell it), and the record ends
// CANCELLED either way: by the cancel's write, or by the run's own.
func TestFaultCancelWhoseOutcomeIsUnknownStillCancelsTheRun(t *testing.T) {
	for _, fault := range []storetest.Fault{storetest.FailBefore, storetest.FailAfter} {
		t.Run(fault.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := &storetest.Faults{}
				mem := workers.NewMemStore()
				bare := struct{ workers.Store }{mem} // no Leaser, no Notifier
				rt := workers.NewRuntime(storetest.Faulty(bare, f), workers.Config{Logger: quiet})
				started := make(chan struct{})
				var cancelled atomic.Bool
				sub, err := rt.Submit(context.Background(), "k", func(ctx context.Context, _ *workers.Task) (any, error) {
					close(started)
					select {
					case <-ctx.Done():
						cancelled.Store(true)
						return nil, ctx.Err()
					case <-time.After(time.Hour):
						return "ran to the end", nil
					}
				}, owner)
				require.NoError(t, err)
				<-started

				var wrote atomic.Bool
				f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Times: 1, Fault: fault, Match: func(c *storetest.Call) bool {
					if c.Next.Status == workers.StatusCancelled {
						wrote.Store(true)
						return true
					}
					return false
				}})
				f.Add(storetest.Rule{Op: storetest.OpGetTask, Times: 1, Fault: storetest.FailBefore, Match: func(*storetest.Call) bool { return wrote.Load() }})

				err = rt.Cancel(context.Background(), sub.ID, owner)
				require.ErrorIs(t, err, storetest.ErrInjected, "the write and the read both failed")
				synctest.Wait()
				assert.True(t, cancelled.Load(), "the callback ran on, uncancelled")
				endedAs(t, mem, sub.ID, workers.StatusCancelled, workers.CauseCancelled)
				err = rt.Cancel(context.Background(), sub.ID, owner)
				assert.ErrorIs(t, err, workers.ErrFinished, "the record is CANCELLED")
				require.NoError(t, rt.Shutdown(context.Background()))
			})
		})
	}
}

// Two Shutdowns at once (a signal handler and a deferred call, say) both
// wait for a submission still registering: neither returns, ending the
// runtime's life and releasing the lease, before it leaves.
func TestFaultConcurrentShutdownsWaitForTheSameSubmissions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt, mem, f := faulty(workers.Config{})
		// Take the lease first, so the submission below only inserts.
		first, err := rt.Submit(context.Background(), "first", result(1), owner)
		require.NoError(t, err)
		_, err = rt.Wait(context.Background(), first.ID, owner)
		require.NoError(t, err)

		f.Add(storetest.Rule{Op: storetest.OpInsertTask, Fault: storetest.Delay, Delay: 2 * time.Second})
		submitted := make(chan struct{})
		go func() {
			defer close(submitted)
			_, _ = rt.Submit(context.Background(), "slow", result(2), owner)
		}()
		time.Sleep(100 * time.Millisecond) // the submission is in its insert

		a := make(chan error, 1)
		go func() { a <- rt.Shutdown(context.Background()) }()
		time.Sleep(100 * time.Millisecond)
		b := make(chan error, 1)
		go func() { b <- rt.Shutdown(context.Background()) }()

		errA := <-a
		// The insert, delayed 2 s, has landed: Shutdown waited for it.
		// (Whether the submitting goroutine has run on since is up to the
		// scheduler.)
		if _, err := mem.GetTask(context.Background(), scoped(t, "slow")); err != nil {
			t.Errorf("the first Shutdown returned %v while a submission was still registering: %v", errA, err)
		}
		<-submitted
		require.NoError(t, <-b)
	})
}

// A long backlog of queue items is recorded beside the grace period, with
// several writes at once, and does not take the time the runs in flight
// are given: the run executing is cancelled at the grace point, and every
// item is recorded CANCELLED within the bound, also when some of those
// writes fail before they land, or after, and are tried again.
func TestFaultShutdownRecordsALongBacklogBesideTheGracePeriod(t *testing.T) {
	for _, fault := range []storetest.Fault{storetest.Delay, storetest.FailBefore, storetest.FailAfter} {
		t.Run(fault.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rt, mem, f := faulty(workers.Config{})
				abandons := func(c *storetest.Call) bool { return c.Next.Cause == workers.CauseShutdown }
				if fault != storetest.Delay {
					f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Fault: fault, Times: 20, Match: abandons})
				}
				f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Fault: storetest.Delay, Delay: 10 * time.Millisecond, Match: abandons})
				start := time.Now()
				var cancelledAt atomic.Int64
				head, err := rt.SubmitSequential(context.Background(), "q", "head", func(ctx context.Context, _ *workers.Task) (any, error) {
					<-ctx.Done()
					cancelledAt.Store(int64(time.Since(start)))
					return nil, context.Cause(ctx)
				}, owner)
				require.NoError(t, err)
				var backlog []workers.Submission
				for i := range 200 {
					sub, err := rt.SubmitSequential(context.Background(), "q", fmt.Sprint("item-", i), func(context.Context, *workers.Task) (any, error) { return nil, nil }, owner)
					require.NoError(t, err)
					backlog = append(backlog, sub)
				}
				synctest.Wait()
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				require.NoError(t, rt.Shutdown(ctx))
				faults := 200 // each abandon write is slow
				if fault != storetest.Delay {
					faults += 20 // and twenty failed first, to be tried again
				}
				assert.GreaterOrEqual(t, f.Injected(storetest.OpTransitionTask), faults, "abandon writes that met their faults")
				assert.Equal(t, 750*time.Millisecond, time.Duration(cancelledAt.Load()), "the run in flight is cancelled at the grace point")
				endedAs(t, mem, head.ID, workers.StatusCancelled, workers.CauseShutdown)
				for _, sub := range backlog {
					endedAs(t, mem, sub.ID, workers.StatusCancelled, workers.CauseShutdown)
				}
			})
		})
	}
}

// Past Shutdown's cutoff, the items of a long backlog whose abandon
// writes had not begun are given up without a store call each: every
// such try would fail at once, its bound ended, and a backlog of
// thousands made that many calls, logs and contexts after the time
// Shutdown was given. Only the writes in flight at the cutoff (at most
// one per abandon writer) meet the store after it.
func TestFaultShutdownTriesNoAbandonWritePastItsCutoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt, mem, f := faulty(workers.Config{})
		const bound = 150 * time.Millisecond
		var start time.Time
		var past atomic.Int32 // abandon writes tried past the cutoff
		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Fault: storetest.Delay, Delay: 10 * time.Millisecond, Match: func(c *storetest.Call) bool {
			abandon := c.Next.Cause == workers.CauseShutdown && slices.Equal(c.From, []workers.Status{workers.StatusPending})
			if abandon && time.Since(start) >= bound+100*time.Millisecond {
				past.Add(1)
			}
			return abandon
		}})
		backlog := backlogBehindAHead(t, rt, 2000)

		start = time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		err := rt.Shutdown(ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		var se *workers.ShutdownError
		require.ErrorAs(t, err, &se)
		require.Greater(t, se.Unwritten, 1000, "most of the backlog is left: %v", err)
		synctest.Wait()
		assert.LessOrEqual(t, int(past.Load()), 16, "abandon writes tried past the cutoff")

		assertEachWrittenOrUnwritten(t, mem, backlog, se)
	})
}

// stuckAbandons is a MemStore whose writes recording a run cancelled by
// Shutdown take an hour and ignore their context, as a call stuck in a
// driver that does not watch it does.
type stuckAbandons struct{ *workers.MemStore }

func (s stuckAbandons) TransitionTask(ctx context.Context, id, runID string, from []workers.Status, next workers.State) (bool, error) {
	if next.Cause == workers.CauseShutdown && slices.Equal(from, []workers.Status{workers.StatusPending}) {
		time.Sleep(time.Hour)
		ctx = context.WithoutCancel(ctx)
	}
	return s.MemStore.TransitionTask(ctx, id, runID, from, next)
}

// Shutdown returns by its deadline plus the slack even when a queue
// item's abandon write is stuck in a store call that ignores its
// context: the item counts as left executing, and its write lands when
// the call returns.
func TestFaultShutdownDoesNotWaitForAStuckAbandonWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := stuckAbandons{workers.NewMemStore()}
		rt := workers.NewRuntime(s, workers.Config{Logger: quiet})
		_, behind := headAndBehind(t, rt)

		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		err := rt.Shutdown(ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Contains(t, err.Error(), "left 1 runs or goroutines executing")
		var se *workers.ShutdownError
		require.ErrorAs(t, err, &se)
		assert.Equal(t, []string{behind.ID}, se.ExecutingIDs, "the item whose write is stuck, named: %+v", se)
		assert.LessOrEqual(t, time.Since(start), 2*time.Second, "Shutdown returns by its deadline plus the slack")

		time.Sleep(time.Hour) // the stuck call returns
		synctest.Wait()
		endedAs(t, s, behind.ID, workers.StatusCancelled, workers.CauseShutdown)
	})
}

// A queue item whose abandon write the store never answers (it honours
// its context) is given up at the cutoff and counted once, among the
// records left unwritten, not also as left executing.
func TestFaultShutdownCountsAnItemItCouldNotRecordOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt, mem, f := faulty(workers.Config{})
		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Fault: storetest.Hang, Match: func(c *storetest.Call) bool {
			return c.Next.Cause == workers.CauseShutdown && slices.Equal(c.From, []workers.Status{workers.StatusPending})
		}})
		head, behind := headAndBehind(t, rt)

		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		err := rt.Shutdown(ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Contains(t, err.Error(), "left 0 runs or goroutines executing and 1 live records of this runtime unwritten")
		endedAs(t, mem, head.ID, workers.StatusCancelled, workers.CauseShutdown)
		r, err := mem.GetTask(context.Background(), behind.ID)
		require.NoError(t, err)
		assert.Equal(t, workers.StatusPending, r.Status, "left for recovery")
	})
}

// headAndBehind submits to queue "q" of rt a head that runs until its
// context ends, and an item behind it, and waits, in a synctest bubble,
// until the head runs.
func headAndBehind[S workers.Store](t *testing.T, rt *workers.Runtime[S]) (head, behind workers.Submission) {
	t.Helper()
	head, err := rt.SubmitSequential(context.Background(), "q", "head", func(ctx context.Context, _ *workers.Task) (any, error) {
		<-ctx.Done()
		return nil, context.Cause(ctx)
	}, owner)
	require.NoError(t, err)
	behind, err = rt.SubmitSequential(context.Background(), "q", "behind", result(1), owner)
	require.NoError(t, err)
	synctest.Wait()
	return head, behind
}

// A run whose callback returned before Shutdown began, but whose outcome
// write keeps failing, gives that write up at Shutdown's cutoff, as
// Shutdown counts it: among the records left unwritten, with no goroutine
// left executing. No try of the write is made past the cutoff, where a
// store that hangs would hold it, and the run's goroutine, past Shutdown's
// return.
func TestFaultAnOutcomeWriteIsNotTriedPastShutdownsCutoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt, mem, f := faulty(workers.Config{})
		start := time.Now()
		const bound = time.Second
		// The tries fail at once until Shutdown's ctx ends, and hang from
		// then on, as a store that goes down does.
		down := start.Add(bound)
		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Fault: storetest.FailBefore, Match: func(c *storetest.Call) bool {
			return c.Next.Status.Terminal() && time.Now().Before(down)
		}})
		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Fault: storetest.Hang, Match: func(c *storetest.Call) bool {
			return c.Next.Status.Terminal()
		}})
		sub, err := rt.Submit(context.Background(), "k", result("done"), owner)
		require.NoError(t, err)
		synctest.Wait() // the callback returned; its outcome write fails, and is tried again

		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		err = rt.Shutdown(ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Contains(t, err.Error(), "left 0 runs or goroutines executing and 1 live records of this runtime unwritten")
		var se *workers.ShutdownError
		require.ErrorAs(t, err, &se)
		assert.Equal(t, []string{sub.ID}, se.UnwrittenIDs, "the record left, named")
		assert.LessOrEqual(t, time.Since(start), bound+100*time.Millisecond, "Shutdown outlived its bound")
		synctest.Wait()
		assert.Zero(t, f.Hung(), "a try of the run's outcome write outlived Shutdown")
		r, err := mem.GetTask(context.Background(), sub.ID)
		require.NoError(t, err)
		assert.Equal(t, workers.StatusRunning, r.Status, "left for recovery")
	})
}

// A run whose retry write (RUNNING, attempt 2) the store holds up when
// Shutdown begins has no callback in flight, as a run in its backoff has
// none: once the store answers and the write lands, it begins no other
// attempt mid-teardown, within the grace or not, and ends CANCELLED by
// the shutdown.
func TestShutdownStartsNoAttemptWhoseRetryWriteLandsAfterItBegan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt, mem, f := faulty(workers.Config{})
		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Times: 1, Fault: storetest.Hang, Match: func(c *storetest.Call) bool {
			return c.Next.Status == workers.StatusRunning && c.Next.Attempt == 2
		}})
		var attempts, afterShutdown atomic.Int32
		var shutting atomic.Bool
		sub, err := rt.Submit(context.Background(), "k", func(ctx context.Context, _ *workers.Task) (any, error) {
			if shutting.Load() {
				afterShutdown.Add(1)
			}
			if attempts.Add(1) == 1 {
				return nil, errors.New("flaky")
			}
			<-ctx.Done()
			return nil, context.Cause(ctx)
		}, owner, workers.WithRetry(workers.RetryPolicy{MaxAttempts: 3, InitialBackoff: 10 * time.Millisecond}))
		require.NoError(t, err)
		require.NoError(t, f.WaitInjected(context.Background(), storetest.OpTransitionTask, 1), "the retry write hangs")
		synctest.Wait()

		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		done := make(chan error, 1)
		shutting.Store(true)
		go func() { done <- rt.Shutdown(sctx) }()
		synctest.Wait() // Shutdown began, and waits out the grace
		f.Release()     // the store answers: the retry write lands
		synctest.Wait()
		assert.Zero(t, afterShutdown.Load(), "attempts begun after Shutdown began")
		require.NoError(t, <-done)
		assert.EqualValues(t, 1, attempts.Load(), "attempts")
		endedAs(t, mem, sub.ID, workers.StatusCancelled, workers.CauseShutdown)
	})
}

// A Cancel whose write fails before it lands, and whose read to tell fails
// too, still cancels the run here (as documented), whose own write then
// records the cancel. That record must say what the cancel's write would
// have said: CANCELLED by the user, with who cancelled and why. It says
// "cancelled by System" instead (CancelledBy empty, no reason), and a queue
// item so cancelled is then recorded by Shutdown as "Cancelled by worker
// shutdown": the drain overwrites a person's cancel. The plainest way to
// get there needs one fault only: a Cancel made under a request's deadline
// that the store's write outlasts (a row lock, a slow database).
func TestFaultACancelThatCannotTellItsOutcomeKeepsWhoCancelledAndWhy(t *testing.T) {
	// Each path fails the cancel's write before it lands, or after
	// (landed), where the run's own end is then fenced out.
	for _, path := range []string{"running", "queued", "deadline", "running-landed", "queued-landed"} {
		t.Run(path, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := &storetest.Faults{}
				mem := workers.NewMemStore()
				bare := struct{ workers.Store }{mem} // no Leaser, no Notifier
				rt := workers.NewRuntime(storetest.Faulty(bare, f), workers.Config{Logger: quiet, ShutdownGrace: -1})
				var sub workers.Submission
				if strings.HasPrefix(path, "queued") {
					_, sub = headAndBehind(t, rt)
				} else {
					started := make(chan struct{})
					var err error
					sub, err = rt.Submit(context.Background(), "k", func(ctx context.Context, _ *workers.Task) (any, error) {
						close(started)
						<-ctx.Done()
						return nil, ctx.Err()
					}, owner)
					require.NoError(t, err)
					<-started
				}

				cctx := context.Background()
				if path == "deadline" {
					// The cancel's write outlasts the request's deadline;
					// the read to tell then fails with the same deadline.
					f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Times: 1, Fault: storetest.Hang, Match: func(c *storetest.Call) bool {
						return c.ID == sub.ID && c.Next.Status == workers.StatusCancelled
					}})
					var cancel context.CancelFunc
					cctx, cancel = context.WithTimeout(cctx, time.Second)
					defer cancel()
				} else {
					var wrote atomic.Bool
					fault := storetest.FailBefore
					if strings.HasSuffix(path, "landed") {
						fault = storetest.FailAfter
					}
					f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Times: 1, Fault: fault, Match: func(c *storetest.Call) bool {
						if c.ID == sub.ID && c.Next.Status == workers.StatusCancelled {
							wrote.Store(true)
							return true
						}
						return false
					}})
					f.Add(storetest.Rule{Op: storetest.OpGetTask, Times: 1, Fault: storetest.FailBefore, Match: func(c *storetest.Call) bool {
						return c.ID == sub.ID && wrote.Load()
					}})
				}
				err := rt.Cancel(cctx, sub.ID, owner, workers.WithReason("no longer needed"))
				require.Error(t, err, "the write and the read both failed")
				synctest.Wait()
				if strings.HasPrefix(path, "queued") {
					// The item, cancelled here, waits behind the head until
					// Shutdown drains the queue.
					require.NoError(t, rt.Shutdown(context.Background()))
				}
				r, err := mem.GetTask(context.Background(), sub.ID)
				require.NoError(t, err)
				assert.Equal(t, workers.StatusCancelled, r.Status)
				assert.Equal(t, workers.CauseCancelled, r.Cause, "recorded %q", r.Error)
				assert.Equal(t, "alice", r.CancelledBy, "the record reads as a cancel by System")
				assert.Equal(t, "no longer needed", r.CancelReason)
				require.NoError(t, rt.Shutdown(context.Background()))
			})
		})
	}
}

// Reset does not drain, and its ctx bounds it: over a store whose writes
// fail, the writes of the waiting queue items end with its ctx, instead of
// being retried for as long as the runtime lives, which held Reset, and
// the test calling it, until Shutdown. Reset returns ctx's error; the
// record not written is left PENDING, for recovery, and the next Shutdown
// names it among the records left unwritten.
func TestFaultResetIsBoundedByItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt, mem, f := faulty(workers.Config{})
		_, behind := headAndBehind(t, rt)
		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Fault: storetest.FailBefore, Match: func(c *storetest.Call) bool {
			return c.ID == behind.ID && c.Next.Cause == workers.CauseShutdown
		}})
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start := time.Now()
		done := make(chan error, 1)
		go func() { done <- rt.Reset(rctx) }()
		select {
		case err := <-done:
			require.ErrorIs(t, err, context.DeadlineExceeded)
		case <-time.After(time.Minute):
			t.Errorf("Reset, its ctx ended %v ago, still retries a queue item's write", time.Since(start)-time.Second)
			f.Heal()
			<-done
		}
		assert.LessOrEqual(t, time.Since(start), time.Second+time.Millisecond, "Reset outlived its ctx")
		f.Heal()
		r, err := mem.GetTask(context.Background(), behind.ID)
		if err == nil { // Reset cleared the records, unless the store is durable
			assert.Equal(t, workers.StatusPending, r.Status, "left for recovery")
		}
		var se *workers.ShutdownError
		require.ErrorAs(t, rt.Shutdown(context.Background()), &se)
		assert.Equal(t, []string{behind.ID}, se.UnwrittenIDs)
		assert.Zero(t, se.Executing)
	})
}

// A run whose retry write (or a queue item's start write) keeps failing
// has no callback executing: when Shutdown's ctx ends, its record (still
// RUNNING, attempt 1) is left unwritten, for recovery, exactly as the
// record of a run whose outcome write keeps failing is (see
// TestFaultAnOutcomeWriteIsNotTriedPastShutdownsCutoff). Shutdown's error
// counts and names it as a run left executing instead.
func TestFaultShutdownCountsARetryWriteItGaveUpAsUnwritten(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt, mem, f := faulty(workers.Config{})
		var calls atomic.Int32
		sub, err := rt.Submit(context.Background(), "k", func(ctx context.Context, _ *workers.Task) (any, error) {
			calls.Add(1)
			return nil, errors.New("flaky")
		}, owner, workers.WithRetry(workers.RetryPolicy{MaxAttempts: 3, InitialBackoff: 10 * time.Millisecond}))
		require.NoError(t, err)
		// Every write of the run after its first attempt fails: its retry
		// (RUNNING, attempt 2), and the cancellation it becomes.
		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Fault: storetest.FailBefore, Match: func(c *storetest.Call) bool {
			return c.ID == sub.ID
		}})
		require.NoError(t, f.WaitInjected(context.Background(), storetest.OpTransitionTask, 1))

		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		err = rt.Shutdown(ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		var se *workers.ShutdownError
		require.ErrorAs(t, err, &se)
		assert.Contains(t, err.Error(), "left 0 runs or goroutines executing and 1 live records of this runtime unwritten")
		assert.Equal(t, []string{sub.ID}, se.UnwrittenIDs, "the record left, named as unwritten: %+v", se)
		assert.Empty(t, se.ExecutingIDs, "no callback executes: %+v", se)
		synctest.Wait()
		assert.EqualValues(t, 1, calls.Load())
		r, err := mem.GetTask(context.Background(), sub.ID)
		require.NoError(t, err)
		assert.Equal(t, workers.StatusRunning, r.Status, "left for recovery")
	})
}

// Reset's ctx bounds a waiting item's write whole: a write that lands but
// is reported failed (a lost acknowledgement) is tried again, fenced out,
// and read back to tell whether it landed; that read ends with Reset's
// ctx too, not 5 s later (lastWriteTimeout) when it hangs.
func TestFaultResetIsBoundedByItsContextWhenTheReadBackHangs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt, _, f := faulty(workers.Config{})
		_, behind := headAndBehind(t, rt)
		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Times: 1, Fault: storetest.FailAfter, Match: func(c *storetest.Call) bool {
			return c.ID == behind.ID && c.Next.Cause == workers.CauseShutdown
		}})
		f.Add(storetest.Rule{Op: storetest.OpGetTask, Fault: storetest.Hang, Match: func(c *storetest.Call) bool {
			return c.ID == behind.ID
		}})
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start := time.Now()
		err := rt.Reset(rctx)
		took := time.Since(start)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.LessOrEqual(t, took, time.Second+100*time.Millisecond, "Reset returned %v after its ctx ended", took-time.Second)
		f.Heal()
		f.Release()
		_ = rt.Shutdown(context.Background())
	})
}

// A Cancel whose write fails, and whose read to tell fails too, cancels
// the run all the same, and the run's own end says CANCELLED, by whom and
// why, whatever its callback returns: here, told to stop, it returns what
// it has with a nil error (a common shape), which without that cancel
// would have completed the run.
func TestFaultACancelThatCannotTellItsOutcomeEndsTheRunCancelledWhateverItReturns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &storetest.Faults{}
		mem := workers.NewMemStore()
		bare := struct{ workers.Store }{mem} // no Leaser, no Notifier
		rt := workers.NewRuntime(storetest.Faulty(bare, f), workers.Config{Logger: quiet})
		started := make(chan struct{})
		sub, err := rt.Submit(context.Background(), "k", func(ctx context.Context, _ *workers.Task) (any, error) {
			close(started)
			<-ctx.Done()
			return "partial", nil
		}, owner)
		require.NoError(t, err)
		<-started
		var wrote atomic.Bool
		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Times: 1, Fault: storetest.FailBefore, Match: func(c *storetest.Call) bool {
			if c.ID == sub.ID && c.Next.Status == workers.StatusCancelled {
				wrote.Store(true)
				return true
			}
			return false
		}})
		f.Add(storetest.Rule{Op: storetest.OpGetTask, Times: 1, Fault: storetest.FailBefore, Match: func(c *storetest.Call) bool {
			return c.ID == sub.ID && wrote.Load()
		}})
		require.Error(t, rt.Cancel(context.Background(), sub.ID, owner, workers.WithReason("no longer needed")))
		synctest.Wait()
		r, err := mem.GetTask(context.Background(), sub.ID)
		require.NoError(t, err)
		assert.Equal(t, workers.StatusCancelled, r.Status, "the run the Cancel cancelled ended %s, %q", r.Status, r.Error)
		assert.Equal(t, "alice", r.CancelledBy)
		require.NoError(t, rt.Shutdown(context.Background()))
	})
}

// A queue backlog longer than the abandon writers Shutdown runs at once,
// whose writes are stuck in a store call that ignores its context: at
// the cutoff, the items in those stuck calls count as left executing,
// and the items behind them, whose writes never began, among the records
// left unwritten, each once; and no write of theirs begins after
// Shutdown returned, so their records stay PENDING for recovery, as the
// error says, and a later Shutdown counts them once more, as left.
func TestFaultShutdownCountsTheBacklogItNeverTriedAsUnwritten(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := stuckAbandons{workers.NewMemStore()}
		rt := workers.NewRuntime(s, workers.Config{Logger: quiet})
		_, err := rt.SubmitSequential(context.Background(), "q", "head", func(ctx context.Context, _ *workers.Task) (any, error) {
			<-ctx.Done()
			return nil, context.Cause(ctx)
		}, owner)
		require.NoError(t, err)
		const writers, behind = 16, 40 // the abandon writers at once, and the items waiting
		var ids []string
		for i := range behind {
			sub, err := rt.SubmitSequential(context.Background(), "q", fmt.Sprintf("item%02d", i), result(i), owner)
			require.NoError(t, err)
			ids = append(ids, sub.ID)
		}
		synctest.Wait()

		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		err = rt.Shutdown(ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		var se *workers.ShutdownError
		require.ErrorAs(t, err, &se)
		assert.Equal(t, writers, se.Executing, "items in a stuck write: %v", se.ExecutingIDs)
		assert.Len(t, se.ExecutingIDs, writers)
		assert.Equal(t, behind-writers, se.Unwritten, "items whose writes never began: %v", se.UnwrittenIDs)
		assert.Len(t, se.UnwrittenIDs, behind-writers)
		assert.ElementsMatch(t, ids, append(slices.Clone(se.ExecutingIDs), se.UnwrittenIDs...), "each item named once")

		time.Sleep(3 * time.Hour) // the stuck calls return
		synctest.Wait()
		for _, id := range se.ExecutingIDs {
			endedAs(t, s, id, workers.StatusCancelled, workers.CauseShutdown)
		}
		for _, id := range se.UnwrittenIDs {
			r, err := s.GetTask(context.Background(), id)
			require.NoError(t, err)
			assert.Equal(t, workers.StatusPending, r.Status, "%s, counted unwritten, left for recovery", id)
		}
		err = rt.Shutdown(context.Background())
		require.ErrorAs(t, err, &se)
		assert.Zero(t, se.Executing)
		assert.Equal(t, behind-writers, se.Unwritten, "the records left, counted once: %v", se.UnwrittenIDs)
	})
}

// A second Shutdown, whose ctx does not end, of a runtime whose first
// Shutdown left a record unwritten reports that record with no error of
// a ctx (ShutdownError.Err is nil), as its doc says, and not as the
// runtime being closed.
func TestFaultALaterShutdownReportsTheRecordsAnEarlierLeftWithoutACtxError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt, _, f := faulty(workers.Config{})
		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Fault: storetest.Hang, Match: func(c *storetest.Call) bool {
			return c.Next.Cause == workers.CauseShutdown && slices.Equal(c.From, []workers.Status{workers.StatusPending})
		}})
		_, behind := headAndBehind(t, rt)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		require.ErrorIs(t, rt.Shutdown(ctx), context.DeadlineExceeded)

		err := rt.Shutdown(context.Background())
		var se *workers.ShutdownError
		require.ErrorAs(t, err, &se)
		assert.Equal(t, []string{behind.ID}, se.UnwrittenIDs)
		assert.NoError(t, se.Err, "ctx never ended")
		assert.NotErrorIs(t, err, workers.ErrClosed)
		assert.Equal(t, "workers: shutdown left 0 runs or goroutines executing and 1 live records of this runtime unwritten (unwritten: "+behind.ID+"): the store refused their writes, or an earlier Shutdown or a Reset gave them up", err.Error())
	})
}
