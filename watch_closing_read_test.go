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

// A stream ends, once Shutdown has returned, "after the changes that
// reached the stream before": the end of another runtime's run, whose
// notice reached a Watch of it, or a Subscribe stream that showed it
// live, before Shutdown, is yielded (and a Subscribe stream then ends
// with ErrClosed), though the store takes 50ms to answer the read of it.
func TestStreamsYieldARemoteEndThatReachedThemBeforeShutdown(t *testing.T) {
	for _, c := range []struct {
		name   string
		open   func(rt *Runtime[*latentReads], ctx context.Context, id string) iter.Seq2[Snapshot, error]
		marked func(rt *Runtime[*latentReads], id string) bool
	}{
		{"Watch", func(rt *Runtime[*latentReads], ctx context.Context, id string) iter.Seq2[Snapshot, error] {
			return rt.Watch(ctx, id, alice)
		}, watchMarked[*latentReads]},
		{"Subscribe", func(rt *Runtime[*latentReads], ctx context.Context, _ string) iter.Seq2[Snapshot, error] {
			return rt.Subscribe(ctx, alice)
		}, subscribeMarked[*latentReads]},
	} {
		t.Run(c.name, func(t *testing.T) {
			mem := NewMemStore()
			s := &latentReads{MemStore: mem, listening: make(chan struct{})}
			rtA := newRuntime(t, s, Config{})
			rtB := newRuntime(t, mem, Config{})
			release := make(chan struct{})
			sub, err := rtB.Submit(ctx, "remote", func(context.Context, *Task) (any, error) { <-release; return "done", nil }, alice)
			require.NoError(t, err)

			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			next, stop := iter.Pull2(c.open(rtA, sctx, sub.ID))
			defer stop()
			snap, err, ok := next()
			require.True(t, ok)
			require.NoError(t, err)
			require.Equal(t, sub.ID, snap.ID)
			require.False(t, snap.Status.Terminal())
			wait(t, s.listening, "rtA's listener")

			// The run ends on rtB; its notice marks rtA's stream stale.
			close(release)
			_, err = rtB.Wait(ctx, sub.ID, alice)
			require.NoError(t, err)
			deadline := time.Now().Add(10 * time.Second)
			for !c.marked(rtA, sub.ID) {
				require.True(t, time.Now().Before(deadline), "the notice never reached the stream")
				time.Sleep(time.Millisecond) // polling with a deadline
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
			if c.name == "Watch" {
				require.False(t, ok, "a Watch ends with its task's end")
				return
			}
			require.True(t, ok)
			require.ErrorIs(t, err, ErrClosed)
		})
	}
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
