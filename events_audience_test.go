package workers

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A change of alice's task visits the Subscribe streams that may show
// it (System's, alice's, and those of the run's watchers), and none of
// the streams other tenants have open: its cost does not grow with them.
func TestAChangeVisitsOnlyTheStreamsThatMayShowIt(t *testing.T) {
	rt := memRuntime(t)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i := range 1000 {
		_ = rt.Subscribe(sctx, MustOwner("tenant"+strconv.Itoa(i))) // subscribed, never ranged
	}
	_ = rt.Subscribe(sctx, alice)
	_ = rt.Subscribe(sctx, bob)
	_ = rt.Subscribe(sctx, System)
	id, err := ScopedTaskKey("report", alice)
	require.NoError(t, err)
	visits := func(watchers ...string) int {
		n := 0
		rt.hub.mu.Lock()
		defer rt.hub.mu.Unlock()
		rt.hub.each(id, watchers, func(*subscriber) { n++ })
		return n
	}
	assert.Equal(t, 2, visits("alice"), "System's stream and alice's")
	assert.Equal(t, 3, visits("alice", "bob", "alice"), "and bob's, who watches, once")
	assert.Equal(t, 2, visits(), "the owner's, whatever the watchers say")
}

var errStoreDown = errors.New("connection reset by peer")

// tagged is the context key of the tag readCounter counts a read under.
type tagged struct{}

// readCounter is a MemStore (its notices and leases included) that
// counts GetTask calls by the tag in their context: "" for the
// runtime's own reads.
type readCounter struct {
	*MemStore
	mu    sync.Mutex
	reads map[string]int
	fail  int           // how many of the runtime's own reads to fail
	slow  time.Duration // how long each of the runtime's own reads takes
}

func (s *readCounter) GetTask(ctx context.Context, id string) (Record, error) {
	tag, _ := ctx.Value(tagged{}).(string)
	if tag == "" && s.slow > 0 {
		time.Sleep(s.slow)
	}
	s.mu.Lock()
	s.reads[tag]++
	fail := tag == "" && s.fail > 0
	if fail {
		s.fail--
	}
	s.mu.Unlock()
	if fail {
		return Record{}, errStoreDown
	}
	return s.MemStore.GetTask(ctx, id)
}

func (s *readCounter) count(tag string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads[tag]
}

// A notice of another process's change is read once here to find the
// Subscribe streams that may show it: bob's many streams read nothing
// for alice's task, and each reads a task alice shares with him.
func TestANoticeIsReadOnlyByTheStreamsThatMayShowIt(t *testing.T) {
	for _, fail := range []bool{false, true} {
		t.Run("hub read fails="+strconv.FormatBool(fail), func(t *testing.T) { noticeReadByItsAudience(t, fail) })
	}
}

// noticeReadByItsAudience is TestANoticeIsReadOnlyByTheStreamsThatMayShowIt;
// with fail, the read that finds a notice's streams fails, and the
// notice reaches every Subscribe stream instead, to read under its own
// authority.
func noticeReadByItsAudience(t *testing.T, fail bool) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemStore()
		counter := &readCounter{MemStore: mem, reads: map[string]int{}}
		front := newRuntime(t, counter, Config{})
		runner := newRuntime(t, mem, Config{})
		require.NoError(t, front.Start(ctx))
		require.NoError(t, runner.Start(ctx))

		const streams = 50
		sctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		var mu sync.Mutex
		ended := map[string]int{} // "tag id": terminal snapshots yielded
		follow := func(tag string, auth TaskAuthority) {
			wg.Go(func() {
				for snap, err := range front.Subscribe(context.WithValue(sctx, tagged{}, tag), auth) {
					if err != nil {
						return
					}
					if snap.Status.Terminal() {
						mu.Lock()
						ended[tag+" "+snap.ID]++
						mu.Unlock()
					}
				}
			})
		}
		for range streams {
			follow("bob", bob)
		}
		follow("alice", alice)
		synctest.Wait()
		listening(t, mem, 2)
		before := counter.count("bob")

		if fail {
			counter.mu.Lock()
			counter.fail = 1 << 20
			counter.mu.Unlock()
		}
		own, err := runner.Submit(ctx, "own", returns(1, nil), alice)
		require.NoError(t, err)
		settled(t, runner, own.ID)
		synctest.Wait()
		if fail {
			assert.Positive(t, counter.count("bob")-before, "bob's streams were not told of a task whose watchers could not be read")
		} else {
			assert.Zero(t, counter.count("bob")-before, "bob's streams read alice's task")
		}
		mu.Lock()
		assert.Equal(t, 1, ended["alice "+own.ID], "alice's stream showed her task's end")
		mu.Unlock()

		shared, err := runner.Submit(ctx, "shared", returns(2, nil), alice, WithWatchers(bob))
		require.NoError(t, err)
		settled(t, runner, shared.ID)
		synctest.Wait()
		mu.Lock()
		assert.Equal(t, streams, ended["bob "+shared.ID], "bob's streams showed the end of the task he watches")
		mu.Unlock()

		cancel()
		wg.Wait()
	})
}

// Watch and Wait of a task this runtime runs, over a store with notices,
// read nothing while nothing changes: its changes reach them as events.
// They still see its end.
func TestFollowingAnOwnRunReadsNothingWhileNothingChanges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		counter := &readCounter{MemStore: NewMemStore(), reads: map[string]int{}}
		rt := newRuntime(t, counter, Config{})
		require.NoError(t, rt.Start(ctx))
		g := newGate()
		sub, err := rt.Submit(ctx, "long", g.fn, alice)
		require.NoError(t, err)
		<-g.started
		watched, waited := make(chan Status, 8), make(chan Status, 1)
		go func() {
			for snap, err := range rt.Watch(context.WithValue(ctx, tagged{}, "watch"), sub.ID, alice) {
				if err != nil {
					close(watched)
					return
				}
				watched <- snap.Status
			}
			close(watched)
		}()
		go func() {
			snap, err := rt.Wait(context.WithValue(ctx, tagged{}, "wait"), sub.ID, alice)
			assert.NoError(t, err)
			waited <- snap.Status
		}()
		synctest.Wait()
		watchReads, waitReads := counter.count("watch"), counter.count("wait")
		time.Sleep(time.Minute) // the fake clock: a minute of nothing
		synctest.Wait()
		assert.Equal(t, watchReads, counter.count("watch"), "Watch read the store while nothing changed")
		assert.Equal(t, waitReads, counter.count("wait"), "Wait read the store while nothing changed")

		g.open()
		assert.Equal(t, StatusCompleted, <-waited)
		var last Status
		for st := range watched {
			last = st
		}
		assert.Equal(t, StatusCompleted, last)
	})
}

// Ids left to the audience reader when the runtime's loops end, and those
// marked after, reach every Subscribe stream: none is lost.
func TestTheAudienceReaderLeavesNoIDBehind(t *testing.T) {
	var h hub
	h.add(newSubscriber(caller{userID: "bob"}, "", Filter{}))
	h.add(newSubscriber(caller{userID: "carol"}, "", Filter{}))
	h.reading = true // as subscribe does, before it starts the reader
	h.mu.Lock()
	h.stale("alice::left")
	h.mu.Unlock()
	<-h.reader // taken here, so that the reader below finds only its end
	done, stop := context.WithCancel(ctx)
	stop()
	h.readAudiences(done, func(context.Context, string) (Record, error) {
		t.Fatal("a reader that has ended read the store")
		return Record{}, nil
	})
	h.mu.Lock()
	h.stale("alice::after")
	h.mu.Unlock()

	h.mu.Lock()
	defer h.mu.Unlock()
	for _, user := range []string{"bob", "carol"} {
		for s := range h.subs[user] {
			_, stale, _, _ := s.take()
			assert.ElementsMatch(t, []string{"alice::left", "alice::after"}, stale, "%s's stream", user)
		}
	}
}

// A status filter chooses the tasks a Subscribe stream shows; a task it
// showed is followed to its end, which is yielded whatever the filter
// says, so that a view of live tasks learns that one left.
func TestSubscribeFollowsATaskItShowedToItsEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := memRuntime(t)
		head, item := newGate(), newGate()
		_, err := rt.SubmitSequential(ctx, "q", "head", head.fn, alice)
		require.NoError(t, err)
		queued, err := rt.SubmitSequential(ctx, "q", "item", item.fn, alice)
		require.NoError(t, err)
		synctest.Wait()

		sctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		follow := func(st Status) chan Status {
			seen := make(chan Status, 16)
			wg.Go(func() {
				for snap, err := range rt.Subscribe(sctx, alice, WithStatus(st)) {
					if err != nil {
						return
					}
					if snap.ID == queued.ID {
						seen <- snap.Status
					}
				}
			})
			return seen
		}
		pending, running := follow(StatusPending), follow(StatusRunning)
		// seen returns what a stream showed of the item since last asked.
		seen := func(ch chan Status) []Status {
			synctest.Wait()
			var got []Status
			for {
				select {
				case st := <-ch:
					got = append(got, st)
				default:
					return got
				}
			}
		}
		assert.Equal(t, []Status{StatusPending}, seen(pending))
		assert.Empty(t, seen(running))
		head.open()
		assert.Equal(t, []Status{StatusRunning}, seen(pending), "the PENDING stream never showed the item leave")
		assert.Equal(t, []Status{StatusRunning}, seen(running))
		item.open()
		assert.Equal(t, []Status{StatusCompleted}, seen(running), "the RUNNING stream never showed the item's end")
		assert.Equal(t, []Status{StatusCompleted}, seen(pending))
		cancel()
		wg.Wait()
	})
}

// Wait and Watch of a run this runtime holds, over a Notifier store, do
// not poll; Reset, which forgets the run and clears the records without a
// notice or an event, wakes them to read the record again: ErrNotFound.
func TestWaitAndWatchOfAnOwnRunWakeAfterReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := memRuntime(t)
		g := newGate()
		sub, err := rt.Submit(ctx, "k", g.fn, alice)
		require.NoError(t, err)
		<-g.started
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		waited, watched := make(chan error, 1), make(chan error, 1)
		go func() {
			_, err := rt.Wait(wctx, sub.ID, alice)
			waited <- err
		}()
		go func() {
			for _, err := range rt.Watch(wctx, sub.ID, alice) {
				if err != nil {
					watched <- err
					return
				}
			}
			watched <- nil
		}()
		synctest.Wait()
		require.NoError(t, rt.Reset(ctx))
		time.Sleep(time.Minute)
		synctest.Wait()
		for what, ch := range map[string]chan error{"Wait": waited, "Watch": watched} {
			select {
			case err := <-ch:
				assert.ErrorIs(t, err, ErrNotFound, what)
			default:
				t.Errorf("%s of a run whose record Reset cleared is still blocked a minute later", what)
			}
		}
		cancel()
		synctest.Wait()
	})
}

// deafStore is a MemStore whose Listen cannot listen at all.
type deafStore struct{ *MemStore }

func (deafStore) Listen(context.Context, func(Change)) error { return errors.New("LISTEN refused") }

// While the store's listener cannot listen at all, Wait of a run this
// runtime holds polls it: a queue item cancelled through another
// runtime, which the sync loop does not check (it checks started runs
// only), is seen within a second, not when the queue's head returns.
func TestWaitOfAnOwnRunPollsWhileTheListenerCannotListen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemStore()
		// The listener tries again each LeaseInterval, waking Waits as it
		// fails: far apart here, so that only Wait's own poll can see
		// the cancel in time.
		front := newRuntime(t, deafStore{mem}, Config{LeaseInterval: time.Minute})
		other := newRuntime(t, mem, Config{})
		head := newGate()
		_, err := front.SubmitSequential(ctx, "q", "head", head.fn, alice)
		require.NoError(t, err)
		item, err := front.SubmitSequential(ctx, "q", "item", noop, alice)
		require.NoError(t, err)
		<-head.started

		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		waited := make(chan Snapshot, 1)
		go func() {
			snap, _ := front.Wait(wctx, item.ID, alice)
			waited <- snap
		}()
		synctest.Wait()
		require.NoError(t, other.Cancel(ctx, item.ID, alice))
		time.Sleep(2 * waitFallback)
		synctest.Wait()
		select {
		case snap := <-waited:
			assert.Equal(t, StatusCancelled, snap.Status)
		default:
			t.Error("Wait of a queue item cancelled elsewhere is still blocked two polls later")
		}
		cancel()
		head.open()
		synctest.Wait()
	})
}

// stuckOnce is a MemStore whose first GetTask made by the runtime on its
// own (no tag) hangs until its context ends: a connection lost without a
// reset, which Config.StoreTimeout is there to cut off.
type stuckOnce struct {
	*MemStore
	mu    sync.Mutex
	stuck bool
}

func (s *stuckOnce) GetTask(ctx context.Context, id string) (Record, error) {
	if tag, _ := ctx.Value(tagged{}).(string); tag == "" {
		s.mu.Lock()
		first := !s.stuck
		s.stuck = true
		s.mu.Unlock()
		if first {
			<-ctx.Done()
			return Record{}, ctx.Err()
		}
	}
	return s.MemStore.GetTask(ctx, id)
}

// The audience reader's read is bounded by StoreTimeout: one stuck read
// is cut off, and its notice reaches every Subscribe stream, instead of
// stalling every later notice until Shutdown.
func TestAStuckAudienceReadIsCutOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemStore()
		front := newRuntime(t, &stuckOnce{MemStore: mem}, Config{StoreTimeout: 5 * time.Second})
		runner := newRuntime(t, mem, Config{})
		require.NoError(t, front.Start(ctx))
		require.NoError(t, runner.Start(ctx))
		sctx, cancel := context.WithCancel(ctx)
		ended := make(chan string, 16)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for snap, err := range front.Subscribe(context.WithValue(sctx, tagged{}, "bob"), bob) {
				if err != nil {
					return
				}
				if snap.Status.Terminal() {
					ended <- snap.ID
				}
			}
		}()
		synctest.Wait()
		listening(t, mem, 2)
		shared, err := runner.Submit(ctx, "shared", returns(1, nil), alice, WithWatchers(bob))
		require.NoError(t, err)
		settled(t, runner, shared.ID)
		time.Sleep(time.Minute) // twelve StoreTimeouts
		synctest.Wait()
		select {
		case id := <-ended:
			assert.Equal(t, shared.ID, id)
		default:
			t.Error("bob's stream never showed the end of the task he watches: the audience reader is stuck")
		}
		cancel()
		<-done
	})
}

// A task a filtered Subscribe stream shows is followed to its end even
// when the stream already tracks maxTracked live tasks it did not show:
// one of those makes room.
func TestAShownTaskIsFollowedToItsEndWhenTrackedIsFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := memRuntime(t)
		head := newGate()
		_, err := rt.SubmitSequential(ctx, "backlog", "head", head.fn, alice)
		require.NoError(t, err)
		for i := range maxTracked {
			_, err := rt.SubmitSequential(ctx, "backlog", "item"+strconv.Itoa(i), noop, alice)
			require.NoError(t, err)
		}
		<-head.started
		sctx, cancel := context.WithCancel(ctx)
		seen := make(chan Status, 16)
		done := make(chan struct{})
		g := newGate()
		var xID string
		var xMu sync.Mutex
		go func() {
			defer close(done)
			for snap, err := range rt.Subscribe(sctx, alice, WithStatus(StatusRunning)) {
				if err != nil {
					return
				}
				xMu.Lock()
				isX := snap.ID == xID
				xMu.Unlock()
				if isX {
					seen <- snap.Status
				}
			}
		}()
		synctest.Wait()
		xMu.Lock()
		xID, _ = ScopedTaskKey("x", alice)
		xMu.Unlock()
		_, err = rt.Submit(ctx, "x", g.fn, alice)
		require.NoError(t, err)
		<-g.started
		synctest.Wait()
		g.open()
		synctest.Wait()
		var got []Status
		for len(seen) > 0 {
			got = append(got, <-seen)
		}
		assert.Equal(t, []Status{StatusRunning, StatusCompleted}, got, "the RUNNING view never learnt that x ended")
		cancel()
		<-done
		head.open()
	})
}

// A Subscribe stream that showed a task live, and then cannot read how
// its run ended, says the task is gone rather than leaving it live: the
// key was re-run without the caller, the record was deleted, or the new
// run went to another queue than the stream's. Over a store with
// notices the notice of the change reaches the stream, though by the
// time it is read the record names the caller no more; over one without,
// the stream's poll finds it. A stream that never showed the task says
// nothing of it.
func TestSubscribeSaysGoneOfATaskItShowedAndCannotFollowToItsEnd(t *testing.T) {
	cases := []struct {
		name  string
		queue string                                                        // the task's, and the stream's
		after func(t *testing.T, runner *Runtime[*MemStore], mem *MemStore) // once the run ended
	}{
		{"re-run without the caller", "", func(t *testing.T, runner *Runtime[*MemStore], _ *MemStore) {
			_, err := runner.Submit(ctx, "x", newGate().fn, bob) // watchers reset to bob
			require.NoError(t, err)
		}},
		{"record deleted", "", func(t *testing.T, _ *Runtime[*MemStore], mem *MemStore) {
			n, err := mem.DeleteFinished(ctx, time.Now().Add(time.Hour))
			require.NoError(t, err)
			require.Equal(t, 1, n)
		}},
		{"re-run in another queue", "q", func(t *testing.T, runner *Runtime[*MemStore], _ *MemStore) {
			_, err := runner.SubmitSequential(ctx, "r", "x", newGate().fn, bob, WithWatchers(alice))
			require.NoError(t, err)
		}},
	}
	for _, notices := range []bool{false, true} {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("notices=%v/%s", notices, tc.name), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) { goneOfATaskShown(t, notices, tc.queue, tc.after) })
			})
		}
	}
}

// goneOfATaskShown is a case of
// TestSubscribeSaysGoneOfATaskItShowedAndCannotFollowToItsEnd: after
// changes what the record holds once the run ended, while the stream's
// runtime cannot read the store.
func goneOfATaskShown(t *testing.T, notices bool, queue string, after func(*testing.T, *Runtime[*MemStore], *MemStore)) {
	mem := NewMemStore()
	held := &gatedReads{MemStore: mem}
	var s Store = held
	if !notices {
		s = leasedNoNotices{held, mem} // the stream polls
	}
	front, runner := NewRuntime(s, Config{}), NewRuntime(mem, Config{})
	require.NoError(t, front.Start(ctx))
	require.NoError(t, runner.Start(ctx))
	sctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		held.unblock()
		cancel()
		wg.Wait()
		assert.NoError(t, runner.Shutdown(ctx))
		assert.NoError(t, front.Shutdown(ctx))
	}()
	g := newGate()
	sub, err := submitOn(runner, queue, "x", g.fn, bob, WithWatchers(alice))
	require.NoError(t, err)
	<-g.started

	follow := func(opts ...ListOption) chan Snapshot {
		seen := make(chan Snapshot, 16)
		wg.Go(func() {
			for snap, err := range front.Subscribe(sctx, alice, opts...) {
				if err != nil {
					return
				}
				seen <- snap
			}
		})
		return seen
	}
	var opts []ListOption
	if queue != "" {
		opts = append(opts, WithQueue(queue))
	}
	shown := follow(opts...)
	unshown := follow(append(opts, WithStatus(StatusPending))...)
	synctest.Wait()
	first := <-shown
	require.Equal(t, StatusRunning, first.Status)
	require.Equal(t, sub.RunID, first.RunID)

	held.block()
	g.open()
	synctest.Wait()
	settled(t, runner, sub.ID)
	after(t, runner, mem)
	synctest.Wait()
	held.unblock()
	time.Sleep(2 * subscribePoll)
	synctest.Wait()
	require.Len(t, shown, 1, "the stream left the task live")
	gone := <-shown
	assert.Equal(t, Snapshot{ID: sub.ID, RunID: sub.RunID, Queue: queue, Gone: true}, gone)
	time.Sleep(2 * subscribePoll)
	synctest.Wait()
	assert.Empty(t, shown, "more of the task after it was gone")
	assert.Empty(t, unshown, "a stream that never showed the task")
}

// gatedReads is a MemStore, its leases and notices included, whose reads
// wait while the gate is blocked: every read, or with readerOnly the
// hub's audience reader's alone (the reads whose context carries no
// tagged value).
type gatedReads struct {
	*MemStore
	holdGate
	readerOnly bool
}

func (s *gatedReads) gate(ctx context.Context) {
	if _, tagged := ctx.Value(tagged{}).(string); !s.readerOnly || !tagged {
		s.wait()
	}
}

func (s *gatedReads) GetTask(ctx context.Context, id string) (Record, error) {
	s.gate(ctx)
	return s.MemStore.GetTask(ctx, id)
}

func (s *gatedReads) ListTasks(ctx context.Context, f Filter) ([]Record, error) {
	s.gate(ctx)
	return s.MemStore.ListTasks(ctx, f)
}

// A task this runtime ran, whose end waits in a Subscribe stream's inbox
// while the stream reads the record and finds the key re-run without its
// caller, shows that end, not Gone: the stream read the record before it
// took the end its runtime had reported.
func TestSubscribeShowsTheEndItHoldsRatherThanGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemStore()
		held := &gatedReads{MemStore: mem}
		rt := NewRuntime[Store](leasedNoNotices{held, mem}, Config{}) // its streams poll
		elsewhere := NewRuntime(mem, Config{})
		sctx, cancel := context.WithCancel(ctx)
		seen := make(chan Snapshot, 16)
		done := make(chan struct{})
		defer func() {
			held.unblock()
			cancel()
			<-done
			assert.NoError(t, rt.Shutdown(ctx))
			assert.NoError(t, elsewhere.Shutdown(ctx))
		}()
		g := newGate()
		sub, err := rt.Submit(ctx, "x", g.fn, bob, WithWatchers(alice))
		require.NoError(t, err)
		<-g.started
		go func() {
			defer close(done)
			for snap, err := range rt.Subscribe(sctx, alice) {
				if err != nil {
					return
				}
				seen <- snap
			}
		}()
		synctest.Wait()
		require.Equal(t, StatusRunning, (<-seen).Status)

		held.block()
		time.Sleep(subscribePoll) // the stream's poll waits on the store
		synctest.Wait()
		g.open() // the run ends here: its end reaches the inbox
		synctest.Wait()
		_, err = elsewhere.Submit(ctx, "x", newGate().fn, bob) // re-run without alice
		require.NoError(t, err)
		held.unblock()
		time.Sleep(2 * subscribePoll)
		synctest.Wait()
		require.Len(t, seen, 1)
		end := <-seen
		assert.Equal(t, sub.RunID, end.RunID)
		assert.Equal(t, StatusCompleted, end.Status, "the run's end, which its runtime reported, not Gone")
		assert.False(t, end.Gone)
	})
}

// A stream that read tasks of another process, and shows them one at a
// time to a slow consumer, misses no notice of those it has not shown
// yet: here both tasks end and are re-run without alice while her
// stream waits to yield the first, and the store is read again only
// after the hub's read found them bob's alone. Each is then followed to
// Gone.
func TestSubscribeMissesNoNoticeWhileItShowsWhatItRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemStore()
		held := &gatedReads{MemStore: mem}
		front, runner := NewRuntime[Store](held, Config{}), NewRuntime(mem, Config{})
		require.NoError(t, front.Start(ctx))
		require.NoError(t, runner.Start(ctx))
		synctest.Wait() // the listeners' first Resync is behind them
		sctx, cancel := context.WithCancel(ctx)
		seen := make(chan Snapshot) // unbuffered: the stream waits for the test
		done := make(chan struct{})
		defer func() {
			held.unblock()
			cancel()
			<-done
			assert.NoError(t, runner.Shutdown(ctx))
			assert.NoError(t, front.Shutdown(ctx))
		}()
		gates := map[string]*gate{"x1": newGate(), "x2": newGate()}
		runs := map[string]string{}
		for key, g := range gates {
			sub, err := runner.Submit(ctx, key, g.fn, bob, WithWatchers(alice))
			require.NoError(t, err)
			<-g.started
			runs[sub.ID] = sub.RunID
		}
		go func() {
			defer close(done)
			for snap, err := range front.Subscribe(sctx, alice) {
				if err != nil {
					return
				}
				select {
				case seen <- snap:
				case <-sctx.Done():
					return
				}
			}
		}()
		synctest.Wait() // the stream read both, and waits to yield the first

		held.block()
		for key, g := range gates {
			g.open()
			id, err := ScopedTaskKey(key, bob)
			require.NoError(t, err)
			settled(t, runner, id)
			_, err = runner.Submit(ctx, key, newGate().fn, bob) // without alice
			require.NoError(t, err)
		}
		synctest.Wait()
		held.unblock()

		got := map[string][]Snapshot{}
		for {
			synctest.Wait()
			select {
			case snap := <-seen:
				got[snap.ID] = append(got[snap.ID], snap)
				continue
			default:
			}
			break
		}
		for id, run := range runs {
			require.Len(t, got[id], 2, "%s: %+v", id, got[id])
			assert.Equal(t, StatusRunning, got[id][0].Status)
			assert.Equal(t, Snapshot{ID: id, RunID: run, Gone: true}, got[id][1], "%s was left live", id)
		}
	})
}

// A stream that follows another process's task reads it once per
// notice, not once for the notice and once more for the hub's read of
// it, though others than its owner subscribe.
func TestAFollowingStreamReadsOncePerNotice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemStore()
		// The hub's read of each notice is slow: alice's stream has read
		// the task by the time it ends.
		counter := &readCounter{MemStore: mem, reads: map[string]int{}, slow: 10 * time.Millisecond}
		front, runner := NewRuntime[Store](counter, Config{}), NewRuntime(mem, Config{ProgressInterval: time.Second})
		require.NoError(t, front.Start(ctx))
		require.NoError(t, runner.Start(ctx))
		sub, step := stepped(t, runner, "x", bob, WithWatchers(alice))
		sctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		progress := make(chan int, 64)
		go func() {
			defer close(done)
			for snap, err := range front.Subscribe(context.WithValue(sctx, tagged{}, "alice"), alice) {
				if err != nil {
					return
				}
				progress <- snap.Progress
			}
		}()
		defer func() {
			cancel()
			<-done
			assert.NoError(t, runner.Shutdown(ctx))
			assert.NoError(t, front.Shutdown(ctx))
		}()
		synctest.Wait()
		before := counter.count("alice")
		const notices = 5
		for p := 1; p <= notices; p++ {
			step <- 10 * p
			time.Sleep(time.Second) // a progress write, and its notice
			synctest.Wait()
		}
		close(step)
		_, err := runner.Wait(ctx, sub.ID, bob)
		require.NoError(t, err)
		synctest.Wait()
		reads := counter.count("alice") - before
		assert.LessOrEqual(t, reads, notices+2, "alice's stream read the task %d times for %d progress notices and its end", reads, notices)
		last := 0
		for len(progress) > 0 {
			last = <-progress
		}
		assert.Equal(t, 10*notices, last)
	})
}

// countedGatedReads is gatedReads that counts GetTask calls by the tag
// in their context.
type countedGatedReads struct {
	*gatedReads
	mu    sync.Mutex
	reads map[string]int
}

func (s *countedGatedReads) GetTask(ctx context.Context, id string) (Record, error) {
	tag, _ := ctx.Value(tagged{}).(string)
	s.mu.Lock()
	s.reads[tag]++
	s.mu.Unlock()
	return s.gatedReads.GetTask(ctx, id)
}

// A stream that follows a task it read is made to read it again only
// for a notice of that task since its read, not for notices of other
// tasks: here bob's own tasks change while alice's stream lists hers.
func TestFollowingATaskReadsItAgainOnlyForItsOwnNotices(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemStore()
		held := &gatedReads{MemStore: mem}
		s := &countedGatedReads{gatedReads: held, reads: map[string]int{}}
		front, runner := NewRuntime[Store](s, Config{}), NewRuntime(mem, Config{})
		require.NoError(t, front.Start(ctx))
		require.NoError(t, runner.Start(ctx))
		synctest.Wait()
		g := newGate()
		_, err := runner.Submit(ctx, "shared", g.fn, bob, WithWatchers(alice))
		require.NoError(t, err)
		<-g.started
		synctest.Wait() // the notices of its start are behind
		sctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		seen := make(chan Snapshot, 16)
		defer func() {
			held.unblock()
			cancel()
			<-done
			g.open()
			assert.NoError(t, runner.Shutdown(ctx))
			assert.NoError(t, front.Shutdown(ctx))
		}()

		held.block() // alice's stream's list waits
		go func() {
			defer close(done)
			for snap, err := range front.Subscribe(context.WithValue(sctx, tagged{}, "alice"), alice) {
				if err != nil {
					return
				}
				seen <- snap
			}
		}()
		synctest.Wait()
		for i := range 5 { // notices of bob's own tasks meanwhile
			sub, err := runner.Submit(ctx, "own"+strconv.Itoa(i), noop, bob)
			require.NoError(t, err)
			settled(t, runner, sub.ID)
		}
		synctest.Wait()
		held.unblock()
		synctest.Wait()
		require.Len(t, seen, 1)
		assert.Equal(t, StatusRunning, (<-seen).Status)
		s.mu.Lock()
		defer s.mu.Unlock()
		assert.Zero(t, s.reads["alice"], "alice's stream read the task it had just listed for notices of other tasks")
	})
}

// A stream that shows a run of this runtime live is told Gone when
// another runtime cancels that run and re-runs the key without the
// stream's caller before this runtime reads the record: the run's end
// cannot be read any more, and its own late write is fenced out. With
// its reads free, this runtime may read the cancel first, and the stream
// then shows that end instead.
func TestSubscribeSaysGoneOfItsOwnRunReRunElsewhereWithoutTheCaller(t *testing.T) {
	for _, held := range []bool{false, true} {
		t.Run(fmt.Sprintf("reads held=%v", held), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := NewMemStore()
				reads := &gatedReads{MemStore: mem}
				front, other, sub, g := runningOnFront(t, reads, mem)
				seen, stop := streamed(ctx, front, alice)
				synctest.Wait()
				first := <-seen
				require.Equal(t, sub.RunID, first.RunID)
				require.Equal(t, StatusRunning, first.Status)

				if held {
					reads.block() // this runtime reads only after the re-run
				}
				require.NoError(t, other.Cancel(ctx, sub.ID, bob))
				next := newGate()
				re, err := other.Submit(ctx, "x", next.fn, bob) // without alice
				require.NoError(t, err)
				require.NotEqual(t, sub.RunID, re.RunID)
				synctest.Wait()
				reads.unblock()
				time.Sleep(30 * time.Second) // notices, sync passes
				synctest.Wait()
				got := drain(seen)
				if assert.Len(t, got, 1, "alice's stream still shows %s RUNNING", sub.RunID) {
					// With its reads free, this runtime may read the
					// cancel before the re-run: the stream then ends with
					// the run's end, which is as final as Gone.
					assert.True(t, got[0].Gone || !held && got[0].Status == StatusCancelled, "%+v", got[0])
					assert.Equal(t, sub.RunID, got[0].RunID)
				}
				stop()
				g.open()
				next.open()
				require.NoError(t, other.Shutdown(ctx))
				require.NoError(t, front.Shutdown(ctx))
			})
		})
	}
}

// A change of a task with many watchers, many of whom have streams open
// (Subscribe streams, and Watch streams of the task), goes through each
// watcher's name, and each stream, a few times at most: never each name
// once for every other name, nor once for every stream, which for W
// watchers and N streams would cost O(W²) or O(W·N) steps on every
// change, progress included.
func TestAChangeOfManyWatchersCostsStepsLinearInThem(t *testing.T) {
	const n = 1000
	var h hub
	id, err := ScopedTaskKey("report", alice)
	require.NoError(t, err)
	watchers := make([]string, n)
	for i := range watchers {
		watchers[i] = "w" + strconv.Itoa(i)
	}
	var subs, watches []*subscriber
	for i := 0; i < n; i += 4 { // every fourth watcher subscribes, and watches the task
		subs = append(subs, newSubscriber(caller{userID: watchers[i]}, "", Filter{}))
		watches = append(watches, newSubscriber(caller{userID: watchers[i]}, id, Filter{}))
	}
	watches = append(watches, newSubscriber(caller{userID: alice.id}, id, Filter{}))
	stranger := newSubscriber(caller{userID: "mallory"}, id, Filter{})
	for _, s := range append(append([]*subscriber{stranger}, subs...), watches...) {
		h.add(s)
	}
	ev := &event{snap: Snapshot{ID: id, RunID: "r.1", Status: StatusRunning, Progress: 40}, watchers: watchers}

	h.mu.Lock()
	h.fan(ev)
	steps := h.steps
	h.mu.Unlock()
	streams := len(subs) + len(watches) + 1
	assert.LessOrEqual(t, steps, uint64(2*(n+streams)), "steps for %d watchers and %d streams", n, streams)
	for _, s := range append(subs, watches...) {
		s.mu.Lock()
		assert.NotNil(t, s.slots[id], "the change reached %s's stream", s.c.userID)
		s.mu.Unlock()
	}
	stranger.mu.Lock()
	assert.Nil(t, stranger.slots[id], "a stream of one who does not watch holds no change")
	stranger.mu.Unlock()

	reached := make(map[*subscriber]int)
	h.mu.Lock()
	h.steps = 0
	h.audience(id, append(watchers, watchers...), func(s *subscriber) { reached[s]++ })
	steps = h.steps
	h.mu.Unlock()
	assert.LessOrEqual(t, steps, uint64(2*(2*n+len(subs))), "steps for %d watchers named twice", n)
	assert.Len(t, reached, len(subs))
	for s, times := range reached {
		assert.Equal(t, 1, times, "%s's stream reached once", s.c.userID)
	}
}
