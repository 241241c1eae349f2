package workers_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/storetest"
)

// A run's progress reaches the store within a ProgressInterval (a second
// by default over a store processes share), though the sync loop runs
// once an hour: another runtime's Status and Subscribe show it, as a
// dashboard served by another replica would. Progress that did not
// change is not written again.
func TestProgressReachesAnotherRuntimeWithinAProgressInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		mem := workers.NewMemStore()
		f := &storetest.Faults{}
		runner := workers.NewRuntime(storetest.Faulty(mem, f), workers.Config{Logger: quiet, SyncInterval: time.Hour})
		other := workers.NewRuntime(mem, workers.Config{Logger: quiet})
		step := make(chan int)
		sub, err := runner.Submit(ctx, "k", func(_ context.Context, tk *workers.Task) (any, error) {
			for p := range step {
				tk.SetProgress(p)
			}
			return nil, nil
		}, owner)
		require.NoError(t, err)
		sctx, cancel := context.WithCancel(ctx)
		shown := make(chan int, 16)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for snap, err := range other.Subscribe(sctx, owner) {
				if err != nil {
					return
				}
				shown <- snap.Progress
			}
		}()
		synctest.Wait()
		progress := func() int {
			snap, err := other.Status(ctx, sub.ID, owner)
			require.NoError(t, err)
			return snap.Progress
		}
		last := func() int {
			p := -1
			for len(shown) > 0 {
				p = <-shown
			}
			return p
		}
		for _, p := range []int{40, 70} {
			step <- p
			time.Sleep(time.Second)
			synctest.Wait()
			assert.Equal(t, p, progress(), "another runtime's Status")
			assert.Equal(t, p, last(), "another runtime's Subscribe")
		}
		writes := f.Calls(storetest.OpTransitionTask)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		assert.Equal(t, writes, f.Calls(storetest.OpTransitionTask), "progress that did not change was written again")
		close(step)
		_, err = runner.Wait(ctx, sub.ID, owner)
		require.NoError(t, err)
		cancel()
		<-done
		require.NoError(t, runner.Shutdown(ctx))
		require.NoError(t, other.Shutdown(ctx))
	})
}
