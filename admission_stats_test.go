package workers

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Stats.Waiting counts a queue item cancelled before its turn while the
// item stays in its queue without Limits, and not under them, where it
// gave its waiting place back at once; QueueLoad.Waiting counts it
// either way.
func TestStatsWaitingAndACancelledQueueItem(t *testing.T) {
	for _, c := range []struct {
		name    string
		limits  Limits
		waiting int
	}{{"WithoutLimits", Limits{}, 3}, {"UnderLimits", Limits{MaxRunning: 8}, 2}} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rt := NewRuntime(NewMemStore(), Config{Limits: c.limits})
				head := newGate()
				_, err := rt.SubmitSequential(ctx, "q", "head", head.fn, alice)
				require.NoError(t, err)
				<-head.started
				var ids []string
				for _, key := range []string{"a", "b", "c"} {
					sub, err := rt.SubmitSequential(ctx, "q", key, noop, alice)
					require.NoError(t, err)
					ids = append(ids, sub.ID)
				}
				require.NoError(t, rt.Cancel(ctx, ids[1], alice))
				synctest.Wait()
				st, err := rt.Stats(ctx, System)
				require.NoError(t, err)
				assert.Equal(t, c.waiting, st.Waiting)
				assert.Equal(t, []QueueLoad{{Name: "q", Running: 1, Waiting: 3}}, st.Queues)
				if c.limits.MaxRunning > 0 {
					assert.Equal(t, []OwnerLoad{{Owner: "alice", Running: 1, Waiting: 2}}, st.Owners)
				}
				head.open()
				require.NoError(t, rt.Shutdown(ctx))
			})
		})
	}
}

// A run waiting out a retry's backoff keeps its running slot: another
// owner's task waits behind it, as Limits and WithRetry say.
func TestARunInRetryBackoffKeepsItsSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := NewRuntime(NewMemStore(), Config{Limits: Limits{MaxRunning: 1}})
		_, err := rt.Submit(ctx, "flaky", func(context.Context, *Task) (any, error) { return nil, errors.New("down") }, alice,
			WithRetry(RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Hour, MaxBackoff: time.Hour}))
		require.NoError(t, err)
		synctest.Wait()
		other, err := rt.Submit(ctx, "other", noop, bob)
		require.NoError(t, err)
		synctest.Wait()
		st, err := rt.Stats(ctx, System)
		require.NoError(t, err)
		assert.Equal(t, 1, st.Running)
		assert.Equal(t, 1, st.Waiting)
		time.Sleep(time.Hour) // the bubble's clock: the backoff ends, the retry fails, the slot frees
		synctest.Wait()
		snap, err := rt.Status(ctx, other.ID, bob)
		require.NoError(t, err)
		assert.Equal(t, StatusCompleted, snap.Status)
		require.NoError(t, rt.Shutdown(ctx))
	})
}
