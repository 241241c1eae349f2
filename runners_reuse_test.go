package workers

import (
	"bytes"
	"context"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runnerParked waits until rt has exactly one runner, parked in its
// receive: a submission now is handed to that warm goroutine.
func runnerParked[S Store](t *testing.T, rt *Runtime[S]) {
	t.Helper()
	eventually(t, func() bool {
		live, idle := runnerCounts(rt.runners)
		if live != 1 || idle != 1 {
			return false
		}
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "[select") && strings.Contains(g, ").runner(") {
				return true
			}
		}
		return false
	}, "the runner to park")
}

// labelProbe parks bob's run where the goroutine profile can find it.
//
//go:noinline
func labelProbe(release <-chan struct{}) { <-release }

// A warm runner, or a queue's processor, must not run one tenant's task
// under the profiler labels of another tenant's request: pprof.Do around
// a handler is the standard way to attribute CPU and goroutines, and the
// goroutine that alice's submission started inherited her handler's
// labels, then kept them for bob's task.
func TestWarmRunnerDoesNotCarryAnotherSubmittersProfilerLabels(t *testing.T) {
	for _, queue := range []string{"", "reports"} {
		t.Run("queue="+queue, func(t *testing.T) {
			rt := memRuntime(t)
			pprof.Do(context.Background(), pprof.Labels("tenant", "label-of-alice"), func(lctx context.Context) {
				var sub Submission
				var err error
				if queue == "" {
					sub, err = rt.Submit(lctx, "report", noop, alice)
				} else {
					sub, err = rt.SubmitSequential(lctx, queue, "report", noop, alice)
				}
				require.NoError(t, err)
				require.Equal(t, StatusCompleted, settled(t, rt, sub.ID).Status)
			})
			if queue == "" {
				runnerParked(t, rt)
			}

			started, release := make(chan struct{}), make(chan struct{})
			sub, err := submitOn(rt, queue, "report", func(context.Context, *Task) (any, error) {
				close(started)
				labelProbe(release)
				return nil, nil
			}, bob)
			require.NoError(t, err)
			wait(t, started, "bob's run to start")

			var prof bytes.Buffer
			require.NoError(t, pprof.Lookup("goroutine").WriteTo(&prof, 1))
			close(release)
			settled(t, rt, sub.ID)

			var bobs string
			for _, rec := range strings.Split(prof.String(), "\n\n") {
				if strings.Contains(rec, ".labelProbe+") {
					bobs = rec
				}
			}
			require.NotEmpty(t, bobs, "bob's run is in the goroutine profile")
			assert.NotContains(t, bobs, "label-of-alice", "bob's task runs under alice's profiler labels:\n%s", bobs)
		})
	}
}

// debug.SetPanicOnFault applies to the calling goroutine only: a task
// that sets it changes how a fault in its own code ends, and nobody
// else's. On a warm runner the next task, another tenant's, inherits it.
func TestWarmRunnerDoesNotPassOnPanicOnFault(t *testing.T) {
	rt := memRuntime(t)
	sub, err := rt.Submit(ctx, "faulty", func(context.Context, *Task) (any, error) {
		debug.SetPanicOnFault(true) // left set: this goroutine's business
		return nil, nil
	}, alice)
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, settled(t, rt, sub.ID).Status)
	runnerParked(t, rt)

	var inherited atomic.Bool
	sub, err = rt.Submit(ctx, "next", func(context.Context, *Task) (any, error) {
		old := debug.SetPanicOnFault(false)
		inherited.Store(old)
		return nil, nil
	}, bob)
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, settled(t, rt, sub.ID).Status)
	assert.False(t, inherited.Load(), "bob's task inherited the panic-on-fault setting alice's task left on the runner")
}
