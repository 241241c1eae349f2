package workers_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/storetest"
)

// A join whose watcher write lost its connection (ErrUnavailable), before
// it landed or after, is made again, as a registering write is: adding a
// watcher the record holds already changes nothing, so the submission
// joins the live run either way, and the joiner may see it, where it
// used to fail with a store error.
func TestAJoinsLostWatcherWriteIsMadeAgain(t *testing.T) {
	for _, fault := range []storetest.Fault{storetest.FailBefore, storetest.FailAfter} {
		t.Run(fault.String(), func(t *testing.T) {
			rt, mem, f := faulty(workers.Config{})
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				require.NoError(t, rt.Shutdown(ctx))
			}()
			mem.SetWatchAuthorizer(func(_ string, _ []string, user string) bool { return user == "bob" })
			bob := workers.MustOwner("bob")
			hold := make(chan struct{})
			var once sync.Once
			release := func() { once.Do(func() { close(hold) }) }
			defer release()
			sub, err := rt.Submit(t.Context(), "warm-cache", func(context.Context, *workers.Task) (any, error) {
				<-hold
				return "warm", nil
			}, owner, workers.WithScope(workers.ScopeGlobal))
			require.NoError(t, err)
			f.Add(storetest.Rule{Op: storetest.OpAddWatcher, Times: 1, Fault: fault,
				Err: fmt.Errorf("%w: connection reset by peer", workers.ErrUnavailable)})

			joined, err := rt.Submit(t.Context(), "warm-cache", result("unused"), bob, workers.WithScope(workers.ScopeGlobal))
			require.NoError(t, err, "a join whose watcher write lost its connection")
			assert.True(t, joined.Joined)
			assert.Equal(t, sub.RunID, joined.RunID)
			assert.Equal(t, 2, f.Calls(storetest.OpAddWatcher), "the watcher write, made again once")
			snap, err := rt.Status(t.Context(), sub.ID, bob)
			require.NoError(t, err, "the joiner may see the run it joined")
			assert.Equal(t, 2, snap.WatcherCount)

			release()
			end, err := rt.Wait(t.Context(), sub.ID, bob)
			require.NoError(t, err)
			assert.Equal(t, workers.StatusCompleted, end.Status)
		})
	}
}
