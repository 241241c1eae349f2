package workers_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/storetest"
)

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

		peerCfg := cfg
		peerCfg.Logger = quiet
		peer := workers.NewRuntime(mem, peerCfg)
		require.NoError(t, peer.Start(t.Context())) // recovers the record of the lost instance
		synctest.Wait()
		rec, err := mem.GetTask(t.Context(), sub.ID)
		require.NoError(t, err)
		require.Equal(t, workers.StatusFailed, rec.Status, "the peer recovered the record")

		unreachable()
		time.Sleep(2 * time.Second) // (bubble clock) the lease is back
		synctest.Wait()
		live, err := mem.LiveInstances(t.Context())
		require.NoError(t, err)
		require.Contains(t, live, workers.InstanceOf(sub.RunID), "the lease is back")

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
