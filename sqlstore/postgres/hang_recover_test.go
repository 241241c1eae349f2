package postgres_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// heal ends the hang: every connection open now is closed (as a partition
// that healed resets them), and connections made from now on pass.
func (f *freezer) heal() {
	f.frozenFromTheStart.Store(false)
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.conns {
		c.Close()
	}
}

// A database that hangs for longer than the lease costs the runtime its
// lease and its runs (abandoned), and nothing more: once it answers
// again, the abandoned run's record ends, a new submission runs, and
// Shutdown settles everything.
func TestARuntimeComesBackAfterTheDatabaseHungPastItsLease(t *testing.T) {
	testDSN(t)
	s, px := hungStore(t)
	logs := &lockedBuffer{}
	rt := workers.NewRuntime(s, workers.Config{LeaseInterval: 100 * time.Millisecond, LeaseTTL: time.Second,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err := rt.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	alice := workers.MustOwner("alice")
	cause := make(chan error, 1)
	started := make(chan struct{})
	sub, err := rt.Submit(t.Context(), "long", func(ctx context.Context, _ *workers.Task) (any, error) {
		close(started)
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return nil, context.Cause(ctx)
	}, alice)
	if err != nil {
		t.Fatal(err)
	}
	<-started
	px.hang()
	select {
	case err := <-cause:
		if !errors.Is(err, workers.ErrAbandoned) {
			t.Fatalf("the run was cancelled with %v, want ErrAbandoned", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the run was not abandoned while renewals hung past the lease")
	}
	px.heal()

	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		snap, err := rt.Status(ctx, sub.ID, alice)
		cancel()
		if err == nil && snap.Status.Terminal() {
			if !errors.Is(snap.Err(), workers.ErrAbandoned) {
				t.Errorf("the abandoned run ended %s (%v)", snap.Status, snap.Err())
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the abandoned run's record is still %s (%v) 15s after the database answers again\n%s", snap.Status, err, logs)
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var next workers.Submission
	for {
		next, err = rt.Submit(ctx, "after", func(context.Context, *workers.Task) (any, error) { return "ok", nil }, alice)
		if err == nil || ctx.Err() != nil {
			break
		}
		t.Logf("Submit after the hang: %v", err)
		time.Sleep(50 * time.Millisecond) // polling with a deadline
	}
	if err != nil {
		t.Fatalf("Submit 10s after the database answers again: %v", err)
	}
	snap, err := rt.Wait(ctx, next.ID, alice)
	if err != nil || snap.Status != workers.StatusCompleted {
		t.Fatalf("the run after the hang: %v, %v", snap.Status, err)
	}
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	if err := rt.Shutdown(sctx); err != nil {
		t.Errorf("Shutdown after the hang: %v", err)
	}
}
