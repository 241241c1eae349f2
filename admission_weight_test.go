package workers

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// OwnerLimits doc: the hook's answer "applies from then on to that
// owner's admission". A tier lowered from weight 20 to 1 while its turn
// is under way must not go on starting its tasks at weight 20 while
// another owner waits.
func TestALoweredWeightAppliesToTheTurnUnderWay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var weight atomic.Int64
		weight.Store(20)
		rt := newRuntime(t, NewMemStore(), Config{Limits: Limits{MaxRunning: 1,
			OwnerLimits: func(_ context.Context, o Owner) (OwnerLimits, error) {
				if o == alice {
					return OwnerLimits{Weight: int(weight.Load())}, nil
				}
				return OwnerLimits{}, nil
			}}})
		var mu sync.Mutex
		var order []string
		fn := func(_ context.Context, tk *Task) (any, error) {
			mu.Lock()
			order = append(order, tk.ID())
			mu.Unlock()
			time.Sleep(time.Second) // the work
			return nil, nil
		}
		head := stubbornGate()
		_, err := rt.Submit(ctx, "head", head.fn, bob)
		require.NoError(t, err)
		synctest.Wait()
		for i := range 10 {
			_, err := rt.Submit(ctx, "a"+strconv.Itoa(i), fn, alice)
			require.NoError(t, err)
		}
		_, err = rt.Submit(ctx, "b", fn, bob)
		require.NoError(t, err)
		head.open()
		synctest.Wait() // alice's turn has begun: a0 runs
		mu.Lock()
		require.Equal(t, []string{"alice::a0"}, order)
		mu.Unlock()

		// Alice's tier is lowered to weight 1; her next submission asks
		// the hook, whose answer applies from then on.
		weight.Store(1)
		_, err = rt.Submit(ctx, "a10", fn, alice)
		require.NoError(t, err)

		time.Sleep(time.Minute) // the fake clock runs every task
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		at := -1
		for i, id := range order {
			if id == "bob::b" {
				at = i
			}
		}
		require.GreaterOrEqual(t, at, 0, "bob's task ran: %v", order)
		// At weight 1, a turn that started a0 has had its share: bob is
		// next, not after another of alice's starts.
		assert.Equal(t, 1, at, "bob waited behind alice's old weight: %v", order)
	})
}
