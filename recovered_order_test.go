package workers_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/storetest"
)

// A run abandoned with a lost lease panics; the first observer is slow
// on the panic. Meanwhile this runtime's recovery (whose write the test
// holds until then) ends the abandoned run's record and reports
// EventRecovered. An observer must never hear the run's panic after its
// end ("a run's start, retry or panic is never reported to observers
// after its end"): the recovery's report must wait for the panic's, as
// reportEnd's does (runLiveReporting).
func TestAbandonedRunsPanicIsNotHeardAfterItsRecovery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hold, holding := make(chan struct{}), make(chan struct{})
		slow := workers.ObserverFunc(func(_ context.Context, e workers.Event) {
			if e.Kind == workers.EventPanicked {
				close(holding)
				<-hold
			}
		})
		var mu sync.Mutex
		var heard []workers.EventKind
		panicHeard := make(chan struct{})
		rec := workers.ObserverFunc(func(_ context.Context, e workers.Event) {
			mu.Lock()
			heard = append(heard, e.Kind)
			mu.Unlock()
			if e.Kind == workers.EventPanicked {
				close(panicHeard)
			}
		})
		cfg := workers.Config{LeaseInterval: time.Second, LeaseTTL: 3 * time.Second, StoreTimeout: time.Minute, Observers: []workers.Observer{slow, rec}}
		rt, mem, f := faulty(cfg)
		require.NoError(t, rt.Start(t.Context()))
		started, release := make(chan struct{}), make(chan struct{})
		sub, err := rt.Submit(t.Context(), "stubborn", func(context.Context, *workers.Task) (any, error) {
			close(started)
			<-release
			panic("late")
		}, owner)
		require.NoError(t, err)
		<-started
		defer func() { // on failure too, so that the bubble's goroutines end
			for _, ch := range []chan struct{}{hold, release} {
				select {
				case <-ch:
				default:
					close(ch)
				}
			}
			f.Heal()
			require.NoError(t, rt.Shutdown(t.Context()))
		}()

		// The recovery's write waits until the test releases it.
		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Times: 1, Fault: storetest.Hang, Match: func(c *storetest.Call) bool {
			return c.ID == sub.ID && c.Next.Cause == workers.CauseAbandoned
		}})
		f.Add(storetest.Rule{Op: storetest.OpRenewLease, Fault: storetest.FailBefore})
		time.Sleep(5 * time.Second) // (bubble clock) the lease is lost: the run is abandoned
		synctest.Wait()
		require.Equal(t, 1, f.Injected(storetest.OpTransitionTask), "the recovery's write is held")
		close(release) // the callback panics
		synctest.Wait()
		select {
		case <-holding: // the slow observer holds the panic's report
		default:
			mu.Lock()
			t.Fatalf("the observers were not told of the panic: %v", heard)
		}
		f.Release() // the recovery's write lands, and the recovery reports it
		synctest.Wait()
		r, err := mem.GetTask(t.Context(), sub.ID)
		require.NoError(t, err)
		require.Equal(t, workers.StatusFailed, r.Status)
		require.Equal(t, workers.CauseAbandoned, r.Cause)
		close(hold)
		synctest.Wait()
		select {
		case <-panicHeard:
		default:
			t.Fatal("the second observer never heard of the panic")
		}

		mu.Lock()
		defer mu.Unlock()
		ip, ir := -1, -1
		for i, k := range heard {
			switch k {
			case workers.EventPanicked:
				ip = i
			case workers.EventRecovered:
				ir = i
			}
		}
		require.NotEqual(t, -1, ir, "heard %v", heard)
		assert.False(t, ip > ir, "the observer heard the run's panic after its end: %v", heard)
	})
}
