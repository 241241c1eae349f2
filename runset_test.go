package workers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
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

// writesFail is a store whose TransitionTask fails, transiently, while
// failing is set; its reads work.
type writesFail struct {
	Store
	failing atomic.Bool
	failed  atomic.Int64
}

func (s *writesFail) TransitionTask(ctx context.Context, id, runID string, from []Status, next State) (bool, error) {
	if s.failing.Load() {
		s.failed.Add(1)
		return false, errors.New("connection reset")
	}
	return s.Store.TransitionTask(ctx, id, runID, from, next)
}

// endedElsewhere submits alice's task k over a runtime on s, whose
// observer sends each finished event to the channel it returns, waits
// for the callback to start, then has another process cancel the run in
// mem and s's writes fail. The runtime's cleanup Shutdown must succeed
// unless mayLeave.
func endedElsewhere(t *testing.T, mem *MemStore, s *writesFail, cfg Config, mayLeave bool) (*Runtime[*writesFail], Submission, *gate, chan Event) {
	t.Helper()
	finished := make(chan Event, 4)
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.Observers = []Observer{ObserverFunc(func(_ context.Context, e Event) {
		if e.Kind == EventFinished {
			finished <- e
		}
	})}
	rt := NewRuntime(s, cfg)
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := rt.Shutdown(sctx); !mayLeave {
			assert.NoError(t, err)
		}
	})
	g := newGate()
	sub, err := rt.Submit(context.Background(), "k", g.fn, alice)
	require.NoError(t, err)
	wait(t, g.started, "the run to start")
	st := State{Status: StatusCancelled, Cause: CauseCancelled, Error: "cancelled elsewhere", CompletedAt: now()}
	ok, err := mem.TransitionTask(context.Background(), sub.ID, sub.RunID, []Status{StatusRunning}, st)
	require.NoError(t, err)
	require.True(t, ok)
	s.failing.Store(true)
	return rt, sub, g, finished
}

// reportedOnce waits for the one finished event of sub's run, which
// another process cancelled, and for the run to settle with no other.
func reportedOnce[S Store](t *testing.T, rt *Runtime[S], sub Submission, finished chan Event) {
	t.Helper()
	select {
	case e := <-finished:
		assert.Equal(t, sub.RunID, e.RunID)
		assert.Equal(t, StatusCancelled, e.Status)
		assert.Equal(t, CauseCancelled, e.Cause)
	case <-time.After(10 * time.Second):
		t.Fatal("the end found was never reported")
	}
	eventually(t, func() bool { return rt.handle(sub.ID, sub.RunID) == nil }, "the run to settle")
	select {
	case e := <-finished:
		t.Fatalf("the end reported twice: %+v", e)
	default:
	}
}

// pausedPass starts a sync pass that stops at its first read of a
// record, and returns once it has: resume lets it go on, and synced is
// closed when the pass ends.
func pausedPass[S Store](t *testing.T, rt *Runtime[S]) (resume chan<- struct{}, synced <-chan struct{}) {
	t.Helper()
	paused, r := make(chan struct{}), make(chan struct{})
	var once sync.Once
	rt.hooks.Store(&hooks{syncRead: func() { once.Do(func() { close(paused); <-r }) }})
	t.Cleanup(func() { rt.hooks.Store(nil) })
	done := make(chan struct{})
	go func() { defer close(done); rt.syncRuns(context.Background()) }()
	wait(t, paused, "the sync to find the run running")
	return r, done
}

// The sync loop that finds a run ended elsewhere while the run's outcome
// write retries (the store's writes fail, its reads work) does not wait
// for that write: the pass goes on, and the write, which cannot land
// over that end, reports it, once, when it gives up on the store or is
// fenced out, also once the record was replaced since.
func TestSyncDoesNotWaitForARunsRetryingWrite(t *testing.T) {
	for _, c := range []string{"fenced", "replaced", "shutdown"} {
		t.Run(c, func(t *testing.T) {
			bg := context.Background()
			mem := NewMemStore()
			s := &writesFail{Store: mem}
			rt, sub, g, finished := endedElsewhere(t, mem, s, Config{}, c == "shutdown")

			resume, synced := pausedPass(t, rt)
			g.open() // the callback returns; its outcome write fails, and retries
			eventually(t, func() bool { return s.failed.Load() >= 1 }, "the outcome write to fail")
			close(resume)
			wait(t, synced, "the sync pass, while the run's write still retries")
			select {
			case e := <-finished:
				t.Fatalf("an end reported while the run's write retries: %+v", e)
			default:
			}
			switch c {
			case "replaced":
				// Another process runs the key again before the write is
				// fenced out.
				next := Record{ID: sub.ID, RunID: "elsewhere.1", Watchers: []string{"alice"}, CreatedAt: now(), State: State{Status: StatusPending}}
				require.NoError(t, mem.ReplaceTask(bg, next, sub.RunID))
				s.failing.Store(false) // the write is fenced out
			case "shutdown":
				// The write gives up at Shutdown's cutoff.
				sctx, cancel := context.WithTimeout(bg, 50*time.Millisecond)
				defer cancel()
				assert.Error(t, rt.Shutdown(sctx), "a run's write left")
			default:
				s.failing.Store(false) // the write is fenced out
			}
			reportedOnce(t, rt, sub, finished)
		})
	}
}

// retryHeld is a store whose write of a run's second attempt lands, then
// waits for release before it answers.
type retryHeld struct {
	Store
	landed, release chan struct{}
}

func (s *retryHeld) TransitionTask(ctx context.Context, id, runID string, from []Status, next State) (bool, error) {
	ok, err := s.Store.TransitionTask(ctx, id, runID, from, next)
	if next.Status == StatusRunning && next.Attempt == 2 {
		close(s.landed)
		<-s.release
	}
	return ok, err
}

// A retry that lands while the sync loop finds the run ended elsewhere:
// the pass does not wait for the write, and a later pass cancels the
// attempt the retry began and reports the end, once.
func TestSyncCancelsOnALaterPassARetryThatLandedWhileItChecked(t *testing.T) {
	bg := context.Background()
	mem := NewMemStore()
	s := &retryHeld{Store: mem, landed: make(chan struct{}), release: make(chan struct{})}
	finished := make(chan Event, 4)
	rt := newRuntime(t, s, Config{Logger: slog.New(slog.DiscardHandler), Observers: []Observer{ObserverFunc(func(_ context.Context, e Event) {
		if e.Kind == EventFinished {
			finished <- e
		}
	})}})
	first, second := make(chan struct{}), make(chan struct{})
	failFirst := make(chan struct{})
	cause := make(chan error, 1)
	sub, err := rt.Submit(bg, "k", func(ctx context.Context, task *Task) (any, error) {
		if task.Attempt() == 1 {
			close(first)
			<-failFirst
			return nil, errors.New("try again")
		}
		close(second)
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return nil, context.Cause(ctx)
	}, alice, WithRetry(RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond}))
	require.NoError(t, err)
	wait(t, first, "the first attempt")

	resume, synced := pausedPass(t, rt)
	close(failFirst)
	wait(t, s.landed, "the retry's write to land")
	// Another process cancels the run's second attempt.
	st := State{Status: StatusCancelled, Cause: CauseCancelled, Error: "cancelled elsewhere", Attempt: 2, CompletedAt: now()}
	ok, err := mem.TransitionTask(bg, sub.ID, sub.RunID, []Status{StatusRunning}, st)
	require.NoError(t, err)
	require.True(t, ok)
	close(resume)
	wait(t, synced, "the sync pass, while the retry's write has not answered")
	close(s.release)
	wait(t, second, "the second attempt, which the retry began")

	rt.syncRuns(bg) // a later pass
	select {
	case err := <-cause:
		assert.ErrorIs(t, err, ErrCancelled)
	case <-time.After(10 * time.Second):
		t.Fatal("the second attempt was never cancelled")
	}
	reportedOnce(t, rt, sub, finished)
}

// Two passes at once (the timed one and the notice checker's): the first
// keeps the end it read and goes on; the record is then replaced, and
// the second, which found the run writing too, finds the write over by
// the time it would keep anything. It must not drop the first's end,
// which the fenced-out write then reports.
func TestSyncKeptEndSurvivesAnotherPass(t *testing.T) {
	bg := context.Background()
	mem := NewMemStore()
	s := &writesFail{Store: mem}
	rt, sub, g, finished := endedElsewhere(t, mem, s, Config{SyncInterval: time.Hour}, false)

	p1, r1, p2, r2 := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	k2, rk2, w, rw := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	var reads, keeps, writes atomic.Int32
	rt.hooks.Store(&hooks{
		syncRead: func() {
			switch reads.Add(1) {
			case 1:
				close(p1)
				<-r1
			case 2:
				close(p2)
				<-r2
			}
		},
		keepEnd: func() {
			if keeps.Add(1) == 2 {
				close(k2)
				<-rk2
			}
		},
		wrote: func() {
			if writes.Add(1) == 1 {
				close(w)
				<-rw
			}
		},
	})
	defer rt.hooks.Store(nil)
	d1, d2 := make(chan struct{}), make(chan struct{})
	go func() { defer close(d1); rt.checkRuns(bg, nil, true) }()
	wait(t, p1, "the first pass past its progress check")
	go func() { defer close(d2); rt.checkRuns(bg, nil, true) }()
	wait(t, p2, "the second pass past its progress check")
	g.open() // the outcome write fails, and retries
	eventually(t, func() bool { return s.failed.Load() >= 1 }, "the outcome write to fail")
	close(r1)
	wait(t, d1, "the first pass, which keeps the end and goes on")
	// Another process runs the key again.
	next := Record{ID: sub.ID, RunID: "elsewhere.1", Watchers: []string{"alice"}, CreatedAt: now(), State: State{Status: StatusPending}}
	require.NoError(t, mem.ReplaceTask(bg, next, sub.RunID))
	close(r2)
	wait(t, k2, "the second pass to find the run writing")
	s.failing.Store(false) // the write is fenced out
	wait(t, w, "the write to end")
	close(rk2)
	wait(t, d2, "the second pass, which finds the write over")
	kept := func() (n int) {
		rt.found.Range(func(any, any) bool { n++; return true })
		return n
	}
	assert.Equal(t, 1, kept(), "the end the first pass kept, after the second pass and before the write looks for it")
	close(rw)
	reportedOnce(t, rt, sub, finished)
	assert.Zero(t, kept(), "an end left kept once the run settled")
}

// landedInsertFails is a store whose InsertTask stores the record, which
// someone then cancels, and reports a failure, as a lost acknowledgement
// would.
type landedInsertFails struct{ bareStore }

func (s landedInsertFails) InsertTask(ctx context.Context, rec Record) error {
	if err := s.bareStore.InsertTask(ctx, rec); err != nil {
		return err
	}
	st := rec.State
	causeOutcome(ErrCancelled).apply(&st, now())
	if _, err := s.bareStore.TransitionTask(ctx, rec.ID, rec.RunID, []Status{rec.Status}, st); err != nil {
		return err
	}
	return errors.New("connection reset by peer")
}

// A run retired after its insert reported a failure, whose record
// someone else then ended, reports that end, found by its fenced-out
// write, to Wait and the streams at once: it is never announced, so the
// end does not wait in Runtime.early for an announce.
func TestRetiredRunsEndFoundElsewhereDoesNotWait(t *testing.T) {
	rt := newRuntime(t, landedInsertFails{bareStore{NewMemStore()}}, Config{})
	_, err := rt.SubmitSequential(ctx, "q", "k", noop, alice)
	require.Error(t, err)
	eventually(t, func() bool { return rt.runs.len() == 0 }, "the retired run to settle")
	n := 0
	rt.early.Range(func(any, any) bool { n++; return true })
	assert.Zero(t, n, "ends waiting for an announce")
}
