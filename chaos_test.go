package workers_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/storetest"
)

// The chaos test's knobs: WORKERS_CHAOS_SEED replays a run (its seed is
// logged), WORKERS_CHAOS_TASKS sets how many operations it makes
// (default 2,000; 300 with -short).
const (
	chaosSeedEnv  = "WORKERS_CHAOS_SEED"
	chaosTasksEnv = "WORKERS_CHAOS_TASKS"
)

// TestChaos drives a runtime over a MemStore behind a fault schedule that
// fails, at a rate, the store calls of every path before or after they
// land, hangs them until the store "resumes" a few milliseconds later,
// or slows them: several owners submit a pool of keys (so most
// submissions join or re-run a key), on the async path and on sequential
// queues, with retries and timeouts; they cancel and wait at random.
// Then the store is healed, and what must hold is checked: every
// acknowledged submission's key has a terminal record and Wait returns
// it; no record is left PENDING or RUNNING once the runtime has settled;
// Shutdown returns nil within its bound; no goroutine is left (goleak).
//
// It runs on MemStore only: the store is not what is under test, and a
// few thousand faulted operations take seconds here, minutes over a
// database. The per-call fault tests run the same schedule shapes
// deterministically.
func TestChaos(t *testing.T) {
	seed, ops := chaosParams(t)
	f := &storetest.Faults{}
	mem := workers.NewMemStore()
	rt := chaosRuntime(t, mem, f)
	stopResuming := resuming(f)
	ids := chaosStorm(t, rt, f, seed, ops)
	// Heal the store; everything acknowledged must now end.
	stopResuming()
	f.Heal()
	for _, id := range ids {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		// As System: a global key's re-run by another owner resets its
		// watchers, so the owner noted last may no longer watch it.
		snap, err := rt.Wait(ctx, id, workers.System)
		cancel()
		if !assert.NoError(t, err, "Wait(%q) after the store healed", id) {
			continue
		}
		assert.True(t, snap.Status.Terminal(), "%s is %s", id, snap.Status)
	}
	// No record is left live without a run: once the runs settle, none
	// is live at all (an ambiguous insert's ghost is ended by its retired
	// run, or by recovery).
	require.Eventually(t, func() bool {
		recs, err := mem.ListTasks(context.Background(), workers.Filter{Statuses: liveStates})
		return err == nil && len(recs) == 0
	}, 20*time.Second, 5*time.Millisecond, "records left live after the store healed (seed %d)", seed)

	const bound = 10 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	began := time.Now()
	require.NoError(t, rt.Shutdown(ctx), "seed %d", seed)
	assert.Less(t, time.Since(began), bound+100*time.Millisecond)
	recs, err := mem.ListTasks(context.Background(), workers.Filter{})
	require.NoError(t, err)
	for _, r := range recs {
		assert.True(t, r.Status.Terminal(), "record %q is %s after Shutdown (seed %d)", r.ID, r.Status, seed)
	}
	if t.Failed() {
		t.Logf("chaos: replay with %s=%d", chaosSeedEnv, seed)
	}
}

// chaosParams returns the seed and operation count of a chaos test, and
// logs them.
func chaosParams(t *testing.T) (seed uint64, ops int) {
	t.Helper()
	seed = uint64(time.Now().UnixNano())
	if s := os.Getenv(chaosSeedEnv); s != "" {
		var err error
		seed, err = strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, chaosSeedEnv)
	}
	ops = 2000
	if testing.Short() {
		ops = 300
	}
	if s := os.Getenv(chaosTasksEnv); s != "" {
		var err error
		ops, err = strconv.Atoi(s)
		require.NoError(t, err, chaosTasksEnv)
	}
	t.Logf("chaos: seed %d (replay with %s=%d), %d operations", seed, chaosSeedEnv, seed, ops)

	return seed, ops
}

// TestChaosShutdownUnderFaults runs the storm and shuts the runtime down
// while the store still fails, hangs and slows calls: Shutdown returns
// by its bound. Whatever it could not end is left for recovery: once the
// store heals, another runtime over it ends every live record the
// first left, within the lease's TTL, and Wait returns for every
// acknowledged submission.
func TestChaosShutdownUnderFaults(t *testing.T) {
	seed, ops := chaosParams(t)
	f := &storetest.Faults{}
	mem := workers.NewMemStore()
	rt := chaosRuntime(t, mem, f)
	stopResuming := resuming(f)
	stormed := make(chan []string, 1)
	go func() { stormed <- chaosStorm(t, rt, f, seed, ops) }()
	// Mid-storm, the store freezes for good: a tenth of the calls hang
	// until their context ends. Shutdown begins.
	require.Eventually(t, func() bool { return f.Calls(storetest.OpInsertTask) >= ops/4 }, 20*time.Second, time.Millisecond)
	stopResuming()
	freeze := rand.New(rand.NewPCG(seed, 99))
	f.Add(storetest.Rule{Fault: storetest.Hang, Match: func(c *storetest.Call) bool {
		return c.Op != storetest.OpListen && freeze.IntN(10) == 0
	}})
	const bound = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	began := time.Now()
	err := rt.Shutdown(ctx)
	took := time.Since(began)
	t.Logf("chaos: Shutdown under faults took %v and returned %v", took, err)
	// Every store call is cut off a slack (100ms) after ctx's end, and a
	// backlog write stuck in a call that ignores its context gets one
	// slack more (see Shutdown); the rest allows for the race detector's
	// pace.
	assert.Less(t, took, bound+2*100*time.Millisecond+50*time.Millisecond, "Shutdown outlived its bound (seed %d)", seed)
	ids := <-stormed // submissions are refused once Shutdown began
	f.Heal()

	other := chaosRuntime(t, mem, f)
	for _, id := range ids {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		snap, err := other.Wait(ctx, id, workers.System)
		cancel()
		if assert.NoError(t, err, "Wait(%q) after the store healed (seed %d)", id, seed) {
			assert.True(t, snap.Status.Terminal(), "%s is %s", id, snap.Status)
		}
	}
	require.Eventually(t, func() bool {
		recs, err := mem.ListTasks(context.Background(), workers.Filter{Statuses: liveStates})
		return err == nil && len(recs) == 0
	}, 20*time.Second, 5*time.Millisecond, "records left live after recovery (seed %d)", seed)
	// The first runtime's callbacks that ignored their context return;
	// its second Shutdown waits for them. It still counts the records it
	// gave up writing, which recovery has ended since.
	done, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	if err := rt.Shutdown(done); err != nil {
		assert.Contains(t, err.Error(), "left 0 runs or goroutines executing", "the first runtime's second Shutdown")
	}
	require.NoError(t, other.Shutdown(done))
}

// chaosConfig is the runtime configuration of the chaos tests: short
// leases and loops, so that recovery and sync run during the storm.
var chaosConfig = workers.Config{
	Logger:          quiet,
	LeaseInterval:   50 * time.Millisecond,
	LeaseTTL:        time.Second,
	RecoverInterval: 20 * time.Millisecond,
	SyncInterval:    20 * time.Millisecond,
}

// chaosRuntime starts a runtime over mem behind f.
func chaosRuntime(t *testing.T, mem *workers.MemStore, f *storetest.Faults) *workers.Runtime[workers.Store] {
	t.Helper()
	mem.SetWatchAuthorizer(func(string, []string, string) bool { return true })
	rt := workers.NewRuntime(storetest.Faulty(mem, f), chaosConfig)
	require.NoError(t, rt.Start(context.Background()))
	return rt
}

// chaosStorm adds the fault schedule to f and runs ops random operations
// on rt from several goroutines. It returns the ids of the acknowledged
// submissions. Hung calls hang until something releases them (see
// resuming).
func chaosStorm(t *testing.T, rt *workers.Runtime[workers.Store], f *storetest.Faults, seed uint64, ops int) (ids []string) {
	// The schedule: 5% of the calls on every path but Listen's fail.
	// Match runs under the schedule's lock, so one rand serves it.
	faultRand := rand.New(rand.NewPCG(seed, 1))
	f.Add(storetest.Rule{Fault: storetest.FailBefore, Match: func(c *storetest.Call) bool {
		return c.Op != storetest.OpListen && faultRand.Float64() < 0.02
	}})
	f.Add(storetest.Rule{Fault: storetest.FailAfter, Match: func(c *storetest.Call) bool {
		return c.Op != storetest.OpListen && faultRand.Float64() < 0.02
	}})
	f.Add(storetest.Rule{Fault: storetest.Hang, Match: func(c *storetest.Call) bool {
		return c.Op != storetest.OpListen && faultRand.Float64() < 0.005
	}})
	f.Add(storetest.Rule{Fault: storetest.Delay, Delay: 2 * time.Millisecond, Match: func(c *storetest.Call) bool {
		return c.Op != storetest.OpListen && faultRand.Float64() < 0.005
	}})
	owners := []workers.Owner{workers.MustOwner("ann"), workers.MustOwner("ben"), workers.MustOwner("cid")}
	var (
		mu    sync.Mutex
		acked = map[string]workers.Owner{} // guarded by mu: id -> an owner that watched it
	)
	var submitted, joined, refused, cancels atomic.Int64
	const drivers = 8
	var wg sync.WaitGroup
	for d := range drivers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(2+d)))
			for range ops / drivers {
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				switch p := r.Float64(); {
				case p < 0.75:
					o := owners[r.IntN(len(owners))]
					key := fmt.Sprint("k", r.IntN(100))
					var scope []workers.SubmitOption
					if r.IntN(4) == 0 {
						key = fmt.Sprint("g", r.IntN(20))
						scope = append(scope, workers.WithScope(workers.ScopeGlobal))
					}
					opts := append(scope, chaosOptions(r)...)
					fn := chaosFunc(r)
					var sub workers.Submission
					var err error
					if r.IntN(5) == 0 {
						sub, err = rt.SubmitSequential(ctx, fmt.Sprint("q", r.IntN(3)), key, fn, o, opts...)
					} else {
						sub, err = rt.Submit(ctx, key, fn, o, opts...)
					}
					if err != nil {
						refused.Add(1)
						break
					}
					submitted.Add(1)
					if sub.Joined {
						joined.Add(1)
					}
					mu.Lock()
					if _, ok := acked[sub.ID]; !ok {
						ids = append(ids, sub.ID)
					}
					acked[sub.ID] = o
					mu.Unlock()
				case p < 0.9:
					mu.Lock()
					var id string
					var o workers.Owner
					if len(ids) > 0 {
						id = ids[r.IntN(len(ids))]
						o = acked[id]
					}
					mu.Unlock()
					if id != "" && rt.Cancel(ctx, id, o) == nil {
						cancels.Add(1)
					}
				default:
					mu.Lock()
					var id string
					var o workers.Owner
					if len(ids) > 0 {
						id = ids[r.IntN(len(ids))]
						o = acked[id]
					}
					mu.Unlock()
					if id != "" {
						_, _ = rt.Wait(ctx, id, o)
					}
				}
				cancel()
			}
		})
	}
	wg.Wait()

	injected := map[storetest.Op]int{}
	for _, op := range []storetest.Op{storetest.OpInsertTask, storetest.OpReplaceTask, storetest.OpTransitionTask,
		storetest.OpGetTask, storetest.OpAddWatcher, storetest.OpListTasks, storetest.OpRenewLease, storetest.OpLiveInstances} {
		if n := f.Injected(op); n > 0 {
			injected[op] = n
		}
	}
	t.Logf("chaos: %d acknowledged submissions (%d joined) of %d keys, %d refused, %d cancels; faults injected: %v",
		submitted.Load(), joined.Load(), len(ids), refused.Load(), cancels.Load(), injected)
	return ids
}

// resuming releases the calls hung in f every few milliseconds, a store
// that freezes and resumes, until the func it returns is called.
func resuming(f *storetest.Faults) (stop func()) {
	quit := make(chan struct{})
	resumed := make(chan struct{})
	go func() {
		defer close(resumed)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				return
			case <-tick.C:
				f.Release()
			}
		}
	}()
	return func() {
		close(quit)
		<-resumed
	}
}

// chaosOptions picks a task's retry and timeout at random.
func chaosOptions(r *rand.Rand) []workers.SubmitOption {
	var opts []workers.SubmitOption
	if r.IntN(4) == 0 {
		opts = append(opts, workers.WithRetry(workers.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond}))
	}
	if r.IntN(10) == 0 {
		opts = append(opts, workers.WithTimeout(time.Duration(1+r.IntN(3))*time.Millisecond))
	}
	return opts
}

// chaosFunc returns a callback that runs for up to 3ms and mostly
// succeeds; some fail, some panic, some ignore their context.
func chaosFunc(r *rand.Rand) workers.Func {
	d := time.Duration(r.IntN(3000)) * time.Microsecond
	kind := r.IntN(20)
	return func(ctx context.Context, tk *workers.Task) (any, error) {
		tk.SetProgress(50)
		timer := time.NewTimer(d)
		defer timer.Stop()
		if kind == 0 { // stubborn: ignores its context
			<-timer.C
			return "late", nil
		}
		select {
		case <-timer.C:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
		switch kind {
		case 1:
			return nil, errors.New("chaos: callback failed")
		case 2:
			panic("chaos: callback panicked")
		}
		return map[string]int{"ms": int(d / time.Millisecond)}, nil
	}
}
