package workers

import (
	"context"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A run with a timeout calls its callback on a goroutine of its own: the
// runner that waits for it, started by a labelled submission, does not
// keep that submitter's profiler labels, parked and through the later
// runs it executes for other owners.
func TestARunnerOfARunWithATimeoutDoesNotKeepTheSubmittersLabels(t *testing.T) {
	rt := newRuntime(t, NewMemStore(), Config{})
	require.NoError(t, rt.Start(ctx))
	pprof.Do(ctx, pprof.Labels("tenant", "first-submitter"), func(lctx context.Context) {
		sub, err := rt.Submit(lctx, "report", noop, alice, WithTimeout(time.Minute))
		require.NoError(t, err)
		settled(t, rt, sub.ID)
	})
	noGoroutineLabelled(t, `"tenant":"first-submitter"`)
}
