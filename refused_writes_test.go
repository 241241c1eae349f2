package workers_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/storetest"
)

// errReadOnly is a store's refusal of every write while it still
// answers reads: a database gone read-only (a failover to a standby), or
// one whose disk is full.
var errReadOnly = errors.New("cannot execute INSERT in a read-only transaction (SQLSTATE 25006)")

// A submission whose insert a read-only store refused leaves no record,
// and its run, retired in case the insert landed, finds that out with a
// read, which still works: it ends there, instead of retrying the write
// of its end for as long as writes are refused, logging each submission
// so refused, and being counted by a Shutdown during the outage as a
// live record left unwritten, for a task that has no record at all.
func TestASubmissionARefusingStoreDidNotRegisterLeavesNothingToWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt, mem, f := faulty(workers.Config{})
		f.Add(storetest.Rule{Op: storetest.OpInsertTask, Fault: storetest.FailBefore, Err: errReadOnly})
		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Fault: storetest.FailBefore, Err: errReadOnly})
		f.Add(storetest.Rule{Op: storetest.OpReplaceTask, Fault: storetest.FailBefore, Err: errReadOnly})

		_, err := rt.Submit(context.Background(), "k", result(1), owner)
		require.ErrorIs(t, err, errReadOnly)
		assert.NotErrorIs(t, err, workers.ErrInvalidData, "a store refusing writes is not the caller's data")
		_, err = mem.GetTask(context.Background(), scoped(t, "k"))
		require.ErrorIs(t, err, workers.ErrNotFound)

		time.Sleep(time.Minute) // fake time: writes are still refused
		synctest.Wait()
		assert.LessOrEqual(t, f.Calls(storetest.OpTransitionTask), 1, "the retired run kept writing its end over no record")

		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		require.NoError(t, rt.Shutdown(ctx), "Shutdown counted the record of a submission that wrote none")
	})
}

// A run whose callback returned while the store refused its outcome, and
// which then lost its instance's lease (renewals refused alike), keeps
// that outcome: once writes are accepted again, its own write lands it.
// The runtime's own recovery, which ends the records of its runs
// abandoned with the lease whose callbacks may never return, leaves it
// to that write; it used to race it, and mostly win, recording a task
// that had completed, result in hand, FAILED as abandoned.
func TestAnOutcomeRefusedUntilTheLeaseWasLostLandsOnceWritesAreAccepted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt, mem, f := faulty(workers.Config{LeaseInterval: 100 * time.Millisecond, LeaseTTL: 500 * time.Millisecond})
		require.NoError(t, rt.Start(context.Background()))
		release := make(chan struct{})
		var calls atomic.Int32
		sub, err := rt.Submit(context.Background(), "k", func(context.Context, *workers.Task) (any, error) {
			calls.Add(1)
			<-release
			return "done", nil
		}, owner)
		require.NoError(t, err)
		synctest.Wait()

		refuseWrites := f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Fault: storetest.FailBefore, Err: errReadOnly})
		refuseRenewals := f.Add(storetest.Rule{Op: storetest.OpRenewLease, Fault: storetest.FailBefore, Err: errReadOnly})
		close(release)
		time.Sleep(10 * time.Second) // fake time: the lease is lost, the outcome still refused
		synctest.Wait()
		require.ErrorIs(t, rt.Ready(context.Background()), errReadOnly, "the lease is lost")
		refuseWrites()
		refuseRenewals()
		time.Sleep(5 * time.Second) // the outcome's retries, the lease's renewal, recovery's passes
		synctest.Wait()

		rec, err := mem.GetTask(context.Background(), sub.ID)
		require.NoError(t, err)
		assert.Equal(t, workers.StatusCompleted, rec.Status, "cause %q: %s", rec.Cause, rec.Error)
		assert.JSONEq(t, `"done"`, string(rec.Result))
		assert.Equal(t, int32(1), calls.Load())
		require.NoError(t, rt.Shutdown(context.Background()))
	})
}

// Ready's answer through every fault of a lease renewal: one refused
// before it lands or after (its answer lost), and one that lands and
// then goes unanswered. Ready fails while the renewals do (for one that
// hangs, once it has waited past a LeaseInterval), with no log line of
// its own, and answers nil again once the store takes a renewal; the
// lease is kept throughout, so a run going on meanwhile is not
// abandoned.
func TestReadyThroughEachFaultOfARenewal(t *testing.T) {
	for _, fault := range []storetest.Fault{storetest.FailBefore, storetest.FailAfter, storetest.HangAfter} {
		t.Run(fault.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rt, _, f := faulty(workers.Config{})
				require.NoError(t, rt.Start(context.Background()))
				release := make(chan struct{})
				sub, err := rt.Submit(context.Background(), "k", func(ctx context.Context, _ *workers.Task) (any, error) {
					<-release
					return nil, context.Cause(ctx)
				}, owner)
				require.NoError(t, err)
				synctest.Wait()

				heal := f.Add(storetest.Rule{Op: storetest.OpRenewLease, Fault: fault, Err: errReadOnly})
				time.Sleep(3*time.Second + time.Millisecond) // the loop's renewal meets the fault
				synctest.Wait()
				if fault == storetest.HangAfter {
					require.NoError(t, rt.Ready(context.Background()), "a renewal unanswered for less than an interval")
					time.Sleep(3 * time.Second)
					require.ErrorIs(t, rt.Ready(context.Background()), workers.ErrUnavailable)
					heal()
					f.Release()
				} else {
					require.ErrorIs(t, rt.Ready(context.Background()), errReadOnly)
					heal()
				}
				synctest.Wait()
				require.NoError(t, rt.Ready(context.Background()), "the store takes renewals again")
				close(release)
				snap, err := rt.Wait(context.Background(), sub.ID, owner)
				require.NoError(t, err)
				assert.Equal(t, workers.StatusCompleted, snap.Status, "the run was not abandoned: %s", snap.Cause)
				require.NoError(t, rt.Shutdown(context.Background()))
			})
		})
	}
}
