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
		live, err := mem.LiveInstances(t.Context())
		require.NoError(t, err)
		require.Contains(t, live, workers.InstanceOf(sub.RunID), "the lease is back")
		require.ErrorIs(t, task.Load().CancelCause(), workers.ErrAbandoned, "the lease was lost: the run was abandoned")

		// A peer that did Start, now that the lease is back: its Start
		// and its recovery loop (every second) pass over the record.
		peerCfg := cfg
		peerCfg.Logger = quiet
		peer := workers.NewRuntime(mem, peerCfg)
		require.NoError(t, peer.Start(t.Context()))
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
