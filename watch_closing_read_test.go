package workers

import (
	"context"
	"iter"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// latentReads is a MemStore shared with another runtime whose reads, once
// slow is set, take 50ms to answer, as a database's do over a network; a
// read whose context ends meanwhile ends with its error. listening is
// closed once this runtime's listener delivered its first Resync.
type latentReads struct {
	*MemStore
	slow      atomic.Bool
	once      sync.Once
	listening chan struct{}
}

func (s *latentReads) Listen(ctx context.Context, changed func(Change)) error {
	return s.MemStore.Listen(ctx, func(c Change) {
		changed(c)
		if c.Resync {
			s.once.Do(func() { close(s.listening) })
		}
	})
}

func (s *latentReads) GetTask(ctx context.Context, id string) (Record, error) {
	if s.slow.Load() {
		select {
		case <-ctx.Done():
			return Record{}, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return s.MemStore.GetTask(ctx, id)
}

// A Watch ends, once Shutdown has returned, "after the changes that
// reached the stream before": the end of another runtime's run, whose
// notice reached the stream before Shutdown, is yielded before the stream
// ends. streamRead cuts off every read begun after Shutdown at once, so a
// store that answers in 50ms never gets to: the change is lost and the
// stream ends with ErrClosed alone.
func TestWatchYieldsARemoteEndThatReachedItBeforeShutdown(t *testing.T) {
	mem := NewMemStore()
	s := &latentReads{MemStore: mem, listening: make(chan struct{})}
	rtA := newRuntime(t, s, Config{})
	rtB := newRuntime(t, mem, Config{})
	release := make(chan struct{})
	sub, err := rtB.Submit(ctx, "remote", func(context.Context, *Task) (any, error) { <-release; return "done", nil }, alice)
	require.NoError(t, err)

	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	next, stop := iter.Pull2(rtA.Watch(wctx, sub.ID, alice))
	defer stop()
	snap, err, ok := next()
	require.True(t, ok)
	require.NoError(t, err)
	require.False(t, snap.Status.Terminal())
	wait(t, s.listening, "rtA's listener")

	// The run ends on rtB; its notice marks rtA's Watch stale.
	close(release)
	_, err = rtB.Wait(ctx, sub.ID, alice)
	require.NoError(t, err)
	deadline := time.Now().Add(10 * time.Second)
	for !watchMarked(rtA, sub.ID) {
		require.True(t, time.Now().Before(deadline), "the notice never reached the Watch")
		time.Sleep(time.Millisecond)
	}

	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	defer scancel()
	require.NoError(t, rtA.Shutdown(sctx))
	s.slow.Store(true)

	snap, err, ok = next()
	require.True(t, ok)
	require.NoError(t, err, "the end that reached the stream before Shutdown is lost")
	require.Equal(t, StatusCompleted, snap.Status)
}

// watchMarked reports whether a Watch of id on rt has id marked stale.
func watchMarked[S Store](rt *Runtime[S], id string) bool {
	rt.hub.mu.Lock()
	defer rt.hub.mu.Unlock()
	for s := range rt.hub.byID[id] {
		s.mu.Lock()
		_, ok := s.stale[id]
		s.mu.Unlock()
		if ok {
			return true
		}
	}
	return false
}

// So does a Subscribe stream: a task of another runtime's it showed live,
// whose end's notice reached it before Shutdown, is followed to that end.
func TestSubscribeYieldsARemoteEndThatReachedItBeforeShutdown(t *testing.T) {
	mem := NewMemStore()
	s := &latentReads{MemStore: mem, listening: make(chan struct{})}
	rtA := newRuntime(t, s, Config{})
	rtB := newRuntime(t, mem, Config{})
	release := make(chan struct{})
	sub, err := rtB.Submit(ctx, "remote", func(context.Context, *Task) (any, error) { <-release; return "done", nil }, alice)
	require.NoError(t, err)

	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	next, stop := iter.Pull2(rtA.Subscribe(sctx, alice))
	defer stop()
	snap, err, ok := next()
	require.True(t, ok)
	require.NoError(t, err)
	require.Equal(t, sub.ID, snap.ID)
	require.False(t, snap.Status.Terminal())
	wait(t, s.listening, "rtA's listener")

	close(release)
	_, err = rtB.Wait(ctx, sub.ID, alice)
	require.NoError(t, err)
	deadline := time.Now().Add(10 * time.Second)
	for !subscribeMarked(rtA, sub.ID) {
		require.True(t, time.Now().Before(deadline), "the notice never reached the stream")
		time.Sleep(time.Millisecond)
	}

	shctx, shcancel := context.WithTimeout(ctx, 10*time.Second)
	defer shcancel()
	require.NoError(t, rtA.Shutdown(shctx))
	s.slow.Store(true)

	snap, err, ok = next()
	require.True(t, ok)
	require.NoError(t, err, "the end that reached the stream before Shutdown is lost")
	require.Equal(t, sub.ID, snap.ID)
	require.Equal(t, StatusCompleted, snap.Status)
	_, err, ok = next()
	require.True(t, ok)
	require.ErrorIs(t, err, ErrClosed)
}

// subscribeMarked reports whether a Subscribe stream of rt has id marked
// stale.
func subscribeMarked[S Store](rt *Runtime[S], id string) bool {
	rt.hub.mu.Lock()
	defer rt.hub.mu.Unlock()
	for _, m := range rt.hub.subs {
		for s := range m {
			s.mu.Lock()
			_, ok := s.stale[id]
			s.mu.Unlock()
			if ok {
				return true
			}
		}
	}
	return false
}
