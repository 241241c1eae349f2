package workers

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// collect ranges over seq until it ends, failing after a deadline.
func collect(t *testing.T, seq iter.Seq2[Snapshot, error]) (snaps []Snapshot, err error) {
	t.Helper()
	for s, e := range seq {
		if e != nil {
			return snaps, e
		}
		snaps = append(snaps, s)
	}
	return snaps, nil
}

// A panicked run's stack reaches System's streams, as it does System's
// Status, and no Owner's: its end is the one event with it.
func TestStreamsShowAPanickedRunsStackToSystemOnly(t *testing.T) {
	rt := memRuntime(t)
	release := make(chan struct{})
	sub, err := rt.Submit(ctx, "job", func(context.Context, *Task) (any, error) {
		<-release
		panic("boom")
	}, alice)
	require.NoError(t, err)
	type stream struct {
		next func() (Snapshot, error, bool)
		seen Snapshot
	}
	streams := map[string]*stream{}
	for name, auth := range map[string]TaskAuthority{"system": System, "alice": alice} {
		next, first := pullFirst(t, rt.Watch(ctx, sub.ID, auth))
		streams[name] = &stream{next: next, seen: first}
	}
	close(release)
	for name, st := range streams {
		for !st.seen.Status.Terminal() {
			snap, err, ok := st.next()
			require.True(t, ok, name)
			require.NoError(t, err, name)
			st.seen = snap
		}
		require.Equal(t, CausePanicked, st.seen.Cause, name)
	}
	assert.Contains(t, streams["system"].seen.Stack, "TestStreamsShowAPanickedRunsStackToSystemOnly", "System's end: the panicking goroutine's stack")
	assert.Empty(t, streams["alice"].seen.Stack, "alice's end")
	status, err := rt.Status(ctx, sub.ID, System)
	require.NoError(t, err)
	assert.Equal(t, status.Stack, streams["system"].seen.Stack, "System's stream and its Status agree")
}

func TestWatchSeesProgressLiveAndEndsWithTerminal(t *testing.T) {
	rt := memRuntime(t)
	seen50 := make(chan struct{})
	fn := func(ctx context.Context, tk *Task) (any, error) {
		for p := 0; p <= 50; p += 5 {
			tk.SetProgress(p)
		}
		<-seen50 // only a live progress event gets past this: no sync loop runs
		for p := 55; p <= 100; p += 5 {
			tk.SetProgress(p)
		}
		return "done", nil
	}
	sub, err := rt.Submit(ctx, "job", fn, alice)
	require.NoError(t, err)
	var snaps []Snapshot
	closed := false
	for s, err := range rt.Watch(ctx, sub.ID, alice) {
		require.NoError(t, err)
		snaps = append(snaps, s)
		if s.Progress >= 50 && !closed {
			closed = true
			close(seen50)
		}
	}
	require.True(t, closed, "progress 50 was delivered while the run waited")
	last := snaps[len(snaps)-1]
	assert.Equal(t, StatusCompleted, last.Status, "the terminal snapshot comes last")
	for i := 1; i < len(snaps); i++ {
		assert.GreaterOrEqual(t, snaps[i].Progress, snaps[i-1].Progress, "progress never goes back")
		assert.False(t, snaps[i-1].Status.Terminal(), "nothing follows the terminal snapshot")
	}
}

func TestWatchRefusesNonWatcher(t *testing.T) {
	rt := memRuntime(t)
	g := newGate()
	sub, err := rt.Submit(ctx, "job", g.fn, alice)
	require.NoError(t, err)
	snaps, err := collect(t, rt.Watch(ctx, sub.ID, bob))
	assert.ErrorIs(t, err, ErrNotFound)
	assert.Empty(t, snaps, "a non-watcher sees nothing")
	_, err = collect(t, rt.Watch(ctx, sub.ID, nil))
	assert.ErrorIs(t, err, ErrNoAuthority)
	g.open()
}

func TestWatchOfAFinishedTaskYieldsItsEnd(t *testing.T) {
	rt := memRuntime(t)
	sub, err := rt.Submit(ctx, "job", returns(1, nil), alice)
	require.NoError(t, err)
	settled(t, rt, sub.ID)
	snaps, err := collect(t, rt.Watch(ctx, sub.ID, alice))
	require.NoError(t, err)
	require.Len(t, snaps, 1)
	assert.Equal(t, StatusCompleted, snaps[0].Status)
}

func TestWatchEndsWithTheFollowedRunsEndWhenAReRunExcludesTheWatcher(t *testing.T) {
	rt := memRuntime(t)
	g := newGate()
	sub, err := rt.Submit(ctx, "shared", g.fn, alice, WithScope(ScopeGlobal), WithWatchers(bob))
	require.NoError(t, err)
	next, stop := iter.Pull2(rt.Watch(ctx, sub.ID, bob))
	defer stop()
	first, err, ok := next()
	require.True(t, ok)
	require.NoError(t, err)
	assert.Equal(t, sub.RunID, first.RunID)

	// bob stalls; the run ends and alice re-runs the key without him.
	g.open()
	_, err = collect(t, rt.Watch(ctx, sub.ID, alice)) // returns once the end was published
	require.NoError(t, err)
	g2 := newGate()
	sub2, err := rt.Submit(ctx, "shared", g2.fn, alice, WithScope(ScopeGlobal))
	require.NoError(t, err)
	require.NotEqual(t, sub.RunID, sub2.RunID)

	// bob still gets the end of the run he followed, and nothing of the
	// new one.
	snap, err, ok := next()
	require.True(t, ok)
	require.NoError(t, err)
	assert.Equal(t, sub.RunID, snap.RunID)
	assert.Equal(t, StatusCompleted, snap.Status)
	_, _, ok = next()
	assert.False(t, ok, "the stream has ended")
	g2.open()
}

func TestSubscribeShowsOnlyVisibleTasks(t *testing.T) {
	rt := memRuntime(t)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next, stop := iter.Pull2(rt.Subscribe(sctx, bob))
	defer stop()
	g := newGate()
	live, err := rt.Submit(ctx, "live", g.fn, bob)
	require.NoError(t, err)
	defer g.open()
	first, err, _ := next() // subscribed: the live task comes first
	require.NoError(t, err)
	require.Equal(t, live.ID, first.ID)

	shared, err := rt.Submit(ctx, "shared", returns(1, nil), alice, WithScope(ScopeGlobal), WithWatchers(bob))
	require.NoError(t, err)
	settled(t, rt, shared.ID)
	_, err = rt.Submit(ctx, "private", returns(1, nil), alice)
	require.NoError(t, err)
	rerun, err := rt.Submit(ctx, "shared", returns(2, nil), alice, WithScope(ScopeGlobal)) // bob no longer a watcher
	require.NoError(t, err)
	settled(t, rt, rerun.ID)
	own, err := rt.Submit(ctx, "mine", returns(3, nil), bob)
	require.NoError(t, err)
	settled(t, rt, own.ID)

	// Order holds per task, not across tasks: read until both of bob's
	// finished tasks have ended.
	check := func(s Snapshot) {
		require.NotEqual(t, rerun.RunID, s.RunID, "the re-run without bob never reaches him")
		assert.True(t, s.ID == shared.ID || s.ID == own.ID || s.ID == live.ID, "only bob's tasks: got %s", s.ID)
	}
	var sharedEnd, ownEnd bool
	for !sharedEnd || !ownEnd {
		s, err, ok := next()
		require.True(t, ok)
		require.NoError(t, err)
		check(s)
		sharedEnd = sharedEnd || (s.RunID == shared.RunID && s.Status.Terminal())
		ownEnd = ownEnd || (s.RunID == own.RunID && s.Status.Terminal())
	}
	cancel()
	for {
		s, err, ok := next()
		require.True(t, ok)
		if err != nil {
			assert.ErrorIs(t, err, context.Canceled, "ctx's end ends the stream")
			break
		}
		check(s)
	}
}

// Subscribe's subscription starts at the call: a task that starts and
// ends before the range begins is still yielded, end included. A second
// range subscribes anew and sees only what is live by then.
func TestSubscribeStartsAtTheCall(t *testing.T) {
	rt := memRuntime(t)
	seq := subscribeThenEnd(t, rt, rt, "early")
	assert.Zero(t, rt.hub.n.Load(), "the range's end ends the subscription")

	// Ranged again: a new subscription, from now on.
	g := newGate()
	live, err := rt.Submit(ctx, "live", g.fn, alice)
	require.NoError(t, err)
	defer g.open()
	for s, err := range seq {
		require.NoError(t, err)
		assert.Equal(t, live.ID, s.ID, "the ended task is not live: only the live one shows")
		break
	}

	// One never ranged holds its subscription until ctx ends.
	actx, stop := context.WithCancel(ctx)
	_ = rt.Subscribe(actx, alice)
	assert.Equal(t, int32(1), rt.hub.n.Load(), "the call subscribes")
	stop()
	require.Eventually(t, func() bool { return rt.hub.n.Load() == 0 }, 5*time.Second, time.Millisecond,
		"ctx's end ends a subscription never ranged")
}

// Over a shared store, a runtime whose listener runs hears of another's
// runs from the call on as well: a task another runtime ends between the
// call and the range is yielded.
func TestSubscribeStartsAtTheCallAcrossRuntimes(t *testing.T) {
	store := NewMemStore()
	a, b := newRuntime(t, store, Config{}), newRuntime(t, store, Config{})
	require.NoError(t, a.Start(ctx))
	require.NoError(t, b.Start(ctx))
	listening(t, store, 2)
	subscribeThenEnd(t, b, a, "elsewhere")
}

// subscribeThenEnd subscribes alice on watcher, submits key as alice on
// runner and waits for its end, and only then ranges: the task's end
// must come. It returns the iterator, for a later range.
func subscribeThenEnd[S Store](t *testing.T, watcher, runner *Runtime[S], key string) iter.Seq2[Snapshot, error] {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	t.Cleanup(cancel)
	seq := watcher.Subscribe(sctx, alice)
	sub, err := runner.Submit(ctx, key, returns(1, nil), alice)
	require.NoError(t, err)
	settled(t, runner, sub.ID)
	for s, err := range seq {
		require.NoError(t, err, "the task's end was not yielded")
		require.Equal(t, sub.ID, s.ID)
		if s.Status.Terminal() {
			assert.Equal(t, StatusCompleted, s.Status)
			return seq
		}
	}
	t.Fatal("the stream ended before the task did")
	return nil
}

func TestStalledSubscriberGetsLatestNotBacklog(t *testing.T) {
	rt := memRuntime(t)
	g := newGate()
	sub, err := rt.Submit(ctx, "job", g.fn, alice)
	require.NoError(t, err)
	wait(t, g.started, "start")
	next, stop := iter.Pull2(rt.Watch(ctx, sub.ID, alice))
	defer stop()
	_, err, _ = next() // subscribed; now stall
	require.NoError(t, err)
	tk := g.task.Load()
	for i := range 100_000 {
		tk.SetProgress(i % 101) // never blocks on the stalled reader
	}
	tk.SetProgress(100)
	g.open()
	settled(t, rt, sub.ID)
	var rest []Snapshot
	for {
		s, err, ok := next()
		if !ok {
			break
		}
		require.NoError(t, err)
		rest = append(rest, s)
	}
	require.NotEmpty(t, rest)
	assert.LessOrEqual(t, len(rest), 3, "coalesced to the latest state, not a backlog")
	assert.Equal(t, StatusCompleted, rest[len(rest)-1].Status)
	assert.Equal(t, int32(0), rt.hub.n.Load(), "the subscription ended with the range")
}

func TestWatchFollowsAnotherRuntimesTask(t *testing.T) {
	store := NewMemStore()
	rt1 := newRuntime(t, store, Config{})
	rt2 := newRuntime(t, store, Config{})
	g := newGate()
	sub, err := rt2.Submit(ctx, "job", g.fn, alice)
	require.NoError(t, err)
	wait(t, g.started, "start")
	next, stop := iter.Pull2(rt1.Watch(ctx, sub.ID, alice))
	defer stop()
	s, err, _ := next()
	require.NoError(t, err)
	assert.Equal(t, StatusRunning, s.Status)
	g.open()
	for {
		s, err, ok := next()
		require.True(t, ok, "the stream ends with the terminal snapshot")
		require.NoError(t, err)
		if s.Status.Terminal() {
			assert.Equal(t, StatusCompleted, s.Status)
			break
		}
	}
}

func TestWatchEndsWithContext(t *testing.T) {
	rt := memRuntime(t)
	g := newGate()
	sub, err := rt.Submit(ctx, "job", g.fn, alice)
	require.NoError(t, err)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var got error
	for _, err := range rt.Watch(wctx, sub.ID, alice) {
		if err != nil {
			got = err
			break
		}
		cancel()
	}
	assert.ErrorIs(t, got, context.Canceled)
	assert.Equal(t, int32(0), rt.hub.n.Load())
	g.open()
}

func TestCancelRecordsActorAndReason(t *testing.T) {
	rt := memRuntime(t)
	g := newGate()
	sub, err := rt.Submit(ctx, "shared", g.fn, alice, WithScope(ScopeGlobal), WithWatchers(bob))
	require.NoError(t, err)
	require.NoError(t, rt.Cancel(ctx, sub.ID, bob, WithReason("  too\nslow\x00 \u202e now ")))
	snap, err := rt.Status(ctx, sub.ID, alice)
	require.NoError(t, err)
	assert.Equal(t, StatusCancelled, snap.Status)
	assert.Equal(t, "bob", snap.CancelledBy, "the owner sees that a watcher cancelled")
	assert.Equal(t, "too slow now", snap.CancelReason, "control and format characters are cleaned")

	g2 := newGate()
	sub2, err := rt.Submit(ctx, "other", g2.fn, alice)
	require.NoError(t, err)
	require.NoError(t, rt.Cancel(ctx, sub2.ID, System, WithReason(strings.Repeat("é", MaxReasonLen))))
	snap, err = rt.Status(ctx, sub2.ID, alice)
	require.NoError(t, err)
	assert.Empty(t, snap.CancelledBy, "System is no user")
	assert.Equal(t, CauseCancelled, snap.Cause)
	assert.LessOrEqual(t, len(snap.CancelReason), MaxReasonLen)
	assert.True(t, strings.HasPrefix(snap.CancelReason, "éé"))
	assert.NotContains(t, snap.CancelReason, "\uFFFD", "cut on a rune boundary")
}

// BenchmarkSetProgress measures SetProgress with nobody subscribed and
// with a subscriber that never reads: the cost must not grow with the
// stalled reader, and neither allocates.
func BenchmarkSetProgress(b *testing.B) {
	for _, stalled := range []bool{false, true} {
		name := "no-subscriber"
		if stalled {
			name = "stalled-subscriber"
		}
		b.Run(name, func(b *testing.B) {
			rt := memRuntime(b)
			g := newGate()
			sub, err := rt.Submit(ctx, "job", g.fn, alice)
			require.NoError(b, err)
			wait(b, g.started, "start")
			if stalled {
				next, stop := iter.Pull2(rt.Watch(ctx, sub.ID, alice))
				defer stop()
				next()
			}
			tk := g.task.Load()
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				tk.SetProgress(i % 101)
			}
			b.StopTimer()
			g.open()
		})
	}
}

// BenchmarkWatchManyTasks watches 10,000 tasks at once, one Watch each,
// while every task reports progress in 10 steps and completes: events/s
// is what the watchers received in all.
func BenchmarkWatchManyTasks(b *testing.B) {
	const tasks, steps = 10_000, 10
	for b.Loop() {
		b.StopTimer()
		rt := NewRuntime(NewMemStore(), Config{})
		release := make(chan struct{})
		fn := func(ctx context.Context, tk *Task) (any, error) {
			<-release
			for p := 1; p <= steps; p++ {
				tk.SetProgress(p * 100 / steps)
			}
			return nil, nil
		}
		ids := make([]string, tasks)
		for i := range ids {
			sub, err := rt.Submit(ctx, "t"+strconv.Itoa(i), fn, alice)
			if err != nil {
				b.Fatal(err)
			}
			ids[i] = sub.ID
		}
		var events atomic.Int64
		var wg sync.WaitGroup
		ready := make(chan struct{}, tasks)
		for _, id := range ids {
			wg.Go(func() {
				first := true
				for _, err := range rt.Watch(ctx, id, alice) {
					if err != nil {
						b.Error(err)
						return
					}
					if first {
						ready <- struct{}{}
						first = false
					}
					events.Add(1)
				}
			})
		}
		for range tasks {
			<-ready
		}
		b.StartTimer()
		start := time.Now()
		close(release)
		wg.Wait()
		elapsed := time.Since(start)
		b.StopTimer()
		b.ReportMetric(float64(events.Load())/elapsed.Seconds(), "events/s")
		b.ReportMetric(float64(events.Load())/tasks, "events/watcher")
		if err := rt.Shutdown(ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

func TestSubscribeFollowsAnotherRuntimeByPolling(t *testing.T) {
	mem := NewMemStore()
	store := leasedNoNotices{mem, mem} // no notices: Subscribe polls the live tasks
	rt1 := newRuntime(t, store, Config{})
	rt2 := newRuntime(t, store, Config{})
	g := newGate()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next, stop := iter.Pull2(rt1.Subscribe(sctx, alice))
	defer stop()
	own := newGate()
	_, err := rt1.Submit(ctx, "own", own.fn, alice)
	require.NoError(t, err)
	defer own.open()
	_, err, _ = next() // subscribed
	require.NoError(t, err)

	sub, err := rt2.Submit(ctx, "remote", g.fn, alice)
	require.NoError(t, err)
	wait(t, g.started, "start")
	seenLive := false
	for {
		s, err, ok := next()
		require.True(t, ok)
		require.NoError(t, err)
		if s.ID != sub.ID {
			continue
		}
		if !s.Status.Terminal() && !seenLive {
			seenLive = true
			g.open() // end it once rt1 has seen it live
			continue
		}
		if s.Status.Terminal() {
			assert.True(t, seenLive)
			assert.Equal(t, StatusCompleted, s.Status, "another runtime's end is read from the store")
			break
		}
	}
}

func TestStalledSubscribeStaysBounded(t *testing.T) {
	rt := memRuntime(t)
	g := newGate()
	_, err := rt.Submit(ctx, "live", g.fn, alice)
	require.NoError(t, err)
	defer g.open()
	next, stop := iter.Pull2(rt.Subscribe(ctx, alice))
	defer stop()
	_, err, _ = next() // subscribed; never read again
	require.NoError(t, err)
	for i := range 3 * maxPending {
		sub, err := rt.Submit(ctx, "t"+strconv.Itoa(i), returns(i, nil), alice)
		require.NoError(t, err)
		settled(t, rt, sub.ID)
	}
	rt.hub.mu.Lock()
	defer rt.hub.mu.Unlock()
	require.Len(t, rt.hub.subs, 1)
	require.Len(t, rt.hub.subs["alice"], 1)
	for s := range rt.hub.subs["alice"] {
		s.mu.Lock()
		assert.LessOrEqual(t, len(s.slots), maxPending, "the inbox is bounded")
		assert.True(t, s.resync, "past the bound, a re-read is due instead")
		s.mu.Unlock()
	}
}

// endHeld is a MemStore that holds the first run write of a terminal
// status once it has landed: closes held, then waits for resume. The run
// that made it has not yet reported its end.
type endHeld struct {
	*MemStore
	once   sync.Once
	held   chan struct{}
	resume chan struct{}
}

func newEndHeld() *endHeld {
	return &endHeld{MemStore: NewMemStore(), held: make(chan struct{}), resume: make(chan struct{})}
}

func (s *endHeld) TransitionTask(ctx context.Context, id, runID string, from []Status, next State) (bool, error) {
	ok, err := s.MemStore.TransitionTask(ctx, id, runID, from, next)
	if ok && next.Status.Terminal() {
		s.once.Do(func() {
			close(s.held)
			<-s.resume
		})
	}
	return ok, err
}

// reRunBehindALateEnd submits key, holds its run's end between the store
// and the report, re-runs the key with a gate, and returns both runs and
// a channel closed once the first run's end has been reported. Each run
// is submitted by alice with its options (firstOpts, secondOpts). With
// elsewhere set, the second is submitted through another runtime over
// the same records, whose clock is a second behind this one's.
func reRunBehindALateEnd(t *testing.T, elsewhere bool, firstOpts, secondOpts []SubmitOption) (rt *Runtime[*endHeld], s *endHeld, first, second Submission, g *gate, reported <-chan struct{}) {
	t.Helper()
	s = newEndHeld()
	done := make(chan struct{})
	var firstRun atomic.Value
	rt = newRuntime(t, s, Config{Observers: []Observer{ObserverFunc(func(_ context.Context, e Event) {
		if e.Kind == EventFinished && e.RunID == firstRun.Load() {
			close(done)
		}
	})}})
	ready := make(chan struct{})
	first, err := rt.Submit(ctx, "job", func(context.Context, *Task) (any, error) {
		<-ready
		return 1, nil
	}, alice, firstOpts...)
	require.NoError(t, err)
	firstRun.Store(first.RunID)
	close(ready)
	wait(t, s.held, "the first run's end to land")
	g = newGate()
	if elsewhere {
		second, err = newRuntime(t, slowClock{s.MemStore}, Config{}).Submit(ctx, "job", g.fn, alice, secondOpts...)
	} else {
		second, err = rt.Submit(ctx, "job", g.fn, alice, secondOpts...)
	}
	require.NoError(t, err)
	require.NotEqual(t, first.RunID, second.RunID, "the key ran anew")
	return rt, s, first, second, g, done
}

// slowClock is a MemStore as a runtime on a host whose clock is a second
// behind sees it: the records it writes whole carry creation times a
// second earlier than this host's clock says.
type slowClock struct{ *MemStore }

func (s slowClock) InsertTask(ctx context.Context, rec Record) error {
	rec.CreatedAt = rec.CreatedAt.Add(-time.Second)
	return s.MemStore.InsertTask(ctx, rec)
}

func (s slowClock) ReplaceTask(ctx context.Context, rec Record, prevRunID string) error {
	rec.CreatedAt = rec.CreatedAt.Add(-time.Second)
	return s.MemStore.ReplaceTask(ctx, rec, prevRunID)
}

// A run's end reported after the key was re-run is the older run's: a
// Watch of the new run neither yields it nor ends on it, and Subscribe,
// which keeps each task's snapshots in order across runs, does not yield
// it once the new run was. So too when the key was re-run through
// another runtime, whose clock is behind this one's, so that the older
// run was created later by the clocks.
func TestStreamsIgnoreAnOldRunsLateEnd(t *testing.T) {
	for _, stream := range []struct {
		name string
		open func(rt *Runtime[*endHeld], id string) iter.Seq2[Snapshot, error]
	}{
		{"Watch", func(rt *Runtime[*endHeld], id string) iter.Seq2[Snapshot, error] { return rt.Watch(ctx, id, alice) }},
		{"Subscribe", func(rt *Runtime[*endHeld], _ string) iter.Seq2[Snapshot, error] {
			return rt.Subscribe(t.Context(), alice)
		}},
	} {
		for _, elsewhere := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/elsewhere=%t", stream.name, elsewhere), func(t *testing.T) {
				rt, s, first, second, g, reported := reRunBehindALateEnd(t, elsewhere, nil, nil)
				next, snap := pullFirst(t, stream.open(rt, second.ID))
				require.Equal(t, second.RunID, snap.RunID, "the stream begins with the new run")

				close(s.resume)
				wait(t, reported, "the first run's end to be reported")
				g.open()
				snap = untilEnd(t, next, second.RunID, "not the end of "+first.RunID)
				assert.Equal(t, StatusCompleted, snap.Status)
			})
		}
	}
}

// Subscribe shows a key re-run through another runtime whose clock is
// behind this one's, though the new run was created earlier by the
// clocks than the run it replaced.
func TestSubscribeShowsARunReRunOnASlowerClock(t *testing.T) {
	s := NewMemStore()
	here := newRuntime(t, s, Config{})
	there := newRuntime(t, slowClock{s}, Config{})
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	next, stop := iter.Pull2(here.Subscribe(sctx, alice))
	defer stop()
	first, err := here.Submit(ctx, "job", noop, alice)
	require.NoError(t, err)
	untilEnd(t, next, first.RunID, "the first")
	listening(t, s, 1)

	second, err := there.Submit(ctx, "job", noop, alice)
	require.NoError(t, err)
	require.NotEqual(t, first.RunID, second.RunID, "the key ran anew")
	assert.Equal(t, StatusCompleted, untilEnd(t, next, second.RunID, "the re-run's").Status)
}

// The late end of an older run that excluded the watcher does not end
// a Watch of the newer run that includes it: it is the older run's
// report, not a revocation.
func TestWatchIgnoresTheLateEndOfAnOlderRunItCouldNotSee(t *testing.T) {
	global := []SubmitOption{WithScope(ScopeGlobal)}
	rt, s, _, second, g, reported := reRunBehindALateEnd(t, false, global, append(global, WithWatchers(bob)))
	next, first := pullFirst(t, rt.Watch(ctx, second.ID, bob))
	require.Equal(t, second.RunID, first.RunID)

	// Bob stalls with the new run's progress undelivered; then the old
	// run's end is reported.
	wait(t, g.started, "the new run to start")
	g.task.Load().SetProgress(10)
	close(s.resume)
	wait(t, reported, "the first run's end to be reported")
	g.open()
	assert.Equal(t, StatusCompleted, untilEnd(t, next, second.RunID, "and the stream is not revoked").Status)
}

// Runs minted by one runtime compare by their numbers, in base 36; runs
// minted by different runtimes, or ids no runtime minted, do not compare.
func TestCompareRuns(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want runOrder
	}{
		{"i.1", "", runSameOrLater},
		{"i.1", "i.1", runSameOrLater},
		{"i.1", "i.2", runEarlier},
		{"i.2", "i.1", runSameOrLater},
		{"i.z", "i.10", runEarlier}, // 35 and 36
		{"i.10", "i.z", runSameOrLater},
		{"i.9", "i.a", runEarlier},
		{"a.b.1", "a.b.2", runEarlier},
		{"i.1", "j.2", runUnordered},
		{"j.2", "i.1", runUnordered},
		{"r1", "r2", runUnordered},
		{"i.", "i.1", runUnordered},
		{"i.01", "i.2", runUnordered},
		{"i.A", "i.B", runUnordered},
	} {
		assert.Equal(t, c.want, compareRuns(c.a, c.b), "%s against %s", c.a, c.b)
	}
}

// pullFirst starts pulling seq, stopped when the test ends, and returns
// next with the first snapshot, which must come without an error.
func pullFirst(t *testing.T, seq iter.Seq2[Snapshot, error]) (next func() (Snapshot, error, bool), first Snapshot) {
	t.Helper()
	next, stop := iter.Pull2(seq)
	t.Cleanup(stop)
	first, err, ok := next()
	require.True(t, ok)
	require.NoError(t, err)
	return next, first
}

// untilEnd pulls snapshots until a terminal one, which it returns,
// requiring each to be of run runID (why says what else it might be).
func untilEnd(t *testing.T, next func() (Snapshot, error, bool), runID, why string) Snapshot {
	t.Helper()
	for {
		snap, err, ok := next()
		require.True(t, ok, "the stream goes on until the run's terminal snapshot")
		require.NoError(t, err)
		require.Equal(t, runID, snap.RunID, "only run %s is yielded, %s", runID, why)
		if snap.Status.Terminal() {
			return snap
		}
	}
}

// A consumer that fell more than maxPending tasks behind is told that it
// skipped changes (ErrSkipped, once), and the stream goes on with a
// fresh read of every live task, this runtime's own among them: their
// changes were dropped with the rest.
func TestSubscribeAfterFallingBehindSaysSoAndShowsEveryLiveTask(t *testing.T) {
	rt := memRuntime(t)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	held := heldToTheEnd(t)
	first, err := rt.Submit(ctx, "first", held, alice)
	require.NoError(t, err)
	next, stop := iter.Pull2(rt.Subscribe(sctx, alice))
	defer stop()
	snap, err, ok := next()
	require.True(t, ok)
	require.NoError(t, err)
	require.Equal(t, first.ID, snap.ID, "the range has begun")

	// The consumer stalls while more tasks change than it may hold.
	want := make(map[string]struct{})
	for i := range maxPending + 44 {
		sub, err := rt.Submit(ctx, "job"+strconv.Itoa(i), held, alice)
		require.NoError(t, err)
		want[sub.ID] = struct{}{}
	}
	skipped := 0
	for len(want) > 0 {
		snap, err, ok := next()
		require.True(t, ok)
		if errors.Is(err, ErrSkipped) {
			skipped++
			require.Len(t, want, maxPending+44, "the skip is said before the tasks it passed over are read")
			continue
		}
		require.NoError(t, err, "%d live tasks never shown", len(want))
		delete(want, snap.ID)
	}
	assert.Equal(t, 1, skipped, "ErrSkipped yielded")
}

// joinedElsewhere returns two runtimes over one MemStore, a run alice
// started on the first under a global id, and bob's join of it through
// the second: the first runtime's copy of the run's watchers never saw
// him join.
func joinedElsewhere(t *testing.T) (here *Runtime[*MemStore], sub Submission, g *gate, join func()) {
	t.Helper()
	s := NewMemStore()
	s.SetWatchAuthorizer(func(string, []string, string) bool { return true })
	here, there := newRuntime(t, s, Config{}), newRuntime(t, s, Config{})
	g = newGate()
	sub, err := here.Submit(ctx, "shared", g.fn, alice, WithScope(ScopeGlobal))
	require.NoError(t, err)
	wait(t, g.started, "the run to start")
	return here, sub, g, func() {
		joined, err := there.Submit(ctx, "shared", noop, bob, WithScope(ScopeGlobal))
		require.NoError(t, err)
		require.True(t, joined.Joined)
		require.Equal(t, sub.RunID, joined.RunID)
	}
}

// A run's copy of its watchers keeps every name any list taught it: the
// list of a join made here, read before another join made elsewhere,
// adds its own name and loses neither; a read that raced both joins
// takes nothing back.
func TestRunLearnsEveryWatcherAnyListNames(t *testing.T) {
	for _, n := range []int{1, 40} { // short lists are searched, long ones indexed
		task := &Task{}
		var before []string
		for i := range n {
			before = append(before, "w"+strconv.Itoa(i))
		}
		task.setWatchers(before)
		read := append(slices.Clone(before), "bob")     // a read after bob joined elsewhere
		joined := append(slices.Clone(before), "carol") // carol's join, on the list her submission read
		task.learnWatchers(read)
		task.learnWatchers(joined)
		want := append(slices.Clone(before), "bob", "carol")
		assert.ElementsMatch(t, want, task.watcherList(), "%d watchers before", n)
		task.learnWatchers(before)
		task.learnWatchers(read)
		assert.ElementsMatch(t, want, task.watcherList(), "and keeps them")
		assert.Zero(t, testing.AllocsPerRun(10, func() { task.learnWatchers(read) }), "a list it has costs nothing")
	}
}

// A watcher who joined through another runtime follows the run here
// like any other: the store's watchers decide, not the copy the run
// holds from before the join.
func TestWatchOfARunJoinedElsewhere(t *testing.T) {
	here, sub, g, join := joinedElsewhere(t)
	join()
	next, stop := iter.Pull2(here.Watch(ctx, sub.ID, bob))
	defer stop()
	snap, err, ok := next()
	require.True(t, ok)
	require.NoError(t, err)
	require.Equal(t, StatusRunning, snap.Status)

	g.task.Load().SetProgress(50)
	snap, err, ok = next()
	require.True(t, ok)
	require.NoError(t, err, "bob is a watcher")
	assert.Equal(t, 50, snap.Progress)
	g.open()
	assert.Equal(t, StatusCompleted, untilEnd(t, next, sub.RunID, "the run joined").Status)
}

// A subscriber who joins a run through another runtime sees it here from
// the join on, its live progress included.
func TestSubscribeOfARunJoinedElsewhere(t *testing.T) {
	here, sub, g, join := joinedElsewhere(t)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	next, stop := iter.Pull2(here.Subscribe(sctx, bob))
	defer stop()
	join()
	snap, err, ok := next()
	require.True(t, ok)
	require.NoError(t, err)
	require.Equal(t, sub.RunID, snap.RunID, "the joined run is shown")

	g.task.Load().SetProgress(50)
	for snap.Progress != 50 {
		snap, err, ok = next()
		require.True(t, ok)
		require.NoError(t, err)
		require.False(t, snap.Status.Terminal(), "progress 50 was shown before the end")
	}
	g.open()
	assert.Equal(t, StatusCompleted, untilEnd(t, next, sub.RunID, "the run joined").Status)
}

// A run that ended while nobody subscribed, and whose callback still
// reports progress, is never offered as RUNNING to a later subscriber:
// the snapshot last published, from before its end, is stale.
func TestProgressIsNotOfferedForARunThatEnded(t *testing.T) {
	rt := memRuntime(t)
	first := rt.subscribe(caller{system: true}, "", Filter{})
	g := stubbornGate()
	sub, err := rt.Submit(ctx, "k", g.fn, alice)
	require.NoError(t, err)
	wait(t, g.started, "the callback")
	rt.hub.remove(first) // the run's RUNNING snapshot was published; now nobody listens
	require.NoError(t, rt.Cancel(ctx, sub.ID, alice))

	later := rt.subscribe(caller{system: true}, "", Filter{})
	defer rt.hub.remove(later)
	tk := g.task.Load()
	tk.SetProgress(42)
	rt.hub.progress(tk) // as the pump would, at once
	slots, _, _, _ := later.take()
	for _, sl := range slots {
		assert.NotEqual(t, StatusRunning, sl.snap.Status, "a cancelled run offered as %s at %d%%", sl.snap.Status, sl.snap.Progress)
	}
	g.open()
	wait(t, g.ran, "the callback's return")
}

// pendingLate holds a queue item's submission after its insert, its start
// after it lands, and a read of it, so that a Watch reads the record
// RUNNING while the item's PENDING submission waits in its inbox.
type pendingLate struct {
	Store
	id                                 string
	inserted, startLanded, reading     chan struct{}
	releaseInsert, releaseStart, reads chan struct{}
	readOnce                           sync.Once
}

func (s *pendingLate) InsertTask(ctx context.Context, rec Record) error {
	err := s.Store.InsertTask(ctx, rec)
	if rec.ID == s.id {
		close(s.inserted)
		<-s.releaseInsert
	}
	return err
}

func (s *pendingLate) TransitionTask(ctx context.Context, id, runID string, from []Status, next State) (bool, error) {
	ok, err := s.Store.TransitionTask(ctx, id, runID, from, next)
	if id == s.id && next.Status == StatusRunning {
		close(s.startLanded)
		<-s.releaseStart
	}
	return ok, err
}

func (s *pendingLate) GetTask(ctx context.Context, id string) (Record, error) {
	if id == s.id {
		s.readOnce.Do(func() { close(s.reading); <-s.reads })
	}
	return s.Store.GetTask(ctx, id)
}

// A report queued before a store read that a stream yielded first never
// follows it: the stream shows RUNNING, then never PENDING again.
func TestWatchNeverShowsARunGoingBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		id, err := ScopedTaskKey("b", alice)
		require.NoError(t, err)
		s := &pendingLate{Store: NewMemStore(), id: id,
			inserted: make(chan struct{}), startLanded: make(chan struct{}), reading: make(chan struct{}),
			releaseInsert: make(chan struct{}), releaseStart: make(chan struct{}), reads: make(chan struct{})}
		rt := newRuntime(t, s, Config{})
		submitted := make(chan error, 1)
		go func() {
			_, err := rt.SubmitSequential(ctx, "q", "b", noop, alice)
			submitted <- err
		}()
		<-s.inserted
		next, stop := iter.Pull2(rt.Watch(ctx, id, alice))
		defer stop()
		type got struct {
			snap Snapshot
			err  error
		}
		results := make(chan got)
		pull := func() {
			snap, err, ok := next()
			if !ok {
				err = errors.New("the stream ended")
			}
			results <- got{snap, err}
		}
		go pull()
		<-s.reading            // subscribed
		close(s.releaseInsert) // the submission is offered PENDING
		<-s.startLanded        // RUNNING is stored; its report waits
		close(s.reads)         // the stream reads RUNNING
		r := <-results
		require.NoError(t, r.err)
		require.Equal(t, StatusRunning, r.snap.Status)
		go pull()
		synctest.Wait() // the stream has taken its inbox: the PENDING report
		close(s.releaseStart)
		require.NoError(t, <-submitted)
		r = <-results
		require.NoError(t, r.err)
		assert.NotEqual(t, StatusPending, r.snap.Status, "the stream went back from RUNNING to PENDING")
		settled(t, rt, id)
	})
}

// Subscribe filtered by queue does not follow the tasks of other queues:
// over a store without notices, its poll reads none of them.
func TestSubscribeByQueueReadsNoTaskOfAnotherQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var reads atomic.Int64
		s := &hookStore{Store: NewMemStore(), onGet: func(context.Context, Record) { reads.Add(1) }}
		rt := NewRuntime(s, Config{})
		sctx, cancel := context.WithCancel(ctx)
		next, stop := iter.Pull2(rt.Subscribe(sctx, System, WithQueue("a")))
		ended := make(chan struct{})
		go func() { defer close(ended); next() }() // nothing of queue "a" comes
		synctest.Wait()
		var gates []*gate
		for i := range 3 {
			g := newGate()
			gates = append(gates, g)
			_, err := rt.Submit(ctx, strconv.Itoa(i), g.fn, alice)
			require.NoError(t, err)
		}
		synctest.Wait()
		reads.Store(0)
		time.Sleep(5 * subscribePoll) // five polls
		assert.Zero(t, reads.Load(), "store reads of tasks of another queue")
		cancel()
		<-ended
		stop()
		for _, g := range gates {
			g.open()
		}
		sd, done := context.WithTimeout(context.Background(), time.Minute)
		defer done()
		require.NoError(t, rt.Shutdown(sd))
	})
}

// Once Shutdown has returned, no change reaches a stream again: Watch and
// Subscribe end with ErrClosed, after the changes that reached them
// before (the end Shutdown gave a run), and a stream begun later ends
// with ErrClosed at once.
func TestStreamsEndWithErrClosedOnceShutdownReturns(t *testing.T) {
	s := NewMemStore()
	runner := newRuntime(t, s, Config{}) // runs the task the closing runtime watches
	rt := NewRuntime(s, Config{})
	block := func(ctx context.Context, _ *Task) (any, error) { <-ctx.Done(); return nil, ctx.Err() }
	own, err := rt.Submit(ctx, "own", block, alice)
	require.NoError(t, err)
	theirs, err := runner.Submit(ctx, "theirs", block, alice)
	require.NoError(t, err)

	type ended struct {
		seen []Status
		err  error
	}
	follow := func(seq iter.Seq2[Snapshot, error], first chan<- struct{}, out chan<- ended) {
		var e ended
		for snap, err := range seq {
			if err != nil {
				e.err = err
				break
			}
			if len(e.seen) == 0 {
				close(first)
			}
			e.seen = append(e.seen, snap.Status)
		}
		out <- e
	}
	watched, subscribed := make(chan struct{}), make(chan struct{})
	watch, subscribe := make(chan ended, 1), make(chan ended, 1)
	go follow(rt.Watch(ctx, theirs.ID, alice), watched, watch)
	go follow(rt.Subscribe(ctx, alice, WithStatus(StatusRunning, StatusCancelled)), subscribed, subscribe)
	<-watched
	<-subscribed
	require.NoError(t, rt.Shutdown(ctx)) // no deadline: cancels its run at once

	wait := func(ch <-chan ended) ended {
		t.Helper()
		select {
		case e := <-ch:
			return e
		case <-time.After(10 * time.Second):
			t.Fatal("the stream outlived the runtime's Shutdown")
			return ended{}
		}
	}
	w := wait(watch)
	assert.ErrorIs(t, w.err, ErrClosed)
	assert.Equal(t, []Status{StatusRunning}, w.seen, "another runtime's run, still running")
	sub := wait(subscribe)
	assert.ErrorIs(t, sub.err, ErrClosed)
	assert.Equal(t, StatusCancelled, sub.seen[len(sub.seen)-1], "the end Shutdown gave %s came first: %v", own.ID, sub.seen)

	for _, err := range rt.Subscribe(ctx, alice) {
		assert.ErrorIs(t, err, ErrClosed)
	}
	for _, err := range rt.Watch(ctx, theirs.ID, alice) {
		assert.ErrorIs(t, err, ErrClosed)
	}
	require.NoError(t, runner.Cancel(ctx, theirs.ID, alice))
}

// A Subscribe called before Shutdown, and ranged after it returned,
// yields the changes that reached its subscription, then ErrClosed: its
// subscription started with the call.
func TestSubscribeCalledBeforeShutdownYieldsWhatReachedIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := NewRuntime(NewMemStore(), Config{})
		g := newGate()
		_, err := rt.Submit(ctx, "k", g.fn, alice)
		require.NoError(t, err)
		<-g.started
		seq := rt.Subscribe(ctx, alice)
		require.NoError(t, rt.Shutdown(ctx)) // the run ends CANCELLED
		assertCancelledThenClosed(t, seq)
	})
}

// leasedNoNotices is a store shared by processes without notices: a
// MemStore that hides its Notifier.
type leasedNoNotices struct {
	Store
	Leaser
}

// A caller who joins, through another runtime, a live task this runtime
// runs is shown the task by its Subscribe here, though this runtime's run
// learned of the join from no event of its own: from the next re-read of
// the live tasks, or, when another read of the record (a Status, say)
// taught the run first, from that read.
func TestSubscribeShowsATaskJoinedThroughAnotherRuntime(t *testing.T) {
	for _, read := range []bool{false, true} {
		t.Run(fmt.Sprintf("status read between=%v", read), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := NewMemStore()
				mem.SetWatchAuthorizer(func(string, []string, string) bool { return true })
				s := leasedNoNotices{mem, mem}
				runner, joiner := NewRuntime[Store](s, Config{}), NewRuntime[Store](s, Config{})
				g := newGate()
				sub, err := runner.Submit(ctx, "g", g.fn, alice, WithScope(ScopeGlobal))
				require.NoError(t, err)
				<-g.started
				sctx, cancel := context.WithCancel(ctx)
				seen := make(chan Snapshot, 64)
				go func() {
					for snap, err := range runner.Subscribe(sctx, bob) {
						if err != nil {
							return
						}
						seen <- snap
					}
				}()
				synctest.Wait()
				assert.Empty(t, seen, "bob does not watch g yet")
				j, err := joiner.Submit(ctx, "g", noop, bob, WithScope(ScopeGlobal))
				require.NoError(t, err)
				require.True(t, j.Joined)
				if read {
					_, err = runner.Status(ctx, sub.ID, alice) // teaches the run that bob watches
					require.NoError(t, err)
				}
				time.Sleep(2 * time.Second) // a re-read of the live tasks
				synctest.Wait()
				require.NotEmpty(t, seen, "bob's Subscribe never showed the task he joined")
				snap := <-seen
				assert.Equal(t, sub.ID, snap.ID)
				assert.Equal(t, StatusRunning, snap.Status)
				assert.Equal(t, 2, snap.WatcherCount)
				g.open()
				synctest.Wait()
				var last Snapshot
				for len(seen) > 0 {
					last = <-seen
				}
				assert.Equal(t, StatusCompleted, last.Status, "and its end, as an event of this runtime's")
				cancel()
				require.NoError(t, runner.Shutdown(ctx))
				require.NoError(t, joiner.Shutdown(ctx))
			})
		})
	}
}

// Subscribe's timed re-read, over a store without notices, shows none of
// this runtime's own live tasks again, however many there are: their
// changes arrive as events, and it remembers at most maxTracked tasks.
func TestSubscribeRereadRepeatsNoTaskOfItsOwn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemStore()
		rt := NewRuntime[Store](leasedNoNotices{mem, mem}, Config{})
		head := newGate()
		_, err := rt.SubmitSequential(ctx, "q", "head", head.fn, alice)
		require.NoError(t, err)
		for i := range maxTracked + 10 {
			_, err := rt.SubmitSequential(ctx, "q", strconv.Itoa(i), noop, alice)
			require.NoError(t, err)
		}
		<-head.started
		sctx, cancel := context.WithCancel(ctx)
		shown := map[string]int{}
		done := make(chan struct{})
		go func() {
			defer close(done)
			for snap, err := range rt.Subscribe(sctx, alice) {
				if err != nil {
					return
				}
				shown[snap.ID]++
			}
		}()
		time.Sleep(3500 * time.Millisecond) // three re-reads
		synctest.Wait()
		cancel()
		<-done
		assert.Len(t, shown, maxTracked+11)
		for id, n := range shown {
			if n > 1 {
				t.Errorf("%s shown %d times with nothing changed", id, n)
			}
		}
		head.open()
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// A Subscribe called before Shutdown, on a runtime that never took its
// lease, yields what reached it all the same, then ErrClosed.
func TestSubscribeBeforeShutdownOnARuntimeThatNeverLeased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemStore()
		runner, front := NewRuntime(mem, Config{}), NewRuntime(mem, Config{})
		g := newGate()
		sub, err := runner.Submit(ctx, "k", g.fn, alice)
		require.NoError(t, err)
		<-g.started
		seq := front.Subscribe(ctx, alice)
		require.NoError(t, front.Cancel(ctx, sub.ID, alice))
		require.NoError(t, front.Shutdown(ctx))
		assertCancelledThenClosed(t, seq)
		require.NoError(t, runner.Shutdown(ctx))
	})
}

// assertCancelledThenClosed ranges over seq, a stream of one run that a
// Shutdown ended, and asserts that it yields the run's CANCELLED end,
// then ErrClosed.
func assertCancelledThenClosed(t *testing.T, seq iter.Seq2[Snapshot, error]) {
	t.Helper()
	var seen []Status
	var end error
	for snap, err := range seq {
		if err != nil {
			end = err
			break
		}
		seen = append(seen, snap.Status)
	}
	assert.Equal(t, []Status{StatusCancelled}, seen)
	assert.ErrorIs(t, end, ErrClosed)
}

// heldReads is a shared store whose GetTask, while hold is set, reads the
// record and then waits for release before it answers: a read that the
// run outpaces.
type heldReads struct {
	leasedNoNotices
	hold    atomic.Bool
	read    chan struct{}
	release chan struct{}
}

func (s *heldReads) GetTask(ctx context.Context, id string) (Record, error) {
	rec, err := s.leasedNoNotices.GetTask(ctx, id)
	if s.hold.CompareAndSwap(true, false) {
		close(s.read)
		<-s.release
	}
	return rec, err
}

// A read that teaches a run of a join made elsewhere, answered after the
// run ended, never shows the run's subscribers the state it read: they
// read the record again, and see its end.
func TestALateReadThatLearnsOfAJoinShowsNoStaleState(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemStore()
		mem.SetWatchAuthorizer(func(string, []string, string) bool { return true })
		s := &heldReads{leasedNoNotices: leasedNoNotices{mem, mem}, read: make(chan struct{}), release: make(chan struct{})}
		finishing, settle := make(chan struct{}), make(chan struct{})
		runner := NewRuntime[Store](s, Config{Observers: []Observer{ObserverFunc(func(_ context.Context, e Event) {
			if e.Kind == EventFinished {
				close(finishing)
				<-settle // the run's handle stays until the observers return
			}
		})}})
		joiner := NewRuntime[Store](leasedNoNotices{mem, mem}, Config{})
		g := newGate()
		sub, err := runner.Submit(ctx, "g", g.fn, alice, WithScope(ScopeGlobal))
		require.NoError(t, err)
		<-g.started
		_, err = joiner.Submit(ctx, "g", noop, bob, WithScope(ScopeGlobal))
		require.NoError(t, err)

		s.hold.Store(true)
		go func() { _, _ = runner.Status(ctx, sub.ID, alice) }() // reads RUNNING, answers late
		<-s.read
		g.open()
		<-finishing // the end landed, and nobody subscribed to hear it
		sctx, cancel := context.WithCancel(ctx)
		var seen []Status
		done := make(chan struct{})
		go func() {
			defer close(done)
			for snap, err := range runner.Subscribe(sctx, bob) {
				if err != nil {
					return
				}
				seen = append(seen, snap.Status)
			}
		}()
		synctest.Wait()
		close(s.release) // the late read learns that bob watches
		synctest.Wait()
		close(settle)
		synctest.Wait()
		cancel()
		<-done
		assert.NotContains(t, seen, StatusRunning, "bob was shown the run alive after its end")
		assert.Contains(t, seen, StatusCompleted)
		require.NoError(t, runner.Shutdown(ctx))
		require.NoError(t, joiner.Shutdown(ctx))
	})
}

// Subscribe refuses the filters List refuses, rather than running a
// stream that can never show a task.
func TestSubscribeRefusesAnUnknownStatusAndABadQueueName(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, c := range []struct {
		opt  ListOption
		want error
	}{
		{WithStatus(StatusRunning, "Running"), ErrInvalidOption},
		{WithQueue("q\x00"), ErrInvalidKey},
		{WithQueue(strings.Repeat("q", MaxKeyLen+1)), ErrInvalidKey},
	} {
		_, err := collect(t, rt.Subscribe(sctx, alice, c.opt))
		require.ErrorIs(t, err, c.want)
		require.NoError(t, sctx.Err(), "the stream ended with the error, not with ctx")
	}
}

// holdRunning is a MemStore whose first landed RUNNING transition, once
// armed, waits for release before it returns: the start write of a run
// has landed, and its report has not been made yet.
type holdRunning struct {
	*MemStore
	armed           atomic.Bool
	landed, release chan struct{}
}

func (s *holdRunning) TransitionTask(ctx context.Context, id, runID string, from []Status, next State) (bool, error) {
	ok, err := s.MemStore.TransitionTask(ctx, id, runID, from, next)
	if ok && err == nil && next.Status == StatusRunning && s.armed.CompareAndSwap(true, false) {
		close(s.landed)
		<-s.release
	}
	return ok, err
}

// A run's end reported while nobody subscribed is final for the streams
// that begin after it: a report of an earlier write that comes late
// (here a queue item's start, whose write landed before a Cancel's) is
// not shown, or the stream would show the cancelled run live, and
// nothing would follow.
func TestAStreamDoesNotShowALateStartOfARunWhoseEndWasReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &holdRunning{MemStore: NewMemStore(), landed: make(chan struct{}), release: make(chan struct{})}
		s.armed.Store(true)
		rt := NewRuntime(s, Config{})
		g := newGate()
		sub, err := rt.SubmitSequential(ctx, "q", "k", g.fn, alice)
		require.NoError(t, err)
		<-s.landed
		require.NoError(t, rt.Cancel(ctx, sub.ID, alice))
		synctest.Wait() // the cancel's notice is taken while nobody subscribes

		sctx, cancel := context.WithCancel(ctx)
		next, stop := iter.Pull2(rt.Subscribe(sctx, alice))
		close(s.release) // the start's report is made now
		synctest.Wait()
		marker, err := rt.SubmitSequential(ctx, "q", "marker", returns(1, nil), alice)
		require.NoError(t, err)

		var shown []Snapshot
		// pullUntilEnd pulls until task id's end; the slots of one take
		// come in no set order, so a second marker makes sure the take
		// that held the first one's end was yielded in full.
		pullUntilEnd := func(id string) {
			for {
				snap, err, ok := next()
				require.True(t, ok)
				require.NoError(t, err)
				if snap.ID == marker.ID || snap.ID == id {
					if snap.ID == id && snap.Status.Terminal() {
						return
					}
					continue
				}
				shown = append(shown, snap)
			}
		}
		pullUntilEnd(marker.ID)
		marker2, err := rt.SubmitSequential(ctx, "q", "marker2", returns(1, nil), alice)
		require.NoError(t, err)
		pullUntilEnd(marker2.ID)
		time.Sleep(time.Hour) // in the bubble: an hour for any loop to bring an end, were one to come
		synctest.Wait()
		stop()
		cancel()

		final, err := rt.Status(ctx, sub.ID, alice)
		require.NoError(t, err)
		close(g.release)
		require.NoError(t, rt.Shutdown(ctx))
		require.Equal(t, StatusCancelled, final.Status)
		for _, sn := range shown {
			assert.NotEqual(t, sub.ID, sn.ID, "the stream shows %s %s, its record %s", sn.ID, sn.Status, final.Status)
		}
	})
}

// heldToTheEnd returns a callback that returns once the test's body has
// ended, before the cleanups that shut its runtimes down (call it after
// making them).
func heldToTheEnd(t *testing.T) Func {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	return func(context.Context, *Task) (any, error) { <-release; return nil, nil }
}

// subscribedToALiveRun submits the key k as alice with a gate's callback,
// and returns its submission, the gate, and alice's Subscribe stream,
// ended with sctx, once the stream has shown the run live.
func subscribedToALiveRun[S Store](t *testing.T, rt *Runtime[S], sctx context.Context) (Submission, *gate, func() (Snapshot, error, bool)) {
	t.Helper()
	g := newGate()
	first, err := rt.Submit(ctx, "k", g.fn, alice)
	require.NoError(t, err)
	wait(t, g.started, "the first run")
	next, stop := iter.Pull2(rt.Subscribe(sctx, alice))
	t.Cleanup(stop)
	snap, err, ok := next()
	require.True(t, ok)
	require.NoError(t, err)
	require.Equal(t, first.RunID, snap.RunID, "the first run is shown live")
	return first, g, next
}

// snapshotsUntil pulls next until it yields a snapshot of task id that
// last accepts, and returns the snapshots of id it yielded.
func snapshotsUntil(t *testing.T, next func() (Snapshot, error, bool), id string, last func(Snapshot) bool) []Snapshot {
	t.Helper()
	var of []Snapshot
	for {
		snap, err, ok := next()
		require.True(t, ok)
		if errors.Is(err, ErrSkipped) {
			continue // an overflow's
		}
		require.NoError(t, err)
		if snap.ID != id {
			continue
		}
		if of = append(of, snap); last(snap) {
			return of
		}
	}
}

// A Subscribe stream whose inbox overflowed (more than maxPending tasks
// changed while its consumer stalled) still follows a task it showed
// live to an end: when the re-read finds a new run of it, the stream
// yields the run it showed ended, or Gone, before the new one.
func TestSubscribeOverflowKeepsTheEndOfAShownRun(t *testing.T) {
	rt := memRuntime(t)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	held := heldToTheEnd(t)

	first, g, next := subscribedToALiveRun(t, rt, sctx)

	require.NoError(t, rt.Cancel(ctx, first.ID, alice))
	wait(t, g.ran, "the first callback's return")
	second, err := rt.Submit(ctx, "k", held, alice)
	require.NoError(t, err)
	for i := range maxPending + 10 {
		_, err := rt.Submit(ctx, "job"+strconv.Itoa(i), held, alice)
		require.NoError(t, err)
	}
	ofK := snapshotsUntil(t, next, first.ID, func(snap Snapshot) bool { return snap.RunID == second.RunID })
	end := ofK[0]
	assert.Equal(t, first.RunID, end.RunID, "the stream went from the run it showed to the next without its end")
	assert.True(t, end.Gone || end.Status == StatusCancelled, "k's first snapshot after the stall: %+v", end)
}

// endPausingStore is a store whose terminal transition of one run, once
// landed, waits to return until resume is closed: the run's end is then
// written, and not yet reported.
type endPausingStore struct {
	Store
	runID  atomic.Pointer[string]
	paused chan struct{}
	resume chan struct{}
}

func (s *endPausingStore) TransitionTask(ctx context.Context, id, runID string, from []Status, next State) (bool, error) {
	ok, err := s.Store.TransitionTask(ctx, id, runID, from, next)
	if p := s.runID.Load(); p != nil && *p == runID && ok && next.Status.Terminal() {
		close(s.paused)
		<-s.resume
	}
	return ok, err
}

// A Subscribe stream that showed a run live, whose key this runtime ran
// again before that run's end was reported, yields the end, or Gone, of
// the run it showed before the new run: its end, reported late, would
// otherwise be dropped as an earlier run's.
func TestSubscribeEndsAShownRunReRunBeforeItsEndWasReported(t *testing.T) {
	s := &endPausingStore{Store: NewMemStore(), paused: make(chan struct{}), resume: make(chan struct{})}
	rt := newRuntime(t, s, Config{})
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	first, g, next := subscribedToALiveRun(t, rt, sctx)
	s.runID.Store(&first.RunID)
	g.open()
	wait(t, s.paused, "the first run's end to land")
	second, err := rt.Submit(ctx, "k", heldToTheEnd(t), alice)
	require.NoError(t, err)
	close(s.resume)
	eventually(t, func() bool { return rt.handle(first.ID, first.RunID) == nil }, "the first run to settle")
	require.NoError(t, rt.Cancel(ctx, second.ID, alice))
	ofK := snapshotsUntil(t, next, first.ID, func(snap Snapshot) bool { return snap.RunID == second.RunID && snap.Status.Terminal() })
	assert.Equal(t, first.RunID, ofK[0].RunID, "after the first run RUNNING the stream yielded %s of run %s", ofK[0].Status, ofK[0].RunID)
	assert.True(t, ofK[0].Gone || ofK[0].Status == StatusCompleted, "%+v", ofK[0])
	for _, snap := range ofK[1:] {
		assert.Equal(t, second.RunID, snap.RunID, "nothing of the first run after its end or Gone")
	}
}

// A run that ended after Subscribe was called, and before its range
// began, is yielded all the same when its key was run again meanwhile:
// the first read finds the new run, and the inbox's end of the first
// comes before it.
func TestSubscribeYieldsARunThatEndedBeforeTheRangeAndWasReRun(t *testing.T) {
	rt := memRuntime(t)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	next, stop := iter.Pull2(rt.Subscribe(sctx, alice))
	defer stop()
	first, err := rt.Submit(ctx, "k", returns("one", nil), alice)
	require.NoError(t, err)
	_, err = rt.Wait(ctx, first.ID, alice)
	require.NoError(t, err)
	second, err := rt.Submit(ctx, "k", heldToTheEnd(t), alice)
	require.NoError(t, err)
	var ofK []Snapshot
	for {
		snap, err, ok := next() // the range begins: the second run is live
		if len(ofK) == 0 {
			require.NoError(t, rt.Cancel(ctx, second.ID, alice))
		}
		require.True(t, ok)
		require.NoError(t, err)
		if ofK = append(ofK, snap); snap.RunID == second.RunID && snap.Status.Terminal() {
			break
		}
	}
	require.Equal(t, first.RunID, ofK[0].RunID, "the first run's end, made after Subscribe was called, was not yielded")
	assert.Equal(t, StatusCompleted, ofK[0].Status)
}
