package workers

import (
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A run waiting for its turn that a new run of its key supersedes here
// (its record was ended elsewhere, and the notice never came) gives its
// owner's waiting place back at once and ends without starting, as a
// cancelled run does, rather than hold the place until its turn: the
// owner's next submission is not refused for a run that will never
// start.
func TestASupersededWaitingRunGivesItsPlaceBackAtOnce(t *testing.T) {
	for _, c := range []struct {
		name  string
		queue string
	}{{"ForASlot", ""}, {"InAQueue", "q"}} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := &droppingNotices{MemStore: NewMemStore(), cut: make(chan struct{})}
				logger := slog.New(slog.DiscardHandler)
				rt := NewRuntime(s, Config{Logger: logger, SyncInterval: time.Hour,
					Limits: Limits{MaxRunning: 1, Owner: OwnerLimits{Waiting: 2}}})
				other := NewRuntime(s.MemStore, Config{Logger: logger})
				head, old, fn, ran := waitingBehindAHead(t, rt, c.queue)

				s.drop.Store(true) // the cancel's notice is lost
				require.NoError(t, other.Cancel(ctx, old.ID, alice))
				synctest.Wait()
				s.drop.Store(false)

				again, err := submitOn(rt, c.queue, "k", fn, alice)
				require.NoError(t, err)
				require.NotEqual(t, old.RunID, again.RunID, "a new run of the key")
				synctest.Wait()
				st, err := rt.Stats(ctx, System)
				require.NoError(t, err)
				assert.Equal(t, 1, st.Waiting, "the superseded run still holds a waiting place")
				_, err = submitOn(rt, c.queue, "next", fn, alice)
				assert.NoError(t, err, "the owner's waiting cap counts a run that will never start")

				head.open()
				synctest.Wait()
				assert.EqualValues(t, 2, ran.Load(), "the new run and the next ran, the superseded one never")
				require.NoError(t, rt.Shutdown(ctx))
				require.NoError(t, other.Shutdown(ctx))
			})
		})
	}
}
