package workers_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
)

// partitioned is a MemStore, without its notices, seen from a replica
// that the network cuts off: once late is set, the next lease renewal
// lands at once (the store sets the expiry) but its answer comes lateBy
// later, as one does whose commit waits (a synchronous standby, a
// stalled disk) or whose reply is held up on the way; from then on the
// replica is cut off, and every renewal and read hangs until its context
// ends, as over a connection lost without a reset.
type partitioned struct {
	workers.Store // a *MemStore; its Notifier is not passed through
	l             workers.Leaser
	lateBy        time.Duration
	late          atomic.Bool
	cut           atomic.Bool
}

func (s *partitioned) RenewLease(ctx context.Context, instance string, ttl time.Duration) (bool, error) {
	if s.cut.Load() {
		<-ctx.Done()
		return false, ctx.Err()
	}
	extended, err := s.l.RenewLease(ctx, instance, ttl)
	if s.late.CompareAndSwap(true, false) {
		select {
		case <-time.After(s.lateBy):
		case <-ctx.Done():
			return false, ctx.Err()
		}
		s.cut.Store(true)
	}
	return extended, err
}

func (s *partitioned) ReleaseLease(ctx context.Context, instance string) error {
	return s.l.ReleaseLease(ctx, instance)
}

func (s *partitioned) LiveInstances(ctx context.Context) ([]string, error) {
	return s.l.LiveInstances(ctx)
}

func (s *partitioned) GetTask(ctx context.Context, id string) (workers.Record, error) {
	if s.cut.Load() {
		<-ctx.Done()
		return workers.Record{}, ctx.Err()
	}
	return s.Store.GetTask(ctx, id)
}

// A run must be cancelled by the time its instance's lease may have
// ended by the store's clock: from then on a peer recovers it and a
// submission of its key starts a second run. After a renewal whose answer
// came late, the next one, which hangs, is cut off LeaseTTL after the
// start of the late one, when the store may have set the lease's end.
func TestARenewalAfterALateAnswerIsCutOffWhenTheLeaseMayHaveEnded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := workers.NewMemStore()
		slow := &partitioned{Store: mem, l: mem, lateBy: 1500 * time.Millisecond}
		a, b, run := heldRunBesideAPeer(t, slow, mem) // t=0: A's lease ends at 3
		// t=1: the renewal sets A's lease to end at 4 by the store's
		// clock, and answers at 2.5; the next renewal hangs.
		slow.late.Store(true)
		time.Sleep(4200 * time.Millisecond) // t=4.2: the lease ended at 4
		cancelledBeforeTheRerun(t, a, b, mem, run)
	})
}

// heldRunBesideAPeer starts a runtime over slow and a peer over mem,
// recovering every 100 ms, with a LeaseInterval of a second and a LeaseTTL
// of three, and submits on the first a run that waits for its cancel; it
// returns once the run has started, with a func that gives its context.
func heldRunBesideAPeer(t *testing.T, slow workers.Store, mem *workers.MemStore) (a, b *workers.Runtime[workers.Store], run func() context.Context) {
	t.Helper()
	cfg := workers.Config{Logger: quiet, LeaseInterval: time.Second, LeaseTTL: 3 * time.Second}
	a = workers.NewRuntime(slow, cfg)
	require.NoError(t, a.Start(t.Context()))
	peer := cfg
	peer.RecoverInterval = 100 * time.Millisecond
	b = workers.NewRuntime[workers.Store](mem, peer)
	require.NoError(t, b.Start(t.Context()))
	var runCtx atomic.Pointer[context.Context]
	started := make(chan struct{})
	_, err := a.Submit(t.Context(), "k", func(ctx context.Context, _ *workers.Task) (any, error) {
		runCtx.Store(&ctx)
		close(started)
		<-ctx.Done()
		return nil, context.Cause(ctx)
	}, owner)
	require.NoError(t, err, "registered before the lease's end")
	<-started
	return a, b, func() context.Context { return *runCtx.Load() }
}

// cancelledBeforeTheRerun checks, once a's lease has ended by the store's
// clock, that the peer b recovered a's run and runs its key again, and
// that a's run was cancelled by then; then it shuts both down.
func cancelledBeforeTheRerun(t *testing.T, a, b *workers.Runtime[workers.Store], mem *workers.MemStore, run func() context.Context) {
	t.Helper()
	synctest.Wait()
	rec, err := mem.GetTask(t.Context(), scoped(t, "k"))
	require.NoError(t, err)
	require.Equal(t, workers.StatusFailed, rec.Status, "the peer recovered the run once A's lease ended")
	rerun := make(chan struct{})
	_, err = b.Submit(t.Context(), "k", func(ctx context.Context, _ *workers.Task) (any, error) {
		close(rerun)
		return "second", nil
	}, owner)
	require.NoError(t, err)
	<-rerun
	assert.Error(t, run().Err(), "A's run still executes while the peer runs the key again, A's lease having ended")
	<-run().Done()
	require.NoError(t, b.Shutdown(t.Context()))
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	_ = a.Shutdown(ctx)
}

// slowTake is a MemStore, without its notices, whose first lease renewal
// (the take) lands at once, the store setting the lease's end LeaseTTL
// from then, but answers takeBy later, as over a cold connection whose
// reply is slow; every renewal after it hangs until its context ends.
type slowTake struct {
	workers.Store // a *MemStore; its Notifier is not passed through
	l             workers.Leaser
	takeBy        time.Duration
	n             atomic.Int32
}

func (s *slowTake) RenewLease(ctx context.Context, instance string, ttl time.Duration) (bool, error) {
	if s.n.Add(1) > 1 {
		<-ctx.Done()
		return false, ctx.Err()
	}
	extended, err := s.l.RenewLease(ctx, instance, ttl)
	select {
	case <-time.After(s.takeBy):
	case <-ctx.Done():
		return false, ctx.Err()
	}
	return extended, err
}

func (s *slowTake) ReleaseLease(ctx context.Context, instance string) error {
	return s.l.ReleaseLease(ctx, instance)
}

func (s *slowTake) LiveInstances(ctx context.Context) ([]string, error) {
	return s.l.LiveInstances(ctx)
}

// The take may take most of a LeaseTTL (a cold connection may be slow).
// One that answers later than LeaseTTL-LeaseInterval after it was sent
// leaves the lease's end before the loop's first renewal: the loop wakes
// at that end, with no renewal in flight to cut off, and cancels the run
// submitted right after Start before a peer recovers it and runs its key
// again.
func TestARunIsCancelledWhenTheLeaseMayHaveEndedAfterASlowTake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := workers.NewMemStore()
		slow := &slowTake{Store: mem, l: mem, takeBy: 2500 * time.Millisecond}
		a, b, run := heldRunBesideAPeer(t, slow, mem) // t=2.5: the lease, set at t=0, ends at t=3
		time.Sleep(800 * time.Millisecond)            // t=3.3: A's first renewal is due at t=3.5
		cancelledBeforeTheRerun(t, a, b, mem, run)
	})
}
