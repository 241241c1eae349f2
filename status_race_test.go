package workers

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// A caller polling Status never sees a task's progress go back while its
// run ends, however the run's settling falls between Status's steps:
// Status looks the run's handle up once, and a handle that settles
// meanwhile still holds the progress it showed. Two callers poll Status
// as each of many runs ends.
func TestStatusProgressNeverGoesBackWhileRunsEnd(t *testing.T) {
	rt := memRuntime(t)
	var bad atomic.Value
	for i := range 400 {
		started, release := make(chan struct{}), make(chan struct{})
		sub, err := rt.Submit(ctx, fmt.Sprint("k", i), func(_ context.Context, tk *Task) (any, error) {
			tk.SetProgress(80)
			close(started)
			<-release
			return nil, nil
		}, alice)
		require.NoError(t, err)
		wait(t, started, "the run to start")
		first, err := rt.Status(ctx, sub.ID, alice)
		require.NoError(t, err)
		require.Equal(t, 80, first.Progress)
		var wg sync.WaitGroup
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					s, err := rt.Status(ctx, sub.ID, alice)
					if err != nil || s.Status.Terminal() {
						return
					}
					if s.Progress < 80 {
						bad.Store(fmt.Sprintf("run %d: %s at %d%% after 80%%", i, s.Status, s.Progress))
						return
					}
				}
			}()
		}
		close(release)
		wg.Wait()
		if v := bad.Load(); v != nil {
			t.Fatal(v)
		}
	}
}
