package workers_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
)

// skewed is the view of a shared MemStore from a replica whose clock is
// off by d from the other replica's (which uses the MemStore itself).
// Every time this replica hands the store (a record's CreatedAt, a
// state's StartedAt and CompletedAt) was read on its clock, so it is
// shifted by d on the way in; every time it reads back is shifted by -d
// on the way out, so that what the runtime compares with its own clock
// stands to it as it would on a replica whose clock is off. Leases stay
// on the store's clock (MemStore's own), as the design has them.
// Leaser, Notifier and the rest are MemStore's.
type skewed struct {
	*workers.MemStore
	d time.Duration
}

func shiftTime(t time.Time, d time.Duration) time.Time {
	if t.IsZero() {
		return t
	}
	return t.Add(d)
}

func shiftRecord(rec *workers.Record, d time.Duration) {
	rec.CreatedAt = shiftTime(rec.CreatedAt, d)
	rec.StartedAt, rec.CompletedAt = shiftTime(rec.StartedAt, d), shiftTime(rec.CompletedAt, d)
}

func (s *skewed) InsertTask(ctx context.Context, rec workers.Record) error {
	shiftRecord(&rec, s.d)
	return s.MemStore.InsertTask(ctx, rec)
}

func (s *skewed) ReplaceTask(ctx context.Context, rec workers.Record, prev string) error {
	shiftRecord(&rec, s.d)
	return s.MemStore.ReplaceTask(ctx, rec, prev)
}

func (s *skewed) SetTask(ctx context.Context, rec workers.Record) error {
	shiftRecord(&rec, s.d)
	return s.MemStore.SetTask(ctx, rec)
}

func (s *skewed) TransitionTask(ctx context.Context, id, runID string, from []workers.Status, next workers.State) (bool, error) {
	next.StartedAt, next.CompletedAt = shiftTime(next.StartedAt, s.d), shiftTime(next.CompletedAt, s.d)
	return s.MemStore.TransitionTask(ctx, id, runID, from, next)
}

func (s *skewed) GetTask(ctx context.Context, id string) (workers.Record, error) {
	rec, err := s.MemStore.GetTask(ctx, id)
	shiftRecord(&rec, -s.d)
	return rec, err
}

func (s *skewed) ListTasks(ctx context.Context, f workers.Filter) ([]workers.Record, error) {
	if f.After != nil {
		p := *f.After
		p.CreatedAt = shiftTime(p.CreatedAt, s.d)
		f.After = &p
	}
	recs, err := s.MemStore.ListTasks(ctx, f)
	for i := range recs {
		shiftRecord(&recs[i], -s.d)
	}
	return recs, err
}

func (s *skewed) DeleteFinished(ctx context.Context, cutoff time.Time) (int, error) {
	return s.MemStore.DeleteFinished(ctx, shiftTime(cutoff, s.d))
}

// Replica A runs a task; replica B, whose clock is 10 s behind A's (and
// the store's: leases are not involved), cancels it. The record then
// says the task completed 10 s before it started, and B's observers hear
// of a run whose Duration is negative (workersotel records it in the
// workers.task.duration histogram, and ends the run's span before its
// start on A). A clock that runs a few seconds behind is what the
// design tells users to expect of replicas ("never by comparing the
// replicas' clocks"); an end written from a record another replica
// started must not come before that start.
func TestClockSkewCancelElsewhereEndsBeforeStart(t *testing.T) {
	ctx := t.Context()
	mem := workers.NewMemStore()
	var mu sync.Mutex
	var ends []workers.Event
	obs := workers.ObserverFunc(func(_ context.Context, e workers.Event) {
		if e.Kind == workers.EventFinished || e.Kind == workers.EventRecovered {
			mu.Lock()
			ends = append(ends, e)
			mu.Unlock()
		}
	})
	// B's clock is 10 s behind A's (and the store's).
	a := workers.NewRuntime(mem, workers.Config{Observers: []workers.Observer{obs}})
	b := workers.NewRuntime(&skewed{mem, -10 * time.Second}, workers.Config{Observers: []workers.Observer{obs}})
	defer func() {
		require.NoError(t, a.Shutdown(ctx))
		require.NoError(t, b.Shutdown(ctx))
	}()

	started := make(chan struct{})
	sub, err := a.Submit(ctx, "long", func(ctx context.Context, _ *workers.Task) (any, error) {
		close(started)
		<-ctx.Done()
		return nil, context.Cause(ctx)
	}, owner)
	require.NoError(t, err)
	<-started
	require.NoError(t, b.Cancel(ctx, sub.ID, owner))
	snap, err := a.Wait(ctx, sub.ID, owner)
	require.NoError(t, err)
	require.Equal(t, workers.StatusCancelled, snap.Status)
	assert.False(t, snap.CompletedAt.Before(snap.StartedAt),
		"the record says the task completed at %v, %v before it started at %v",
		snap.CompletedAt, snap.StartedAt.Sub(snap.CompletedAt), snap.StartedAt)
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, ends)
	for _, e := range ends {
		assert.GreaterOrEqual(t, e.Duration, time.Duration(0), "an observer heard of run %s with Duration %v", e.RunID, e.Duration)
	}
}

// Replica A's run outlives A (its lease is released as at a crash:
// Shutdown with no time left, the callback ignoring its cancel);
// replica B, whose clock is 10 s behind A's, recovers it. The recovered
// record completes before it started.
func TestClockSkewRecoveryElsewhereEndsBeforeStart(t *testing.T) {
	ctx := t.Context()
	mem := workers.NewMemStore()
	a := workers.NewRuntime(mem, workers.Config{})
	var mu sync.Mutex
	var recovered []workers.Event
	obs := workers.ObserverFunc(func(_ context.Context, e workers.Event) {
		if e.Kind == workers.EventRecovered {
			mu.Lock()
			recovered = append(recovered, e)
			mu.Unlock()
		}
	})
	b := workers.NewRuntime(&skewed{mem, -10 * time.Second}, workers.Config{Observers: []workers.Observer{obs}}) // 10 s behind A
	defer func() { require.NoError(t, b.Shutdown(ctx)) }()

	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	sub, err := a.Submit(ctx, "long", func(context.Context, *workers.Task) (any, error) {
		defer close(done)
		close(started)
		<-release // ignores its cancel, as a crashed process's run "does"
		return nil, nil
	}, owner)
	require.NoError(t, err)
	<-started
	// A writes nothing more: its Shutdown gives up at once and releases
	// the lease, as a dead replica's lease would expire.
	expired, cancel := context.WithCancel(ctx)
	cancel()
	_ = a.Shutdown(expired)
	defer func() { close(release); <-done }()
	// A Shutdown with no time left may not reach the store to release
	// the lease: release it as its expiry would end it.
	require.NoError(t, mem.ReleaseLease(ctx, workers.InstanceOf(sub.RunID)))

	// B's recovery ends A's run, whose record A left RUNNING; if A's own
	// last write landed first, there is nothing to recover.
	rec, err := mem.GetTask(ctx, sub.ID)
	require.NoError(t, err)
	if rec.Status != workers.StatusRunning {
		t.Skipf("A's shutdown wrote the run's end itself (%s)", rec.Status)
	}
	n, err := b.RecoverZombies(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	snap, err := b.Status(ctx, sub.ID, owner)
	require.NoError(t, err)
	require.Equal(t, workers.CauseAbandoned, snap.Cause)
	assert.False(t, snap.CompletedAt.Before(snap.StartedAt),
		"the recovered record says the task completed %v before it started", snap.StartedAt.Sub(snap.CompletedAt))
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, recovered, 1)
	assert.GreaterOrEqual(t, recovered[0].Duration, time.Duration(0), "EventRecovered's Duration")
}
