package sqltest

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// RunReplicas runs the replica tests against b in this process: runtimes
// that are separate instances over store handles of their own, as
// replicas of a service are, on one database per test.
func RunReplicas(t *testing.T, b Backend) {
	for _, c := range []struct {
		name string
		test func(t *testing.T, open Opener)
	}{
		{"RollingDeployDrainsSoftly", rollingDeploy},
		{"SlowRenewalsKeepTheLease", slowRenewals},
		{"StalledReplicaIsRecoveredAndFencedOut", stalledReplica},
		{"CancelDuringAProgressWriteReachesTheRun", cancelDuringProgressWrite},
		{"CancelBeforeTheRunIsKnownKeepsItsCallbackFromStarting", cancelBeforePublish},
		{"SoakOfRestartsAndCancels", nil}, // run with b.Fault, below
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			env := b.NewDB(t)
			getenv := func(name string) string { return lookup(env, name) }
			if c.test != nil {
				c.test(t, b.Open(getenv))
				return
			}
			var fault func(context.Context)
			if b.Fault != nil {
				fault = b.Fault(t, getenv)
			}
			soakOfRestartsAndCancels(t, b.Open(getenv), fault)
		})
	}
}

// replica opens a handle on the database and a runtime over it, both
// closed in t's cleanup; wrap, if not nil, wraps the handle.
func replica(t *testing.T, open Opener, cfg workers.Config, wrap func(workers.Store) workers.Store) *workers.Runtime[workers.Store] {
	t.Helper()
	s, closeStore, err := open(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeStore)
	if wrap != nil {
		s = wrap(s)
	}
	rt := workers.NewRuntime(s, cfg)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		_ = rt.Shutdown(ctx) // a no-op after the test's own Shutdown
	})
	if err := rt.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	return rt
}

// rollingDeploy: replica A runs tasks of 0.1 to 2 s, replica B starts,
// and A shuts down with 5 s: every task ends COMPLETED within A's grace,
// none is lost or left live, and B can read them all.
func rollingDeploy(t *testing.T, open Opener) {
	// The drain is what is tested here, not the lease: a TTL of seconds,
	// so that a database slowed by the other tests sharing it does not
	// cost A its lease (and its runs) in the middle of the deploy.
	cfg := workers.Config{LeaseInterval: 50 * time.Millisecond, LeaseTTL: 3 * time.Second}
	a := replica(t, open, cfg, nil)
	alice := workers.MustOwner("alice")
	var ids []string
	for i := range 8 {
		d := 100*time.Millisecond + time.Duration(i)*270*time.Millisecond // 0.1 s to 2 s
		sub, err := a.Submit(t.Context(), "deploy-"+strconv.Itoa(i), func(ctx context.Context, _ *workers.Task) (any, error) {
			select {
			case <-time.After(d):
				return "done", nil
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		}, alice)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sub.ID)
	}
	b := replica(t, open, cfg, nil)

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := a.Shutdown(ctx); err != nil {
		t.Fatalf("A's Shutdown: %v", err)
	}
	for _, id := range ids {
		snap, err := b.Status(t.Context(), id, alice)
		if err != nil {
			t.Fatal(err)
		}
		if snap.Status != workers.StatusCompleted {
			t.Errorf("%s after the deploy: %s (%s), want COMPLETED within the grace", id, snap.Status, snap.Error)
		}
	}
}

// stallingLeaser delays every lease renewal of the store it wraps by a
// settable duration. It is a Leaser, and no Notifier: the replica it
// serves polls.
type stallingLeaser struct {
	workers.Store
	l     workers.Leaser
	delay atomic.Int64 // nanoseconds
}

func stalling(s workers.Store) workers.Store {
	return &stallingLeaser{Store: s, l: s.(workers.Leaser)}
}

func (s *stallingLeaser) RenewLease(ctx context.Context, instance string, ttl time.Duration) (bool, error) {
	if d := time.Duration(s.delay.Load()); d > 0 {
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	return s.l.RenewLease(ctx, instance, ttl)
}

func (s *stallingLeaser) ReleaseLease(ctx context.Context, instance string) error {
	return s.l.ReleaseLease(ctx, instance)
}

func (s *stallingLeaser) LiveInstances(ctx context.Context) ([]string, error) {
	return s.l.LiveInstances(ctx)
}

// The lease of the stall tests: renewed every 100 ms, expiring after 1 s.
const (
	stallInterval = 100 * time.Millisecond
	stallTTL      = time.Second
)

// blockedUntil returns a callback that runs until release is closed and
// then returns a result, whatever its context says; it closes started
// when it starts.
func blockedUntil(started, release chan struct{}) workers.Func {
	return func(ctx context.Context, _ *workers.Task) (any, error) {
		close(started)
		<-release
		return "late", nil
	}
}

// slowRenewals: renewals slower than the interval, each landing before
// the lease's end counted from the start of the one before, keep it: a
// peer's recovery loop, over many rounds, recovers nothing, and the slow
// replica abandons nothing.
func slowRenewals(t *testing.T, open Opener) {
	cfg := workers.Config{LeaseInterval: stallInterval, LeaseTTL: stallTTL}
	var slow *stallingLeaser
	a := replica(t, open, cfg, func(s workers.Store) workers.Store { x := stalling(s); slow = x.(*stallingLeaser); return x })
	replica(t, open, cfg, nil) // the peer, recovering every interval
	started, release := make(chan struct{}), make(chan struct{})
	sub, err := a.Submit(t.Context(), "slow-lease", blockedUntil(started, release), workers.MustOwner("alice"))
	if err != nil {
		t.Fatal(err)
	}
	recv(t, started, "the run starting")
	// Each renewal lands 0.2 s after it began, twice the interval; the
	// next, begun as it lands, lands 0.6 s short of the end of the lease
	// the one before it renewed (a renewal may take what is left of that,
	// and no more), which leaves room for a loaded machine, where the
	// store's own commit may take a few hundred milliseconds.
	slow.delay.Store(int64((stallTTL - 600*time.Millisecond) / 2))
	deadline := time.Now().Add(4 * stallTTL)
	for time.Now().Before(deadline) {
		snap, err := a.Status(t.Context(), sub.ID, workers.System)
		if err != nil {
			t.Fatal(err)
		}
		if snap.Status != workers.StatusRunning {
			t.Fatalf("with slow renewals the run became %s (%s), want RUNNING", snap.Status, snap.Error)
		}
		time.Sleep(stallInterval) // rounds of the loops, not a wait for a condition
	}
	close(release)
	snap := settledIn(t, a, sub.ID)
	if snap.Status != workers.StatusCompleted {
		t.Errorf("released, the run ended %s (%s), want COMPLETED", snap.Status, snap.Error)
	}
}

// stalledReplica: renewals stalled past expiry lose the lease: the peer
// recovers the stalled replica's run (FAILED, abandoned), the stalled
// replica cancels its own run with ErrAbandoned, and the result its
// callback returns afterwards is fenced out.
func stalledReplica(t *testing.T, open Opener) {
	cfg := workers.Config{LeaseInterval: stallInterval, LeaseTTL: stallTTL}
	var slow *stallingLeaser
	a := replica(t, open, cfg, func(s workers.Store) workers.Store { x := stalling(s); slow = x.(*stallingLeaser); return x })
	b := replica(t, open, cfg, nil)
	alice := workers.MustOwner("alice")
	cancelled := make(chan error, 1)
	started, release := make(chan struct{}), make(chan struct{})
	sub, err := a.Submit(t.Context(), "stalled", func(ctx context.Context, tk *workers.Task) (any, error) {
		go func() { <-ctx.Done(); cancelled <- context.Cause(ctx) }()
		return blockedUntil(started, release)(ctx, tk)
	}, alice)
	if err != nil {
		t.Fatal(err)
	}
	recv(t, started, "the run starting")
	slow.delay.Store(int64(10 * stallTTL))

	eventually(t, "the peer recovers the stalled run", func() (bool, error) {
		snap, err := b.Status(t.Context(), sub.ID, alice)
		return snap.Status.Terminal(), err
	})
	recovered, err := b.Status(t.Context(), sub.ID, alice)
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(recovered.Err(), workers.ErrAbandoned) {
		t.Errorf("recovered as %s (%v), want abandoned", recovered.Status, recovered.Err())
	}
	if cause := recv(t, cancelled, "the stalled replica cancelling its run"); !errors.Is(cause, workers.ErrAbandoned) {
		t.Errorf("the stalled run's context ended with %v, want ErrAbandoned", cause)
	}
	close(release)
	slow.delay.Store(0)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_ = a.Shutdown(ctx) // waits for the run's late write
	final, err := b.Status(t.Context(), sub.ID, alice)
	if err != nil {
		t.Fatal(err)
	}
	if final.Status != recovered.Status || final.Cause != recovered.Cause || final.Error != recovered.Error ||
		!final.CompletedAt.Equal(recovered.CompletedAt) || final.Result != nil {
		t.Errorf("the stalled run's late write landed: %+v, was %+v", final, recovered)
	}
}

// settledIn waits until id's record is terminal and returns it.
func settledIn(t *testing.T, rt *workers.Runtime[workers.Store], id string) workers.Snapshot {
	t.Helper()
	var snap workers.Snapshot
	eventually(t, id+" ending", func() (bool, error) {
		var err error
		snap, err = rt.Status(t.Context(), id, workers.System)
		return snap.Status.Terminal(), err
	})
	return snap
}
