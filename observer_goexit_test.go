package workers_test

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
)

// An observer that ends its goroutine with runtime.Goexit (testing's
// FailNow and Fatal do: a require.* in an observer of a test) must not
// lose the run it observes: the run must still end and settle, so that
// its slot under Limits is given back and Shutdown finds nothing left,
// as for a callback that calls Goexit, or an observer that panics.
func TestAnObserverThatCallsGoexitLosesNoRun(t *testing.T) {
	for _, c := range []struct {
		name  string
		kind  workers.EventKind
		seq   bool
		width int // Limits.QueueConcurrency
	}{
		{"StartedAsync", workers.EventStarted, false, 0},
		{"StartedSequential", workers.EventStarted, true, 0},
		{"StartedSequentialTwoAtATime", workers.EventStarted, true, 2},
		{"FinishedAsync", workers.EventFinished, false, 0},
		{"FinishedSequential", workers.EventFinished, true, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			var fired atomic.Bool
			obs := workers.ObserverFunc(func(_ context.Context, e workers.Event) {
				if e.Kind == c.kind && fired.CompareAndSwap(false, true) {
					runtime.Goexit() // as require.* does when it fails
				}
			})
			rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{
				Logger:    quiet,
				Observers: []workers.Observer{obs},
				Limits:    workers.Limits{MaxRunning: 1, QueueConcurrency: c.width},
			})
			submit := func(key string, o workers.Owner) workers.Submission {
				var sub workers.Submission
				var err error
				if c.seq {
					sub, err = rt.SubmitSequential(context.Background(), "q", key, result("ok"), o)
				} else {
					sub, err = rt.Submit(context.Background(), key, result("ok"), o)
				}
				require.NoError(t, err)
				return sub
			}
			first := submit("first", owner)
			// Another tenant's task, behind the first for the one slot.
			bob := workers.MustOwner("bob")
			second := submit("second", bob)

			for _, s := range []struct {
				sub workers.Submission
				who workers.Owner
			}{{first, owner}, {second, bob}} {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				snap, err := rt.Wait(ctx, s.sub.ID, s.who)
				cancel()
				if assert.NoError(t, err, "Wait(%s): the run was lost", s.sub.ID) {
					assert.True(t, snap.Status.Terminal(), "%s is %s", s.sub.ID, snap.Status)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			assert.NoError(t, rt.Shutdown(ctx))
		})
	}
}
