package workers

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The take of the instance lease that the first submission makes is
// made again when it lost its connection (ErrUnavailable), as a
// registering write, or a submission's renewal, is: the submission
// registers its run instead of failing on the blip. A take that fails
// for another reason is not.
func TestALostLeaseTakeIsMadeAgain(t *testing.T) {
	for _, tc := range []struct {
		fail  error
		tries int32
		ok    bool
	}{
		{fmt.Errorf("%w: connection reset", ErrUnavailable), 2, true},
		{errLeaseStore, 1, false},
	} {
		t.Run(tc.fail.Error(), func(t *testing.T) {
			var tries atomic.Int32
			s := &renewing{MemStore: NewMemStore()}
			s.renew = func(ctx context.Context) (bool, error) {
				if tries.Add(1) == 1 {
					return false, tc.fail
				}
				return true, nil
			}
			rt := newRuntime(t, s, Config{})
			_, err := rt.Submit(ctx, "k", noop, alice)
			if tc.ok {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, errLeaseStore)
			}
			assert.Equal(t, tc.tries, tries.Load(), "takes made")
		})
	}
}

// A first submission whose take of the instance lease lost its
// connection, and which Shutdown's start stops from making the take
// again, fails with ErrClosed, as a submission does whose own renewal
// Shutdown cut off: Shutdown began, which is why nothing was registered.
func TestALostLeaseTakeThatShutdownStopsFailsClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var tries atomic.Int32
		s := &renewing{MemStore: NewMemStore()}
		s.renew = func(ctx context.Context) (bool, error) {
			tries.Add(1)
			return false, fmt.Errorf("%w: connection reset", ErrUnavailable)
		}
		rt := NewRuntime(s, Config{})
		errc := make(chan error, 1)
		go func() {
			_, err := rt.Submit(context.Background(), "k", noop, alice)
			errc <- err
		}()
		synctest.Wait() // the take failed; the submission backs off before the next
		require.Equal(t, int32(1), tries.Load())
		done := make(chan error, 1)
		go func() { done <- rt.Shutdown(context.Background()) }()
		err := <-errc
		require.ErrorIs(t, err, ErrClosed)
		require.NoError(t, <-done)
		assert.Equal(t, int32(1), tries.Load(), "takes made")
	})
}
