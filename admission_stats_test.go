package workers

import (
	"testing"
	"testing/synctest"

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
