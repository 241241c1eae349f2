package workers

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// expiringStore is a MemStore that, once armed, says at one renewal that
// the lease had expired, and whose listings fail while failLists is set
// (a listing that times out on a busy database, say).
type expiringStore struct {
	*MemStore
	expire    atomic.Bool
	failLists atomic.Bool
	lists     atomic.Int64 // listings failed
}

func (s *expiringStore) RenewLease(ctx context.Context, instance string, ttl time.Duration) (bool, error) {
	extended, err := s.MemStore.RenewLease(ctx, instance, ttl)
	if s.expire.CompareAndSwap(true, false) {
		return false, err
	}
	return extended, err
}

func (s *expiringStore) ListTasks(ctx context.Context, f Filter) ([]Record, error) {
	if s.failLists.Load() {
		s.lists.Add(1)
		return nil, errors.New("listing timed out")
	}
	return s.MemStore.ListTasks(ctx, f)
}

// A runtime that was not started ends the records of its runs abandoned
// with a lost lease on a goroutine of its loops, once the lease is back,
// and tries again at each renewal while that fails. Each try must not
// leave anything behind in the runtime: the loops' list of goroutines to
// wait for grows by one per try, for as long as the runtime lives.
func TestEndingAbandonedRunsAgainAndAgainLeavesNothingBehind(t *testing.T) {
	s := &expiringStore{MemStore: NewMemStore()}
	rt := newRuntime(t, s, Config{
		LeaseInterval: 5 * time.Millisecond, LeaseTTL: time.Second,
		Logger: slog.New(slog.DiscardHandler),
	})
	g := stubbornGate()
	sub, err := rt.Submit(ctx, "job", g.fn, alice)
	require.NoError(t, err)
	wait(t, g.started, "the run to start")
	rt.mu.Lock()
	before := len(rt.loops.done)
	rt.mu.Unlock()

	s.failLists.Store(true)
	s.expire.Store(true) // the next renewal loses the lease, the one after takes it again
	eventually(t, func() bool { return s.lists.Load() >= 50 }, "50 passes that end abandoned runs")
	s.failLists.Store(false)
	eventually(t, func() bool { return rt.lease.abandoned.Load() == 0 }, "the abandoned run's record to end")

	rt.mu.Lock()
	after := len(rt.loops.done)
	rt.mu.Unlock()
	t.Logf("loops.done: %d before, %d after", before, after)
	assert.LessOrEqual(t, after, before+4, "each pass left its done channel in the loops for good")
	g.open()
	assert.Equal(t, StatusFailed, settled(t, rt, sub.ID).Status)
}
