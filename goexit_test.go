package workers

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A callback that ends its goroutine with runtime.Goexit, as testing's
// FailNow and Fatal do, fails its run for good, at its first attempt,
// with a message that says so; it frees whatever the run held (its
// queue's turn, its count of running callbacks), the next task runs, and
// Shutdown leaves nothing behind (goleak, in TestMain, checks the
// goroutines).
func TestACallbackThatCallsGoexitFailsItsRun(t *testing.T) {
	goexit := func(_ context.Context, tk *Task) (any, error) {
		tk.SetProgress(10)
		runtime.Goexit()
		return "unreachable", nil
	}
	for _, c := range []struct {
		name   string
		cfg    Config
		submit func(rt *Runtime[*MemStore], key string, fn Func) (Submission, error)
	}{
		{"Async", Config{}, func(rt *Runtime[*MemStore], key string, fn Func) (Submission, error) {
			return rt.Submit(ctx, key, fn, alice, WithRetry(RetryPolicy{MaxAttempts: 3}))
		}},
		{"AsyncWithTimeout", Config{}, func(rt *Runtime[*MemStore], key string, fn Func) (Submission, error) {
			return rt.Submit(ctx, key, fn, alice, WithTimeout(time.Hour), WithRetry(RetryPolicy{MaxAttempts: 3}))
		}},
		{"AsyncUnderLimits", Config{Limits: Limits{MaxRunning: 1}}, func(rt *Runtime[*MemStore], key string, fn Func) (Submission, error) {
			return rt.Submit(ctx, key, fn, alice)
		}},
		{"Sequential", Config{}, func(rt *Runtime[*MemStore], key string, fn Func) (Submission, error) {
			return rt.SubmitSequential(ctx, "q", key, fn, alice)
		}},
		{"SequentialTwoAtATime", Config{Limits: Limits{QueueConcurrency: 2}}, func(rt *Runtime[*MemStore], key string, fn Func) (Submission, error) {
			return rt.SubmitSequential(ctx, "q", key, fn, alice)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			logger, logs := bufferLogger()
			c.cfg.Logger = logger
			rt := NewRuntime(NewMemStore(), c.cfg)
			var subs []Submission
			for i := range 3 { // each of three in turn: a runner or a processor ended by one is replaced
				sub, err := c.submit(rt, "goexit-"+string(rune('a'+i)), goexit)
				require.NoError(t, err)
				subs = append(subs, sub)
			}
			for _, sub := range subs {
				snap := settled(t, rt, sub.ID)
				assert.Equal(t, StatusFailed, snap.Status)
				assert.Equal(t, CausePermanent, snap.Cause)
				assert.Contains(t, snap.Error, "runtime.Goexit")
				assert.Equal(t, 1, snap.Attempt, "not retried")
				assert.Equal(t, 10, snap.Progress)
			}
			assert.Equal(t, 3, strings.Count(logs.String(), "task called runtime.Goexit"), "logged once a run")
			assert.Contains(t, logs.String(), "goexit_test.go", "with the callback's stack")
			after, err := c.submit(rt, "after", noop)
			require.NoError(t, err)
			assert.Equal(t, StatusCompleted, settled(t, rt, after.ID).Status, "the next task runs")
			eventually(t, func() bool {
				st, err := rt.Stats(ctx, System)
				require.NoError(t, err)
				return st.Running == 0 && st.Waiting == 0
			}, "no callback counted running")
			shut, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			require.NoError(t, rt.Shutdown(shut))
		})
	}
}
