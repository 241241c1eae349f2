package workers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// droppingNotices is a MemStore shared by processes whose notices to one
// listener can be lost (drop), and whose listener's connection is cut at
// each send on cut, after which the runtime listens again and is told to
// resync. Its
// next GetTask of the id failRead names fails, as a dropped connection
// would. Each GetTask takes readTime, and is counted in reads.
type droppingNotices struct {
	*MemStore
	drop     atomic.Bool
	cut      chan struct{}
	failRead atomic.Pointer[string]
	readTime atomic.Int64 // a time.Duration
	reads    atomic.Int64
}

func (s *droppingNotices) GetTask(ctx context.Context, id string) (Record, error) {
	s.reads.Add(1)
	if d := time.Duration(s.readTime.Load()); d > 0 {
		time.Sleep(d)
	}
	if p := s.failRead.Load(); p != nil && *p == id && s.failRead.CompareAndSwap(p, nil) {
		return Record{}, errors.New("connection reset by peer")
	}
	return s.MemStore.GetTask(ctx, id)
}

func (s *droppingNotices) Listen(ctx context.Context, changed func(Change)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.cut:
			cancel()
		case <-ctx.Done():
		}
	}()
	err := s.MemStore.Listen(ctx, func(c Change) {
		if !c.Resync && s.drop.Load() {
			return
		}
		changed(c)
	})
	return errors.Join(err, errors.New("connection cut"))
}

// A run waiting for its turn whose cancel from another process came while
// the listener was not listening is checked at the listener's resync:
// it ends, and gives back its place in its queue, or its owner's waiting
// slot, at once rather than when the callbacks ahead of it return.
// Should the check's read fail, the run keeps its place until its turn,
// and then ends without running: the cancel stands.
func TestAResyncChecksTheRunsWaitingForTheirTurn(t *testing.T) {
	// waiting counts the runs that wait, as a caller sees them: under
	// Limits, in Stats; in a queue, among QueueStatus's items still to run.
	type waitingRuns func(rt *Runtime[*droppingNotices]) int
	for _, c := range []struct {
		name    string
		cfg     Config
		submit  func(rt *Runtime[*droppingNotices], key string, fn Func) (Submission, error)
		waiting waitingRuns
	}{
		{"UnderLimits", Config{Limits: Limits{MaxRunning: 1}}, func(rt *Runtime[*droppingNotices], key string, fn Func) (Submission, error) {
			return rt.Submit(ctx, key, fn, alice)
		}, func(rt *Runtime[*droppingNotices]) int {
			st, err := rt.Stats(ctx, System)
			require.NoError(t, err)
			return st.Waiting
		}},
		{"InAQueue", Config{}, func(rt *Runtime[*droppingNotices], key string, fn Func) (Submission, error) {
			return rt.SubmitSequential(ctx, "q", key, fn, alice)
		}, func(rt *Runtime[*droppingNotices]) int {
			q, err := rt.QueueStatus(ctx, "q", System)
			require.NoError(t, err)
			return len(q.Pending)
		}},
	} {
		for _, readFails := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/read fails=%v", c.name, readFails), func(t *testing.T) {
				resyncChecksWaiting(t, c.cfg, c.submit, c.waiting, readFails)
			})
		}
	}
}

func resyncChecksWaiting(t *testing.T, cfg Config, submit func(rt *Runtime[*droppingNotices], key string, fn Func) (Submission, error),
	waiting func(rt *Runtime[*droppingNotices]) int, readFails bool) {
	synctest.Test(t, func(t *testing.T) {
		s := &droppingNotices{MemStore: NewMemStore(), cut: make(chan struct{})}
		cfg.Logger = slog.New(slog.DiscardHandler)
		cfg.LeaseInterval = time.Second
		cfg.SyncInterval = time.Hour // out of the way
		rt := NewRuntime(s, cfg)
		require.NoError(t, rt.Start(ctx))
		other := NewRuntime(s.MemStore, Config{Logger: cfg.Logger})

		head := newGate()
		_, err := submit(rt, "head", head.fn)
		require.NoError(t, err)
		<-head.started
		var ran atomic.Bool
		behind, err := submit(rt, "behind", func(context.Context, *Task) (any, error) { ran.Store(true); return nil, nil })
		require.NoError(t, err)
		synctest.Wait()

		s.drop.Store(true)
		require.NoError(t, other.Cancel(ctx, behind.ID, alice))
		synctest.Wait()
		require.Equal(t, 1, waiting(rt), "the cancel's notice was lost")

		s.drop.Store(false)
		if readFails {
			s.failRead.Store(&behind.ID)
		}
		s.cut <- struct{}{} // the listener listens again after a pause, and resyncs
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if readFails {
			assert.Nil(t, s.failRead.Load(), "the check read it")
			assert.Equal(t, 1, waiting(rt), "unchecked, the run keeps its place")
		} else {
			assert.Zero(t, waiting(rt), "the cancelled run no longer waits")
		}
		snap, err := rt.Status(ctx, behind.ID, alice)
		require.NoError(t, err)
		assert.Equal(t, StatusCancelled, snap.Status)

		head.open()
		synctest.Wait()
		assert.Zero(t, waiting(rt))
		require.NoError(t, rt.Shutdown(ctx))
		require.NoError(t, other.Shutdown(ctx))
		assert.False(t, ran.Load(), "the cancelled run never started")
	})
}

// After a resync, the runs waiting for their turn are read one at a time
// between the checks that notices ask for: a cancel from another process
// reaches a running callback within about one read, not after a read of
// every item of a long queue.
func TestAResyncsReadsOfWaitingRunsHoldUpNoNotice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &droppingNotices{MemStore: NewMemStore(), cut: make(chan struct{})}
		logger := slog.New(slog.DiscardHandler)
		rt := NewRuntime(s, Config{Logger: logger, LeaseInterval: time.Second, SyncInterval: time.Hour})
		require.NoError(t, rt.Start(ctx))
		other := NewRuntime(s.MemStore, Config{Logger: logger})

		head := newGate()
		_, err := rt.SubmitSequential(ctx, "q", "head", head.fn, alice)
		require.NoError(t, err)
		<-head.started
		const queued = 200
		for i := range queued {
			_, err := rt.SubmitSequential(ctx, "q", fmt.Sprint("item-", i), func(context.Context, *Task) (any, error) { return nil, nil }, alice)
			require.NoError(t, err)
		}
		job, running := startGated(t, rt, "job")
		synctest.Wait()

		s.readTime.Store(int64(10 * time.Millisecond))
		before := s.reads.Load()
		s.cut <- struct{}{} // the listener listens again after a pause, and resyncs
		for deadline := time.Now().Add(10 * time.Second); s.reads.Load() < before+2; {
			require.True(t, time.Now().Before(deadline), "the resync read no waiting run")
			time.Sleep(time.Millisecond) // the bubble's clock: until the resync reads the waiting runs
		}
		cancelled := time.Now()
		require.NoError(t, other.Cancel(ctx, job.ID, alice))
		select {
		case <-running.ran:
		case <-time.After(time.Second):
		}
		took := time.Since(cancelled)
		assert.Less(t, took, 100*time.Millisecond, "the cancel reached the callback after %v, behind the resync's reads of %d queued runs", took, queued)

		head.open()
		synctest.Wait()
		require.NoError(t, rt.Shutdown(ctx))
		require.NoError(t, other.Shutdown(ctx))
	})
}

// gatedNotices is a MemStore whose listener, while the gate is blocked, waits
// before handing a notice on: the MemStore queues and merges the notices
// meanwhile, as it does for any slow listener.
type gatedNotices struct {
	*MemStore
	holdGate
}

func (s *gatedNotices) Listen(ctx context.Context, changed func(Change)) error {
	return s.MemStore.Listen(ctx, func(c Change) {
		s.wait()
		changed(c)
	})
}

// runningOnFront starts two runtimes over mem, both listening: front,
// through s (mem seen through a test's wrapper), and other. On front a
// run of bob's, watched by alice, has started. Call it in a synctest
// bubble.
func runningOnFront(t *testing.T, s Store, mem *MemStore) (front *Runtime[Store], other *Runtime[*MemStore], sub Submission, g *gate) {
	t.Helper()
	front, other = NewRuntime(s, Config{}), NewRuntime(mem, Config{})
	require.NoError(t, front.Start(ctx))
	require.NoError(t, other.Start(ctx))
	synctest.Wait()
	g = newGate()
	sub, err := front.Submit(ctx, "x", g.fn, bob, WithWatchers(alice))
	require.NoError(t, err)
	<-g.started
	return front, other, sub, g
}

// A Wait for a run of this runtime that another runtime cancels, and
// whose key it re-runs at once without the waiter, returns: the notices
// may reach this runtime as the new run's RUNNING one alone, which says
// that the run waited for is no longer the record's.
func TestWaitReturnsWhenItsRunIsReplacedElsewhere(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemStore()
		gn := &gatedNotices{MemStore: mem}
		front, other, sub, g := runningOnFront(t, gn, mem)
		type waited struct {
			snap Snapshot
			err  error
		}
		wctx, wcancel := context.WithCancel(ctx)
		defer wcancel()
		done := make(chan waited, 1)
		go func() {
			s, err := front.Wait(wctx, sub.ID, alice)
			done <- waited{s, err}
		}()
		synctest.Wait()

		gn.block()
		_, err := other.Submit(ctx, "unrelated", noop, bob) // the listener takes its notice, and waits
		require.NoError(t, err)
		synctest.Wait()
		require.NoError(t, other.Cancel(ctx, sub.ID, bob))
		next := newGate()
		_, err = other.Submit(ctx, "x", next.fn, bob) // without alice
		require.NoError(t, err)
		synctest.Wait()
		gn.unblock()
		time.Sleep(time.Minute)
		synctest.Wait()
		select {
		case w := <-done:
			assert.ErrorIs(t, w.err, ErrNotFound, "alice no longer sees the key")
		default:
			assert.Fail(t, "alice's Wait still waits a minute after her run was cancelled and the key re-run without her")
			wcancel()
			<-done
		}
		next.open()
		g.open()
		require.NoError(t, other.Shutdown(ctx))
		require.NoError(t, front.Shutdown(ctx))
	})
}

// landedInsertHeld is a MemStore whose InsertTask lands and then waits for
// release before it returns, as a commit whose answer is slow to come.
// Once armed with a fault, its next GetTask fails, before it reads or
// after.
type landedInsertHeld struct {
	*MemStore
	inserted, release chan struct{}
	readFault         atomic.Pointer[string] // "before" or "after"
}

func newLandedInsertHeld(mem *MemStore) *landedInsertHeld {
	return &landedInsertHeld{MemStore: mem, inserted: make(chan struct{}), release: make(chan struct{})}
}

func (s *landedInsertHeld) InsertTask(ctx context.Context, rec Record) error {
	err := s.MemStore.InsertTask(ctx, rec)
	close(s.inserted)
	<-s.release
	return err
}

func (s *landedInsertHeld) GetTask(ctx context.Context, id string) (Record, error) {
	fault := s.readFault.Swap(nil)
	if fault != nil && *fault == "before" {
		return Record{}, errors.New("connection reset by peer")
	}
	rec, err := s.MemStore.GetTask(ctx, id)
	if fault != nil {
		return Record{}, errors.New("connection reset by peer")
	}
	return rec, err
}

// heldFront starts front and other over mem (front through s), calls
// first if it is not nil, and has front submit alice's task k, whose
// callback sends to started and waits for its context; it returns once
// the registering write is in, with the channel of Submit's error and the
// task's id.
func heldFront(t *testing.T, mem *MemStore, s Store, inserted <-chan struct{}, cfg Config, first func(other *Runtime[*MemStore])) (front *Runtime[Store], other *Runtime[*MemStore], started chan struct{}, submitted chan error, id string) {
	t.Helper()
	front, other = NewRuntime(s, cfg), NewRuntime(mem, Config{})
	require.NoError(t, front.Start(ctx))
	require.NoError(t, other.Start(ctx))
	synctest.Wait()
	if first != nil {
		first(other)
	}
	started, submitted = make(chan struct{}, 1), make(chan error, 1)
	go func() {
		_, err := front.Submit(ctx, "k", func(ctx context.Context, _ *Task) (any, error) {
			started <- struct{}{}
			<-ctx.Done()
			return nil, context.Cause(ctx)
		}, alice)
		submitted <- err
	}()
	<-inserted
	id, err := ScopedTaskKey("k", alice)
	require.NoError(t, err)
	return front, other, started, submitted, id
}

// neverStarted checks that front's run of k settled without its callback
// starting, and shuts both runtimes down.
func neverStarted(t *testing.T, front *Runtime[Store], other *Runtime[*MemStore], started chan struct{}) {
	t.Helper()
	select {
	case <-started:
		t.Error("the callback started, its record ended elsewhere")
	default:
	}
	assert.Zero(t, front.runs.len(), "the run settled")
	require.NoError(t, front.Shutdown(ctx))
	require.NoError(t, other.Shutdown(ctx))
}

// A run cancelled by another process once its registering write is in,
// but before the run is published here, never starts its callback: the
// notice of the cancel, which the listener could not match to a run, is
// remembered for the run's registration to check.
func TestACancelElsewhereBeforeTheRunIsPublishedKeepsItsCallbackFromStarting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemStore()
		s := newLandedInsertHeld(mem)
		front, other, started, submitted, id := heldFront(t, mem, s, s.inserted, Config{SyncInterval: time.Hour}, nil)
		require.NoError(t, other.Cancel(ctx, id, alice))
		synctest.Wait() // front's listener has handled the notice, before the run is published
		close(s.release)
		require.NoError(t, <-submitted)
		synctest.Wait()
		r, err := mem.GetTask(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, StatusCancelled, r.Status)
		neverStarted(t, front, other, started)
	})
}

// The registration's read of its record, on such a notice, may fail,
// before it reaches the store or after: the submission succeeds, the run
// starts, and the sync loop's next pass finds the cancel and ends it.
func TestACancelElsewhereBeforeTheRunIsPublishedWhoseCheckFailsEndsAtTheNextSync(t *testing.T) {
	for _, fault := range []string{"before", "after"} {
		t.Run(fault, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := NewMemStore()
				s := newLandedInsertHeld(mem)
				front, other, started, submitted, id := heldFront(t, mem, s, s.inserted, Config{SyncInterval: time.Second, Logger: slog.New(slog.DiscardHandler)}, nil)
				require.NoError(t, other.Cancel(ctx, id, alice))
				synctest.Wait()
				s.readFault.Store(&fault) // the registration's check is the next read
				close(s.release)
				require.NoError(t, <-submitted)
				<-started
				assert.Nil(t, s.readFault.Load(), "the registration read its record")
				time.Sleep(2 * time.Second) // a sync pass
				synctest.Wait()
				assert.Zero(t, front.runs.len(), "the sync loop ended the run")
				r, err := mem.GetTask(ctx, id)
				require.NoError(t, err)
				assert.Equal(t, StatusCancelled, r.Status, "the cancel stands")
				require.NoError(t, front.Shutdown(ctx))
				require.NoError(t, other.Shutdown(ctx))
			})
		})
	}
}

// endNotices tells a registration whether a notice of its id's end may
// have come since it began: one of its id, a Resync, or more notices
// than it remembers; not one of another id.
func TestEndNoticesSince(t *testing.T) {
	var n endNotices
	from := n.seq.Load()
	assert.False(t, n.since(from, "a"), "no notice")
	n.note("b")
	assert.False(t, n.since(from, "a"), "another id's")
	n.note("a")
	assert.True(t, n.since(from, "a"), "its own")
	assert.False(t, n.since(n.seq.Load(), "a"), "its own, before the registration began")

	from = n.seq.Load()
	n.note("a")
	for range endNoticeRing {
		n.note("b")
	}
	assert.True(t, n.since(from, "a"), "its own, pushed out of the ring")
	from = n.seq.Load()
	for range endNoticeRing {
		n.note("b")
	}
	assert.False(t, n.since(from, "a"), "a full ring of another id's")

	from = n.seq.Load()
	n.resync()
	assert.True(t, n.since(from, "a"), "a Resync")
}

// coalescedBehindHeld is landedInsertHeld whose listener is held, once,
// on the notice of the task blocker names, so that the notices of other
// tasks written meanwhile are coalesced, as a Notifier may coalesce them.
type coalescedBehindHeld struct {
	*landedInsertHeld
	blocker       string
	held, unblock chan struct{}
	heldOnce      atomic.Bool
}

func (s *coalescedBehindHeld) Listen(ctx context.Context, changed func(Change)) error {
	return s.MemStore.Listen(ctx, func(c Change) {
		if c.ID == s.blocker && s.heldOnce.CompareAndSwap(false, true) {
			close(s.held)
			<-s.unblock
		}
		changed(c)
	})
}

// A run cancelled and re-run by another process once its registering
// write is in, but before the run is published here, never starts its
// callback even when the notices of the cancel and the re-run come
// coalesced into one of the new run: that notice says the run ended as
// much as the cancel's would have.
func TestACancelAndReRunElsewhereBeforeTheRunIsPublishedKeepsItsCallbackFromStarting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemStore()
		blocker, err := ScopedTaskKey("blocker", alice)
		require.NoError(t, err)
		s := &coalescedBehindHeld{landedInsertHeld: newLandedInsertHeld(mem), blocker: blocker, held: make(chan struct{}), unblock: make(chan struct{})}
		block := func(ctx context.Context, _ *Task) (any, error) {
			<-ctx.Done()
			return nil, context.Cause(ctx)
		}
		front, other, started, submitted, id := heldFront(t, mem, s, s.inserted, Config{SyncInterval: time.Hour}, func(other *Runtime[*MemStore]) {
			_, err := other.Submit(ctx, "blocker", block, alice)
			require.NoError(t, err)
			<-s.held // front's listener waits on the blocker's notice
		})
		require.NoError(t, other.Cancel(ctx, id, alice))
		rerun, err := other.Submit(ctx, "k", block, alice)
		require.NoError(t, err)
		require.False(t, rerun.Joined)
		close(s.unblock)
		synctest.Wait() // front's listener has handled the coalesced notice, before the run is published
		close(s.release)
		require.NoError(t, <-submitted)
		synctest.Wait()
		r, err := mem.GetTask(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, rerun.RunID, r.RunID)
		neverStarted(t, front, other, started)
	})
}
