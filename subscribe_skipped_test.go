package workers

import (
	"context"
	"iter"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// gapStore is a MemStore whose notices can be interrupted: resync
// sends a Resync, as a store does after it reopened its listener's
// dropped connection. listening is closed once the listener's first
// Resync, which it sends as it starts, was delivered.
type gapStore struct {
	*MemStore
	mu        sync.Mutex // one call of changed at a time
	changed   func(Change)
	once      sync.Once
	listening chan struct{}
}

func (s *gapStore) Listen(ctx context.Context, changed func(Change)) error {
	return s.MemStore.Listen(ctx, func(c Change) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.changed = changed
		changed(c)
		if c.Resync {
			s.once.Do(func() { close(s.listening) })
		}
	})
}

func (s *gapStore) resync() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.changed(Change{Resync: true})
}

// A Subscribe stream says that it skipped changes (ErrSkipped) when the
// store's notices were interrupted, and goes on: a task of another
// process that began and ended in the gap is never shown. The Resync a
// listener sends as it starts is no gap: the stream goes on without an
// error.
func TestSubscribeSaysItSkippedWhenTheNoticesWereInterrupted(t *testing.T) {
	s := &gapStore{MemStore: NewMemStore(), listening: make(chan struct{})}
	rt := newRuntime(t, s, Config{})
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
	require.Equal(t, first.ID, snap.ID)
	wait(t, s.listening, "the listener's start")

	second, err := rt.Submit(ctx, "second", held, alice)
	require.NoError(t, err)
	for snap.ID != second.ID {
		snap, err, ok = next()
		require.True(t, ok)
		require.NoError(t, err, "the listener's first Resync is not a gap")
	}

	s.resync()
	_, err, ok = next()
	require.True(t, ok)
	require.ErrorIs(t, err, ErrSkipped)
	third, err := rt.Submit(ctx, "third", held, alice)
	require.NoError(t, err)
	for snap.ID != third.ID {
		snap, err, ok = next()
		require.True(t, ok)
		require.NoError(t, err, "the stream goes on after ErrSkipped")
	}
}
