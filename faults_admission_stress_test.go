package workers_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/storetest"
)

// Under Limits, with store calls failing at random, before or after they
// land (registrations, starts, outcomes, reads), every count of
// admission drains once the store heals and the runs end.
func TestFaultAdmissionCountsDrainThroughRandomStoreFailures(t *testing.T) {
	for seed := range uint64(3) {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) {
			ctx := context.Background()
			rt, _, f := faulty(workers.Config{Limits: workers.Limits{MaxRunning: 2, MaxWaiting: 100, Owner: workers.OwnerLimits{Running: 1, Waiting: 20}}})
			var mu sync.Mutex
			frng := rand.New(rand.NewPCG(seed, 5))
			f.Add(storetest.Rule{Fault: storetest.FailBefore, Err: workers.ErrUnavailable, Match: func(c *storetest.Call) bool {
				mu.Lock()
				defer mu.Unlock()
				return c.Op != storetest.OpRenewLease && frng.IntN(6) == 0
			}})
			f.Add(storetest.Rule{Fault: storetest.FailAfter, Err: workers.ErrUnavailable, Match: func(c *storetest.Call) bool {
				mu.Lock()
				defer mu.Unlock()
				return c.Op != storetest.OpRenewLease && frng.IntN(8) == 0
			}})
			release := make(chan struct{})
			var wg sync.WaitGroup
			for i := range 6 {
				who := workers.MustOwner(fmt.Sprint("o", i))
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(seed, uint64(i)))
					var ids []string
					for range 60 {
						queue := ""
						if rng.IntN(3) == 0 {
							queue = "q"
						}
						fn := func(ctx context.Context, _ *workers.Task) (any, error) {
							select {
							case <-ctx.Done():
							case <-release:
							}
							return nil, nil
						}
						var sub workers.Submission
						var err error
						if queue == "" {
							sub, err = rt.Submit(ctx, strconv.Itoa(rng.IntN(20)), fn, who)
						} else {
							sub, err = rt.SubmitSequential(ctx, queue, strconv.Itoa(rng.IntN(20)), fn, who)
						}
						if err != nil {
							continue
						}
						ids = append(ids, sub.ID)
						if rng.IntN(3) == 0 {
							_ = rt.Cancel(ctx, ids[rng.IntN(len(ids))], who)
						}
					}
				})
			}
			wg.Wait()
			close(release)
			f.Clear()
			deadline := time.Now().Add(20 * time.Second)
			for {
				st, err := rt.Stats(ctx, workers.System)
				require.NoError(t, err)
				if st.Running+st.Waiting == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("counts never drained: %+v", st)
				}
				time.Sleep(5 * time.Millisecond)
			}
			sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			assert.NoError(t, rt.Shutdown(sctx))
		})
	}
}
