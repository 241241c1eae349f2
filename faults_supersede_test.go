package workers_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/taskgate/workers"
	"github.com/taskgate/workers/storetest"
)

// A waiting run that a new run of its key supersedes here (another
// process ended its record, and no notice came) gives its owner's
// waiting place back at once also when its own end write fails, before
// it reaches the store or after. That write is fenced on the superseded
// run, so it never touches the new run's record: the new run and the
// owner's next submission both run, the superseded one never does.
func TestFaultASupersededWaitingRunsEndWriteFails(t *testing.T) {
	for _, queue := range []string{"", "q"} {
		for _, fault := range []storetest.Fault{storetest.FailBefore, storetest.FailAfter} {
			t.Run(fmt.Sprintf("queue=%q/%s", queue, fault), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					f := &storetest.Faults{}
					mem := workers.NewMemStore()
					rt := workers.NewRuntime(storetest.Faulty(sharedNoNotices{mem, mem}, f), workers.Config{Logger: quiet, SyncInterval: time.Hour,
						Limits: workers.Limits{MaxRunning: 1, Owner: workers.OwnerLimits{Waiting: 2}}})
					ctx := context.Background()
					submit := func(key string, fn workers.Func) (workers.Submission, error) {
						if queue == "" {
							return rt.Submit(ctx, key, fn, owner)
						}
						return rt.SubmitSequential(ctx, queue, key, fn, owner)
					}
					release := make(chan struct{})
					_, err := submit("head", func(context.Context, *workers.Task) (any, error) { <-release; return nil, nil })
					require.NoError(t, err)
					var ran atomic.Int64
					fn := func(context.Context, *workers.Task) (any, error) { ran.Add(1); return "ran", nil }
					old, err := submit("k", fn)
					require.NoError(t, err)
					synctest.Wait()

					// Another process cancels the waiting run: no notice comes.
					st := workers.State{Status: workers.StatusCancelled, Cause: workers.CauseCancelled, CompletedAt: time.Now()}
					ok, err := mem.TransitionTask(ctx, old.ID, old.RunID, liveStates, st)
					require.NoError(t, err)
					require.True(t, ok)
					f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Fault: fault, Times: 1,
						Match: func(c *storetest.Call) bool { return c.RunID == old.RunID }})

					again, err := submit("k", fn)
					require.NoError(t, err)
					require.NotEqual(t, old.RunID, again.RunID, "a new run of the key")
					synctest.Wait()
					stats, err := rt.Stats(ctx, workers.System)
					require.NoError(t, err)
					assert.Equal(t, 1, stats.Waiting, "the superseded run still holds a waiting place")
					next, err := submit("next", fn)
					require.NoError(t, err, "the owner's waiting cap counts a run that will never start")

					close(release)
					time.Sleep(time.Minute) // the bubble's clock: a failed write's retries
					synctest.Wait()
					assert.EqualValues(t, 2, ran.Load(), "the new run and the next ran, the superseded one never")
					assert.Equal(t, 1, f.Injected(storetest.OpTransitionTask), "the superseded run's end write failed")
					for _, sub := range []workers.Submission{again, next} {
						rec, err := mem.GetTask(ctx, sub.ID)
						require.NoError(t, err)
						assert.Equal(t, sub.RunID, rec.RunID)
						assert.Equal(t, workers.StatusCompleted, rec.Status, sub.ID)
					}
					require.NoError(t, rt.Shutdown(ctx))
				})
			})
		}
	}
}
