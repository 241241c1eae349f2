package workers

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testRun returns a bare run of id with a run id of its own.
func testRun(rt *Runtime[*MemStore], id string) *Task {
	return rt.newRun(ctx, id, "", caller{system: true}, submitOptions{}, nil)
}

func TestRunSetKeepsAReplacedRunUntilItSettles(t *testing.T) {
	rt := memRuntime(t)
	s := newRunSet(nil)
	first, second := testRun(rt, "a"), testRun(rt, "a")
	assert.Empty(t, s.publish(first))
	assert.Equal(t, []*Task{first}, s.publish(second), "the successor takes the handle")
	assert.Same(t, second, s.get("a"))
	assert.ElementsMatch(t, []*Task{first, second}, s.all(), "the predecessor is kept until it settles")

	s.settle(first)
	assert.Same(t, second, s.get("a"), "a predecessor's settling leaves its successor's handle")
	assert.Equal(t, 1, s.len())
	s.settle(second)
	assert.Nil(t, s.get("a"))
	assert.Zero(t, s.len())
}

// recordRun returns a run of id of rt, registered in rt's MemStore as a
// runtime registers it: inserted, or in place of the run prev's record.
func recordRun(t *testing.T, rt *Runtime[*MemStore], id string, prev *Task) *Task {
	t.Helper()
	r := testRun(rt, id)
	var err error
	if prev == nil {
		r.rec, err = rt.store.insert(ctx, r.record(), r.ids)
	} else {
		r.rec, err = rt.store.replace(ctx, r.record(), r.ids, prev.RunID())
	}
	require.NoError(t, err)
	return r
}

// Over a MemStore, a run's record keeps its handle: a re-run's record
// takes the handle from its predecessor's, which is kept among the others
// until it settles, and a settled run's record lets go of it.
func TestRunSetOverAMemStoreKeepsHandlesInTheRecords(t *testing.T) {
	rt := memRuntime(t)
	s := rt.runs
	require.NotNil(t, s.mem, "a runtime over a MemStore keeps its handles in the records")
	first := recordRun(t, rt, "a", nil)
	assert.Empty(t, s.publish(first))
	assert.Same(t, first, s.get("a"))
	assert.Same(t, first, first.rec.run)

	second := recordRun(t, rt, "a", first)
	assert.Nil(t, first.rec.run, "the replaced record gives up its run")
	assert.Nil(t, s.get("a"), "the predecessor lost its handle with its record")
	assert.Equal(t, []*Task{first}, s.publish(second), "the successor supersedes the predecessor")
	assert.Same(t, second, s.get("a"))
	assert.ElementsMatch(t, []*Task{first, second}, s.all(), "the predecessor is kept until it settles")
	assert.ElementsMatch(t, []*Task{second, first}, s.ofID("a"))
	assert.ElementsMatch(t, []*Task{second, first}, s.matching(map[string]struct{}{"a": {}}))

	s.settle(first)
	assert.Same(t, second, s.get("a"), "a predecessor's settling leaves its successor's handle")
	assert.Equal(t, 1, s.len())
	rec := second.rec
	s.settle(second)
	assert.Nil(t, s.get("a"))
	assert.Nil(t, rec.run, "a settled run's record, which the store keeps, no longer holds it")
	assert.Zero(t, s.len())
}

// runSetModes runs f over a runSet that keeps its handles by id, and
// over one whose MemStore's records keep them. newRun returns a run of
// id, registered in place of prev's when the records keep the handles.
func runSetModes(t *testing.T, f func(t *testing.T, rt *Runtime[*MemStore], s *runSet, newRun func(id string, prev *Task) *Task)) {
	t.Run("by id", func(t *testing.T) {
		rt := memRuntime(t)
		f(t, rt, newRunSet(nil), func(id string, _ *Task) *Task { return testRun(rt, id) })
	})
	t.Run("in records", func(t *testing.T) {
		rt := memRuntime(t)
		require.NotNil(t, rt.runs.mem)
		f(t, rt, rt.runs, func(id string, prev *Task) *Task { return recordRun(t, rt, id, prev) })
	})
}

func TestRunSetForgetKeepsRunsWithoutHandles(t *testing.T) {
	runSetModes(t, func(t *testing.T, rt *Runtime[*MemStore], s *runSet, newRun func(string, *Task) *Task) {
		var runs []*Task
		for i := range 40 { // over every shard, most likely
			r := newRun(fmt.Sprint("k", i), nil)
			s.publish(r)
			runs = append(runs, r)
		}
		retired := testRun(rt, "retired")
		s.addOther(retired)
		runs = append(runs, retired)

		assert.ElementsMatch(t, runs, s.forget())
		for _, r := range runs {
			assert.Nil(t, s.get(r.ID()), "no id is taken for alive after forget")
			if r.rec != nil {
				assert.Nil(t, r.rec.run, "no record keeps a forgotten run")
			}
		}
		assert.Equal(t, len(runs), s.len(), "forgotten runs are tracked until they settle")
		assert.ElementsMatch(t, []*Task{runs[3], retired}, s.matching(map[string]struct{}{runs[3].ID(): {}, "retired": {}}))
		for _, r := range runs {
			s.settle(r)
		}
		assert.Zero(t, s.len())
		assert.Empty(t, s.all())
	})
}

// Runs of different ids publish and settle concurrently; each id's
// handle stays with its newest run, and the set holds nothing else.
func TestRunSetConcurrentPublishAndSettle(t *testing.T) {
	runSetModes(t, func(t *testing.T, rt *Runtime[*MemStore], s *runSet, newRun func(string, *Task) *Task) {
		var wg sync.WaitGroup
		last := make([]*Task, 8)
		for g := range last {
			wg.Go(func() {
				id := fmt.Sprint("id", g)
				var prev *Task
				for range 200 {
					r := newRun(id, prev)
					for _, old := range s.publish(r) {
						s.settle(old)
					}
					prev = r
				}
				last[g] = prev
			})
		}
		wg.Wait()
		for g, r := range last {
			assert.Same(t, r, s.get(fmt.Sprint("id", g)))
		}
		assert.ElementsMatch(t, last, s.all())
		assert.Equal(t, len(last), s.len())
		for _, r := range last {
			s.settle(r)
		}
		assert.Zero(t, s.len())
	})
}

// holdListener stops rt's listener, and its sync loop, before they read
// a run's record, until release is called or the test ends (before the
// runtime's Shutdown, which would wait for them).
func holdListener[S Store](t *testing.T, rt *Runtime[S]) (release func()) {
	held := make(chan struct{})
	release = sync.OnceFunc(func() { close(held) })
	t.Cleanup(release)
	rt.hooks.Store(&hooks{syncRead: func() { <-held }})
	return release
}

// A record that leaves the store by another way than this runtime's
// re-run takes its run's handle with it, and the run is kept among the
// others, where a notice of its id finds it. The runtime's listener, whose
// first pass over its runs would find the record gone and end the run, is
// held before its read until the checks are done.
func TestRunWhoseRecordLeftTheStoreIsFoundAmongTheOthers(t *testing.T) {
	rt := memRuntime(t)
	release := holdListener(t, rt)
	sub, g := startGated(t, rt, "job")
	run := g.task.Load()
	require.Same(t, run, rt.runs.get(sub.ID))

	require.NoError(t, rt.store.ClearRecords(ctx))
	assert.Nil(t, rt.runs.get(sub.ID), "the handle left with the record")
	assert.Equal(t, []*Task{run}, rt.runs.ofID(sub.ID), "the run is among the others")
	assert.Equal(t, 1, rt.runs.len())
	release()
	g.open()
	eventually(t, func() bool { return rt.runs.len() == 0 }, "the run to settle")
}

// Over a shared MemStore, a run whose record another runtime replaced is
// cancelled as superseded as soon as its runtime hears of it, not at the
// next sync.
func TestRunWhoseRecordAnotherRuntimeReplacedIsCancelled(t *testing.T) {
	store := NewMemStore()
	rt := newRuntime(t, store, Config{SyncInterval: time.Hour})
	require.NoError(t, rt.Start(ctx))
	listening(t, store, 1)
	sub, g := startGated(t, rt, "job")

	rec, err := store.GetTask(ctx, sub.ID)
	require.NoError(t, err)
	next := Record{ID: sub.ID, RunID: "elsewhere.1", Watchers: rec.Watchers, CreatedAt: time.Now(), State: State{Status: StatusPending}}
	require.NoError(t, store.ReplaceTask(ctx, next, sub.RunID))
	wait(t, g.ran, "the superseded run to be cancelled")
	assert.ErrorIs(t, g.task.Load().cause(), ErrSuperseded)
	eventually(t, func() bool { return rt.runs.len() == 0 }, "the run to settle")
	got, err := store.GetTask(ctx, sub.ID)
	require.NoError(t, err)
	assert.Equal(t, "elsewhere.1", got.RunID, "the superseded run's late writes never land")
}

// A run of an id whose record was deleted while its run still executes
// here supersedes that run, as it would supersede the holder of a handle
// kept by id.
func TestRunSetOverAMemStorePublishSupersedesARunWhoseRecordWasDeleted(t *testing.T) {
	rt := memRuntime(t)
	s := rt.runs
	first := recordRun(t, rt, "a", nil)
	assert.Empty(t, s.publish(first))
	require.NoError(t, rt.store.ClearRecords(ctx))
	assert.Nil(t, s.get("a"))
	second := recordRun(t, rt, "a", nil)
	assert.Equal(t, []*Task{first}, s.publish(second))
	assert.Same(t, second, s.get("a"))
	s.settle(first)
	s.settle(second)
	assert.Zero(t, s.len())
}

// Re-submitting the key of a run whose record was deleted cancels that
// run as superseded: two runs of one id never execute side by side here.
// The runtime's listener hears of the deletion and would supersede the
// run too, so it is held before its read until the resubmission
// returned: only the resubmission can have cancelled the run by then.
func TestResubmittingAClearedKeySupersedesItsRun(t *testing.T) {
	store := NewMemStore()
	rt := newRuntime(t, store, Config{SyncInterval: time.Hour})
	release := holdListener(t, rt)
	first, g := startGated(t, rt, "job")
	require.NoError(t, store.ClearRecords(ctx))
	g2 := newGate()
	second, err := rt.Submit(ctx, "job", g2.fn, alice)
	require.NoError(t, err)
	require.NotEqual(t, first.RunID, second.RunID)
	require.ErrorIs(t, g.task.Load().cause(), ErrSuperseded, "cancelled by the resubmission, before it returned")
	release()
	wait(t, g.ran, "the first run to be cancelled")
	assert.ErrorIs(t, g.task.Load().cause(), ErrSuperseded)
	g2.open()
	settled(t, rt, second.ID)
}

// A record rewritten through ReplaceTask for the same run keeps that
// run's handle: the run is still alive here, and a submission joins it.
func TestRecordRewrittenForItsOwnRunKeepsTheHandle(t *testing.T) {
	store := NewMemStore()
	rt := newRuntime(t, store, Config{SyncInterval: time.Hour})
	first, g := startGated(t, rt, "job")
	rec, err := store.GetTask(ctx, first.ID)
	require.NoError(t, err)
	require.NoError(t, store.ReplaceTask(ctx, rec, rec.RunID))
	assert.Same(t, g.task.Load(), rt.runs.get(first.ID), "the new record keeps the handle")

	sub, err := rt.Submit(ctx, "job", noop, alice)
	require.NoError(t, err)
	assert.True(t, sub.Joined, "the run is alive")
	assert.Equal(t, first.RunID, sub.RunID)
	g.open()
	settled(t, rt, first.ID)
	eventually(t, func() bool { return rt.runs.len() == 0 }, "the run to settle")
	kept, ok := store.shard(first.ID).recs.get(first.ID)
	require.True(t, ok)
	assert.Nil(t, kept.run, "the record that replaced the run's own lets go of it at its end")
}

// A run whose record left the store before it was published waits among
// the others, and publishing it supersedes nothing, itself included.
func TestRunSetOverAMemStorePublishAfterTheRecordLeft(t *testing.T) {
	rt := memRuntime(t)
	s := rt.runs
	r := recordRun(t, rt, "a", nil)
	require.NoError(t, rt.store.ClearRecords(ctx))
	assert.Empty(t, s.publish(r))
	assert.Nil(t, s.get("a"))
	assert.Equal(t, []*Task{r}, s.ofID("a"), "among the others")
	assert.Nil(t, r.rec.run, "a removed record keeps no run")
	s.settle(r)
	assert.Zero(t, s.len())
}

// A run whose registering write failed in a way that may have landed is
// retired: over a MemStore it waits among the others, holding no record,
// until its fenced end settles it, and leaves nothing stored.
func TestRetiredRunOverAMemStoreSettles(t *testing.T) {
	rt := memRuntime(t)
	r := rt.newRun(ctx, "alice::k", "", caller{userID: "alice"}, submitOptions{}, noop)
	rt.retire(r, context.DeadlineExceeded)
	eventually(t, func() bool { return rt.runs.len() == 0 }, "the retired run to settle")
	assert.Nil(t, r.rec)
	_, err := rt.store.GetTask(ctx, "alice::k")
	assert.ErrorIs(t, err, ErrNotFound, "nothing stored")
}
