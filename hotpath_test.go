package workers

import (
	"context"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func runnerCounts(r *runners) (live, idle int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.live, r.idle
}

func TestRunnersAreReusedOneAtATime(t *testing.T) {
	rt := memRuntime(t)
	for i := range 10 {
		sub, err := rt.Submit(ctx, strconv.Itoa(i), noop, alice)
		require.NoError(t, err)
		settled(t, rt, sub.ID)
		eventually(t, func() bool { _, idle := runnerCounts(rt.runners); return idle == 1 }, "the runner to park")
	}
	live, _ := runnerCounts(rt.runners)
	require.Equal(t, 1, live, "runs submitted one at a time share one runner")
}

func TestRunnersParkedAreBounded(t *testing.T) {
	rt := memRuntime(t)
	const n = 3 * maxIdleRunners
	var started sync.WaitGroup
	release := make(chan struct{})
	started.Add(n)
	ids := make([]string, n)
	for i := range n {
		sub, err := rt.Submit(ctx, strconv.Itoa(i), func(context.Context, *Task) (any, error) {
			started.Done()
			<-release
			return nil, nil
		}, alice)
		require.NoError(t, err)
		ids[i] = sub.ID
	}
	started.Wait() // every run executes at once: runners never bound concurrency
	live, _ := runnerCounts(rt.runners)
	require.Equal(t, n, live)
	close(release)
	for _, id := range ids {
		settled(t, rt, id)
	}
	eventually(t, func() bool { live, _ := runnerCounts(rt.runners); return live == maxIdleRunners }, "surplus runners to end")
}

// growStack leaves its goroutine a stack with room for a run: the
// compiler kept its frame.
func TestGrowStackMakesRoomForARun(t *testing.T) {
	if strings.Contains(os.Getenv("GODEBUG"), "adaptivestackstart=1") {
		t.Skip("new goroutines may start with a stack as large as growStack's; the measure would say nothing")
	}
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // a GC would shrink the idle stacks
	// The measure is the growth of every goroutine's stacks, so a
	// goroutine of an earlier test that ends meanwhile takes its stack
	// off it: several tries, of many goroutines each, make that noise small.
	var perGoroutine int64
	for range 10 {
		if perGoroutine = grownStacks(256); perGoroutine >= runStack {
			break
		}
	}
	require.GreaterOrEqual(t, perGoroutine, int64(runStack), "stack bytes per goroutine after growStack")
}

// grownStacks starts n goroutines that call growStack and park, and
// returns the growth of the stacks in use, per goroutine, once all have.
func grownStacks(n int) int64 {
	var grown sync.WaitGroup
	release := make(chan struct{})
	defer close(release)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	grown.Add(n)
	for range n {
		go func() {
			growStack(0)
			grown.Done()
			<-release
		}()
	}
	grown.Wait()
	runtime.ReadMemStats(&after)
	return (int64(after.StackInuse) - int64(before.StackInuse)) / int64(n)
}

func TestShutdownEndsParkedRunners(t *testing.T) {
	rt := NewRuntime(NewMemStore(), Config{})
	sub, err := rt.Submit(ctx, "k", noop, alice)
	require.NoError(t, err)
	settled(t, rt, sub.ID)
	eventually(t, func() bool { _, idle := runnerCounts(rt.runners); return idle == 1 }, "the runner to park")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, rt.Shutdown(sctx))
	wait(t, rt.runners.gone, "the parked runner to end")
	live, _ := runnerCounts(rt.runners)
	require.Zero(t, live)
}

func TestRunSubmittedAfterRunnersStoppedStillRuns(t *testing.T) {
	rt := memRuntime(t)
	<-rt.runners.stop()
	tk := rt.newRun(ctx, "alice::k", "", caller{userID: "alice"}, submitOptions{}, noop)
	rt.publish(tk)
	rt.run(tk)
	wait(t, tk.doneChan(), "the run to settle on a goroutine of its own")
}

func TestDoneChannelMadeOnDemand(t *testing.T) {
	tk := memRuntime(t).newRun(ctx, "alice::k", "", caller{userID: "alice"}, submitOptions{}, noop)
	require.Nil(t, tk.run.Load().done, "no channel until someone waits")
	early := tk.doneChan()
	select {
	case <-early:
		t.Fatal("closed before the run settled")
	default:
	}
	tk.markSettled()
	wait(t, early, "a channel asked for before settling to close")
	wait(t, (&Task{settled: true}).doneChan(), "a channel asked for after settling to be closed")
}

type runCtxKey struct{}

func TestRunContextKeepsValuesNotCancellation(t *testing.T) {
	parent, cancel := context.WithCancelCause(context.WithValue(context.Background(), runCtxKey{}, "v"))
	tk := memRuntime(t).newRun(parent, "alice::k", "", caller{userID: "alice"}, submitOptions{}, noop)
	cancel(ErrShutdown)
	require.NoError(t, tk.ctx.Err(), "the submission's cancellation does not reach the run")
	require.Equal(t, "v", tk.ctx.Value(runCtxKey{}))
	_, has := tk.ctx.Deadline()
	require.False(t, has)
	tk.cancel(ErrCancelled)
	require.ErrorIs(t, context.Cause(tk.ctx), ErrCancelled, "the run's own cause, not the submission's")
}

func TestQueueItemStateMadeWhenItStarts(t *testing.T) {
	rt := memRuntime(t)
	queued := rt.newRun(ctx, "alice::q", "q", caller{userID: "alice"}, submitOptions{}, noop)
	require.Nil(t, queued.run.Load(), "a waiting queue item holds no state")
	async := rt.newRun(ctx, "alice::a", "", caller{userID: "alice"}, submitOptions{}, noop)
	require.NotNil(t, async.run.Load(), "an async run's state comes with its Task")

	g := newGate()
	sub, err := rt.SubmitSequential(ctx, "q", "k", g.fn, alice)
	require.NoError(t, err)
	wait(t, g.started, "the item to start")
	tk := g.task.Load()
	r := tk.run.Load()
	r.writeMu.Lock()
	require.True(t, r.running(), "the start write made the item's state")
	r.writeMu.Unlock()
	g.open()
	settled(t, rt, sub.ID)
}

func TestQueueItemContextMadeWhenItStartsOrIsCancelled(t *testing.T) {
	rt := memRuntime(t)
	parent := context.WithValue(context.Background(), runCtxKey{}, "v")
	tk := rt.newRun(parent, "alice::q", "q", caller{userID: "alice"}, submitOptions{}, noop)
	require.Nil(t, tk.run.Load(), "a waiting queue item holds no context, nor anything else of its run")
	require.Equal(t, "v", tk.valuesContext().Value(runCtxKey{}), "the submission's values are kept meanwhile")
	require.NoError(t, tk.valuesContext().Err())
	require.NoError(t, tk.CancelCause())

	tk.cancel(ErrCancelled)
	require.NotNil(t, tk.run.Load(), "a cancel makes what the run holds")
	require.ErrorIs(t, tk.ctx.Err(), context.Canceled, "a cancel makes the context, cancelled")
	tk.cancel(ErrShutdown)
	require.ErrorIs(t, tk.CancelCause(), ErrCancelled, "a cancel before the start is kept, the first cause sticks")
	tk.begin()
	require.ErrorIs(t, tk.ctx.Err(), context.Canceled, "the context is made cancelled")
	require.ErrorIs(t, context.Cause(tk.ctx), ErrCancelled)
	require.Equal(t, "v", tk.ctx.Value(runCtxKey{}))

	fresh := rt.newRun(parent, "alice::r", "q", caller{userID: "alice"}, submitOptions{}, noop)
	fresh.begin()
	require.NoError(t, fresh.ctx.Err())
	fresh.cancel(ErrSuperseded)
	require.ErrorIs(t, context.Cause(fresh.ctx), ErrSuperseded, "after the start a cancel reaches the context")
}

func TestIDsShareOneAllocation(t *testing.T) {
	rt := memRuntime(t)
	c := caller{userID: "alice"}
	k, err := rt.ids("k", c, ScopeUser)
	require.NoError(t, err)
	want, _ := scopedID("k", c, ScopeUser)
	require.Equal(t, want, k.id())
	require.True(t, strings.HasPrefix(k.runID(), rt.instance+"."), k.runID())
	other, _ := rt.ids("k", c, ScopeUser)
	require.NotEqual(t, k.runID(), other.runID(), "every run id is new")

	g, err := rt.ids("g", caller{system: true}, ScopeGlobal)
	require.NoError(t, err)
	require.Equal(t, "g", g.id())
	require.True(t, strings.HasPrefix(g.runID(), rt.instance+"."), g.runID())
	_, err = rt.ids("a::b", caller{system: true}, ScopeGlobal)
	require.ErrorIs(t, err, ErrInvalidKey)

	for _, by := range []struct {
		c     caller
		scope Scope
	}{{c, ScopeUser}, {caller{system: true}, ScopeGlobal}} {
		allocs := testing.AllocsPerRun(100, func() { _, _ = rt.ids("k", by.c, by.scope) })
		require.Equal(t, 1.0, allocs, "an id and its run id cost one allocation (%+v)", by.c)
	}

	// A Task keeps them as one string.
	tk := rt.newRunAs(ctx, k, &rt.noOpts, c, submitOptions{}, noop)
	require.Equal(t, k.id(), tk.ID())
	require.Equal(t, k.runID(), tk.RunID())
	rec := tk.record()
	require.Equal(t, [2]string{k.id(), k.runID()}, [2]string{rec.ID, rec.RunID})
}

// The whole async path, submit to terminal record, allocates five times:
// the Task, its context and cancel function, the id and run id, and the
// MemStore record. Each submission waits for the previous one, so a
// parked runner takes it.
func TestSubmitAllocations(t *testing.T) {
	rt := memRuntime(t)
	keys := make([]string, 400)
	for i := range keys {
		keys[i] = strconv.Itoa(i)
	}
	ran := make(chan struct{})
	fn := func(context.Context, *Task) (any, error) { ran <- struct{}{}; return nil, nil }
	i := 0
	allocs := leastAllocsPerRun(50, func() {
		if _, err := rt.Submit(ctx, keys[i], fn, alice); err != nil {
			t.Fatal(err)
		}
		i++
		<-ran
	})
	t.Logf("%v allocations per submission", allocs)
	require.LessOrEqual(t, allocs, 5.0)
}

func TestObserverOfQueueItemGetsSubmissionValues(t *testing.T) {
	var mu sync.Mutex
	var seen []any
	var kinds []EventKind
	rt := newRuntime(t, NewMemStore(), Config{Observers: []Observer{ObserverFunc(func(ctx context.Context, e Event) {
		mu.Lock()
		defer mu.Unlock()
		if e.TaskID == "alice::k" {
			seen = append(seen, ctx.Value(runCtxKey{}))
			kinds = append(kinds, e.Kind)
		}
	})}})
	g := newGate() // holds the queue, so that the item is submitted while it waits
	first, err := rt.SubmitSequential(ctx, "q", "first", g.fn, alice)
	require.NoError(t, err)
	wait(t, g.started, "the first item to start")
	sub, err := rt.SubmitSequential(context.WithValue(ctx, runCtxKey{}, "v"), "q", "k", noop, alice)
	require.NoError(t, err)
	g.open()
	settled(t, rt, first.ID)
	settled(t, rt, sub.ID)
	mu.Lock()
	defer mu.Unlock()
	require.Contains(t, kinds, EventSubmitted, "the submission of a waiting item is observed")
	for _, v := range seen {
		require.Equal(t, "v", v, "every event of the item, the submission's before it started included, carries the values")
	}
}

// leastAllocsPerRun is testing.AllocsPerRun(runs, f), the least of three
// measures: AllocsPerRun counts the whole process's allocations, so
// goroutines that earlier tests left winding down can add to one
// measure, never take from it. f is called 3*(runs+1) times.
func leastAllocsPerRun(runs int, f func()) float64 {
	allocs := math.Inf(1)
	for range 3 {
		allocs = min(allocs, testing.AllocsPerRun(runs, f))
	}
	return allocs
}
