package workers

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
		front := newRuntime(t, deafStore{mem}, Config{})
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
		time.Sleep(time.Minute)
		synctest.Wait()
		select {
		case snap := <-waited:
			assert.Equal(t, StatusCancelled, snap.Status)
		default:
			t.Error("Wait of a queue item cancelled elsewhere is still blocked a minute later")
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
