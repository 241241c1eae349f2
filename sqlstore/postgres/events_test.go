package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// TestWatchAcrossProcesses follows a task another runtime runs over the
// same database: Watch and Subscribe learn of its changes through the
// store's notices, and end with its terminal snapshot.
func TestWatchAcrossProcesses(t *testing.T) {
	testDSN(t)
	t.Parallel()
	rt1, rt2 := twoRuntimes(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	alice := workers.MustOwner("alice")
	started, release := make(chan struct{}), make(chan struct{})
	sub, err := rt2.Submit(ctx, "remote", func(ctx context.Context, tk *workers.Task) (any, error) {
		close(started)
		<-release
		return "done", nil
	}, alice)
	if err != nil {
		t.Fatal(err)
	}
	<-started
	subscribed := make(chan struct{})
	subscriberSaw := make(chan workers.Snapshot, 1)
	go func() {
		first := true
		for s, err := range rt1.Subscribe(ctx, alice) {
			if err != nil {
				return
			}
			if first {
				first = false
				close(subscribed)
			}
			if s.ID == sub.ID && s.Status.Terminal() {
				subscriberSaw <- s
				return
			}
		}
	}()
	<-subscribed
	var last workers.Snapshot
	n := 0
	for s, err := range rt1.Watch(ctx, sub.ID, alice) {
		if err != nil {
			t.Fatal(err)
		}
		if n++; n == 1 {
			if s.Status != workers.StatusRunning {
				t.Fatalf("first snapshot %s, want running", s.Status)
			}
			close(release)
		}
		last = s
	}
	if last.Status != workers.StatusCompleted {
		t.Fatalf("Watch ended with %s, want completed", last.Status)
	}
	select {
	case s := <-subscriberSaw:
		if s.RunID != sub.RunID {
			t.Fatalf("Subscribe saw run %s, want %s", s.RunID, sub.RunID)
		}
	case <-ctx.Done():
		t.Fatal("Subscribe never saw the remote task end")
	}
}

// TestCancelReasonIsStored: who cancelled and why survive the round trip
// through the database, read by another runtime.
func TestCancelReasonIsStored(t *testing.T) {
	testDSN(t)
	t.Parallel()
	rt1, rt2 := twoRuntimes(t)
	ctx := t.Context()
	alice, bob := workers.MustOwner("alice"), workers.MustOwner("bob")
	sub, err := rt1.Submit(ctx, "shared", func(ctx context.Context, _ *workers.Task) (any, error) {
		<-ctx.Done()
		return nil, context.Cause(ctx)
	}, alice, workers.WithScope(workers.ScopeGlobal), workers.WithWatchers(bob))
	if err != nil {
		t.Fatal(err)
	}
	if err := rt2.Cancel(ctx, sub.ID, bob, workers.WithReason("duplicate\nof #12")); err != nil {
		t.Fatal(err)
	}
	snap, err := rt1.Status(ctx, sub.ID, alice)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Status != workers.StatusCancelled || snap.CancelledBy != "bob" || snap.CancelReason != "duplicate of #12" {
		t.Fatalf("got %s by %q: %q", snap.Status, snap.CancelledBy, snap.CancelReason)
	}
}

// twoRuntimes returns two runtimes, each over a store handle of its own on
// one fresh schema, as two processes would have; t's cleanup shuts them
// down.
func twoRuntimes(t *testing.T) (*workers.Runtime[*postgres.Store], *workers.Runtime[*postgres.Store]) {
	t.Helper()
	sc := newScratchT(t)
	rt1 := workers.NewRuntime(sc.store(t), workers.Config{})
	rt2 := workers.NewRuntime(sc.store(t), workers.Config{})
	for _, rt := range []*workers.Runtime[*postgres.Store]{rt1, rt2} {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := rt.Shutdown(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	return rt1, rt2
}
