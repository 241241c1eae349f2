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

// A submission whose context ends while it waits for another submission
// of the same key to register returns an error that is the context's
// (errors.Is finds context.DeadlineExceeded, as an HTTP layer maps it),
// and its cause too when it was given one, and gives its admission place
// back.
func TestASubmissionWhoseContextEndsWhileItWaitsReturnsTheContextsError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &heldInsert{Store: NewMemStore(), id: "alice::k", entered: make(chan struct{}), release: make(chan struct{})}
		rt := NewRuntime(s, Config{Limits: Limits{MaxRunning: 4}})
		require.NoError(t, rt.Start(ctx))
		first := make(chan error, 1)
		go func() {
			_, err := rt.Submit(ctx, "k", noop, alice)
			first <- err
		}()
		<-s.entered // the first holds the key's lock, its insert held

		slow := errors.New("the client's budget ran out")
		sctx, cancel := context.WithTimeoutCause(ctx, time.Second, slow)
		defer cancel()
		_, err := rt.Submit(sctx, "k", noop, alice)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.ErrorIs(t, err, slow)

		st, serr := rt.Stats(ctx, System)
		require.NoError(t, serr)
		assert.Equal(t, 1, st.Running, "only the first holds a slot")

		close(s.release)
		require.NoError(t, <-first)
		synctest.Wait()
		require.NoError(t, rt.Shutdown(ctx))
	})
}
