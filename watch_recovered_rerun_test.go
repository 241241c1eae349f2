package workers_test

import (
	"iter"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/storetest"
)

// A Watch here shows run A, this runtime's, RUNNING. The lease is lost
// (run A abandoned, its callback ignoring its context) and comes back;
// this runtime's recovery ends run A's record FAILED (abandoned), and
// before it reports that end (its call is slow to return), a peer
// re-runs the key. The stream must end with run A's end, which this very
// runtime reports a moment later, as it does for a Cancel made here
// (runCancelling); not with ErrNotFound.
func TestWatchEndsWithTheRecoveredEndThoughTheKeyWasReRunFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := workers.Config{LeaseInterval: time.Second, LeaseTTL: 3 * time.Second, StoreTimeout: time.Minute}
		rt, mem, f := faulty(cfg)
		require.NoError(t, rt.Start(t.Context()))
		run := newHeedless()
		sub, err := rt.Submit(t.Context(), "stubborn", run.fn, owner)
		require.NoError(t, err)
		<-run.started
		peerCfg := cfg
		peerCfg.Logger = quiet
		peer := workers.NewRuntime(mem, peerCfg)
		next, stop := iter.Pull2(rt.Watch(t.Context(), sub.ID, owner))
		defer func() { // on failure too, so that the bubble's goroutines end
			stop()
			f.Heal()
			close(run.release)
			require.NoError(t, rt.Shutdown(t.Context()))
			require.NoError(t, peer.Shutdown(t.Context()))
		}()
		snap, err, ok := next()
		require.True(t, ok)
		require.NoError(t, err)
		require.Equal(t, sub.RunID, snap.RunID)
		require.Equal(t, workers.StatusRunning, snap.Status)

		// The recovery's write lands, and its answer is held back.
		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Times: 1, Fault: storetest.HangAfter, Match: func(c *storetest.Call) bool {
			return c.ID == sub.ID && c.Next.Cause == workers.CauseAbandoned
		}})
		unreachable := f.Add(storetest.Rule{Op: storetest.OpRenewLease, Fault: storetest.FailBefore})
		time.Sleep(4 * time.Second) // (bubble clock) the lease is lost
		unreachable()
		time.Sleep(2 * time.Second) // (bubble clock) the lease is back; recovery writes
		synctest.Wait()
		require.Equal(t, 1, f.Injected(storetest.OpTransitionTask), "the recovery's write is held")
		rec, err := mem.GetTask(t.Context(), sub.ID)
		require.NoError(t, err)
		require.Equal(t, workers.StatusFailed, rec.Status)

		again, err := peer.Submit(t.Context(), "stubborn", result(1), owner)
		require.NoError(t, err)
		require.False(t, again.Joined)
		_, err = peer.Wait(t.Context(), again.ID, owner)
		require.NoError(t, err)

		type pulled struct {
			snap workers.Snapshot
			err  error
			ok   bool
		}
		got := make(chan pulled, 1)
		go func() {
			snap, err, ok := next()
			got <- pulled{snap, err, ok}
		}()
		synctest.Wait()
		f.Release() // the recovery reports run A's end
		synctest.Wait()
		var r pulled
		select {
		case r = <-got:
		default:
			t.Fatal("the Watch yielded nothing after run A's RUNNING")
		}
		require.True(t, r.ok)
		require.NoError(t, r.err, "the Watch ended without run A's end, which this runtime reported right after")
		require.Equal(t, sub.RunID, r.snap.RunID)
		require.Equal(t, workers.StatusFailed, r.snap.Status)
	})
}
