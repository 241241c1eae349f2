package workers

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

func heapAfterGC() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// Cleanup releases what a MemStore kept of the records it deletes: after
// a burst of tasks (a backfill, an incident), once Cleanup has deleted
// them, the heap comes back near where it was, rather than keeping the
// burst's index (the shards' tables and the per-user map) for the
// process's life.
func TestCleanupReleasesAMemStoresIndexAfterABurst(t *testing.T) {
	s := NewMemStore()
	rt := newRuntime(t, s, Config{})
	base := heapAfterGC()
	const n = 100000
	for i := range n {
		o := MustOwner(fmt.Sprint("o", i))
		_, err := rt.Submit(ctx, fmt.Sprint("k", i), noop, o)
		require.NoError(t, err)
	}
	eventually(t, func() bool { return rt.runs.len() == 0 }, "every run to settle")
	full := heapAfterGC()
	deleted, err := rt.Cleanup(ctx, 0)
	require.NoError(t, err)
	require.Equal(t, n, deleted)
	after := heapAfterGC()
	slots := 0
	for i := range s.shards {
		slots += len(s.shards[i].recs.byHash.slots) + len(s.shards[i].recs.byHash.old)
	}
	t.Logf("heap: %d KiB before, %d KiB with %d records, %d KiB once Cleanup deleted them all (table slots kept: %d; per-user map entries: %d)",
		base>>10, full>>10, n, after>>10, slots, len(s.byUser))
	require.Less(t, after-min(after, base), (full-base)/10, "Cleanup deleted every record, but the MemStore keeps the memory of their index")
}
