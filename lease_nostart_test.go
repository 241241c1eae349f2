package workers_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/storetest"
)

// A runtime used without Start (Start is documented as optional: the
// first submission takes the lease and starts the renewal) loses its
// lease, abandons its run, whose callback ignores its context, and then
// takes the lease again. The record must not stay RUNNING under the
// live lease: no peer may recover it (its instance is live), and nothing
// here ends it, so a Wait on it, here or on any replica, never returns.
// Config.LeaseTTL's doc: "Its recovery loop ends the record of a run
// whose callback goes on all the same"; a store fault only delays the
// end of a live record whose run is not alive.
func TestAbandonedRunEndsOnceTheLeaseIsBackWithoutStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := workers.Config{LeaseInterval: time.Second, LeaseTTL: 3 * time.Second}
		rt, mem, f := faulty(cfg) // never Started
		run := newHeedless()
		var task atomic.Pointer[workers.Task]
		sub, err := rt.Submit(t.Context(), "stubborn", func(ctx context.Context, tk *workers.Task) (any, error) {
			task.Store(tk)
			return run.fn(ctx, tk)
		}, owner)
		require.NoError(t, err)
		<-run.started

		unreachable := f.Add(storetest.Rule{Op: storetest.OpRenewLease, Fault: storetest.FailBefore})
		time.Sleep(4 * time.Second) // (bubble clock) the renewals fail for the lease's whole TTL
		unreachable()
		time.Sleep(2 * time.Second) // (bubble clock) renewals land again
		synctest.Wait()
		requireLeaseBack(t, mem, sub.RunID)
		require.ErrorIs(t, task.Load().CancelCause(), workers.ErrAbandoned, "the lease was lost: the run was abandoned")

		// A peer that did Start, now that the lease is back: its Start
		// and its recovery loop (every second) pass over the record.
		peer := startedPeer(t, mem, cfg)
		time.Sleep(10 * time.Second) // (bubble clock) many lease and recovery intervals pass
		synctest.Wait()

		rec, err := mem.GetTask(t.Context(), sub.ID)
		require.NoError(t, err)
		assert.Equal(t, workers.StatusFailed, rec.Status, "the abandoned run's record is still live under the live lease, its callback running on")
		assert.Equal(t, workers.CauseAbandoned, rec.Cause)

		close(run.release)
		require.NoError(t, rt.Shutdown(t.Context()))
		require.NoError(t, peer.Shutdown(t.Context()))
	})
}

// A runtime used without Start loses its lease and abandons its run,
// whose callback ignores its context. While the lease is lost, a started
// peer recovers the record (FAILED, abandoned). The lease then comes
// back: nothing of this runtime's is left to end, so endAbandonedHere
// has nothing to do. It must not list every live record of the store at
// every renewal, for as long as the callback runs on.
func TestAbandonedRunEndedByAPeerCostsNoListingPerRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := workers.Config{LeaseInterval: time.Second, LeaseTTL: 3 * time.Second}
		rt, mem, f := faulty(cfg) // never Started
		run := newHeedless()
		sub, err := rt.Submit(t.Context(), "stubborn", run.fn, owner)
		require.NoError(t, err)
		<-run.started

		unreachable := f.Add(storetest.Rule{Op: storetest.OpRenewLease, Fault: storetest.FailBefore})
		time.Sleep(4 * time.Second) // (bubble clock) the renewals fail for the lease's whole TTL: lost

		peer := startedPeer(t, mem, cfg) // recovers the record of the lost instance
		synctest.Wait()
		rec, err := mem.GetTask(t.Context(), sub.ID)
		require.NoError(t, err)
		require.Equal(t, workers.StatusFailed, rec.Status, "the peer recovered the record")

		unreachable()
		time.Sleep(2 * time.Second) // (bubble clock) the lease is back
		synctest.Wait()
		requireLeaseBack(t, mem, sub.RunID)

		before := f.Calls(storetest.OpListTasks)
		time.Sleep(30 * time.Second) // (bubble clock) 30 renewals
		synctest.Wait()
		assert.LessOrEqual(t, f.Calls(storetest.OpListTasks)-before, 1,
			"a pass over the store's live records at every renewal, with nothing left to end")

		close(run.release)
		require.NoError(t, rt.Shutdown(t.Context()))
		require.NoError(t, peer.Shutdown(t.Context()))
	})
}

// startedPeer starts another runtime over mem, with cfg but quiet: its
// Start and its recovery loop pass over the records of lost instances.
func startedPeer(t *testing.T, mem *workers.MemStore, cfg workers.Config) *workers.Runtime[workers.Store] {
	t.Helper()
	cfg.Logger = quiet
	peer := workers.NewRuntime[workers.Store](mem, cfg)
	require.NoError(t, peer.Start(t.Context()))
	return peer
}

// requireLeaseBack requires the lease of the instance of run runID to be
// live in mem again.
func requireLeaseBack(t *testing.T, mem *workers.MemStore, runID string) {
	t.Helper()
	live, err := mem.LiveInstances(t.Context())
	require.NoError(t, err)
	require.Contains(t, live, workers.InstanceOf(runID), "the lease is back")
}

// The pass that ends a runtime's abandoned records once its lease is
// back, without Start, over a failing store: its listing fails before it
// is answered, and then its write of the run's end fails after it lands
// (a lost acknowledgement). Neither stops it: a later renewal lists
// again, and the landed end is known from the record and reported, so
// the record ends FAILED (abandoned) and, nothing left to end, the
// renewals stop listing.
func TestAbandonedRunEndsWithoutStartThroughAFailingStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := workers.Config{LeaseInterval: time.Second, LeaseTTL: 3 * time.Second}
		rt, mem, f := faulty(cfg) // never Started
		run := newHeedless()
		sub, err := rt.Submit(t.Context(), "stubborn", run.fn, owner)
		require.NoError(t, err)
		<-run.started

		unreachable := f.Add(storetest.Rule{Op: storetest.OpRenewLease, Fault: storetest.FailBefore})
		time.Sleep(4 * time.Second) // (bubble clock) the renewals fail for the lease's whole TTL
		f.Add(storetest.Rule{Op: storetest.OpListTasks, Times: 1, Fault: storetest.FailBefore})
		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Times: 1, Fault: storetest.FailAfter, Match: func(c *storetest.Call) bool {
			return c.ID == sub.ID && c.Next.Cause == workers.CauseAbandoned
		}})
		unreachable()
		time.Sleep(10 * time.Second) // (bubble clock) renewals land again, and passes follow
		synctest.Wait()
		requireLeaseBack(t, mem, sub.RunID)
		require.Equal(t, 1, f.Injected(storetest.OpListTasks), "the first listing failed")
		require.Equal(t, 1, f.Injected(storetest.OpTransitionTask), "the end's write landed, its answer lost")

		rec, err := mem.GetTask(t.Context(), sub.ID)
		require.NoError(t, err)
		assert.Equal(t, workers.StatusFailed, rec.Status)
		assert.Equal(t, workers.CauseAbandoned, rec.Cause)
		before := f.Calls(storetest.OpListTasks)
		time.Sleep(10 * time.Second) // (bubble clock) ten more renewals
		synctest.Wait()
		assert.Zero(t, f.Calls(storetest.OpListTasks)-before, "the passes go on though nothing is left to end")

		close(run.release)
		require.NoError(t, rt.Shutdown(t.Context()))
	})
}
