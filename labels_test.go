package workers

import (
	"bytes"
	"context"
	"runtime/pprof"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An ObserverFunc left nil (an optional hook the application left unset)
// is a Config the runtime cannot run with, as a nil Observer is: refused
// at Start and Submit, not a panic logged at every event.
func TestNilObserverFuncIsAnInvalidConfig(t *testing.T) {
	var onEvent ObserverFunc
	rt := newRuntime(t, NewMemStore(), Config{Observers: []Observer{onEvent}})
	err := rt.Start(ctx)
	assert.ErrorIs(t, err, ErrInvalidConfig, "Start with a nil ObserverFunc")
	assert.ErrorIs(t, err, ErrInvalidOption)
	_, err = rt.Submit(ctx, "k", noop, alice)
	assert.ErrorIs(t, err, ErrInvalidConfig, "Submit with a nil ObserverFunc")
}

// noGoroutineLabelled checks that no goroutine carries the label a
// submitter's pprof.Do gave its own.
func noGoroutineLabelled(t *testing.T, label string) {
	t.Helper()
	var dump bytes.Buffer
	require.NoError(t, pprof.Lookup("goroutine").WriteTo(&dump, 1))
	for _, block := range strings.Split(dump.String(), "\n\n") {
		assert.NotContains(t, block, label, "a goroutine of the runtime keeps the submitter's labels after its run ended")
	}
}

// The goroutines the first Submit starts (the runtime's loops, without
// Start) are the runtime's, not the submitter's: they do not keep its
// profiler labels for the runtime's life.
func TestBackgroundLoopsDoNotInheritTheFirstSubmittersLabels(t *testing.T) {
	rt := newRuntime(t, NewMemStore(), Config{})
	pprof.Do(ctx, pprof.Labels("tenant", "first-submitter"), func(lctx context.Context) {
		sub, err := rt.Submit(lctx, "report", noop, alice)
		require.NoError(t, err)
		settled(t, rt, sub.ID)
	})
	noGoroutineLabelled(t, `"tenant":"first-submitter"`)
}

// A queue's processor, started by the queue's first submission, runs no
// callback of its own when items run side by side: it does not keep the
// first submitter's profiler labels either.
func TestQueueProcessorDoesNotInheritTheFirstSubmittersLabels(t *testing.T) {
	rt := newRuntime(t, NewMemStore(), Config{Limits: Limits{QueueConcurrency: 2}})
	require.NoError(t, rt.Start(ctx))
	pprof.Do(ctx, pprof.Labels("tenant", "first-submitter"), func(lctx context.Context) {
		sub, err := rt.SubmitSequential(lctx, "exports", "report", noop, alice)
		require.NoError(t, err)
		settled(t, rt, sub.ID)
	})
	noGoroutineLabelled(t, `"tenant":"first-submitter"`)
}
