package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// A failover to a replica that lacks the record of a task waiting for a
// slot under Limits ends the Wait and the Watch on it with ErrNotFound,
// though no notice announces a row that is simply not there: the
// listener's reconnect to the new primary re-reads the runs waiting for
// their turn, and the run is taken out of its wait rather than holding
// its waiting place until its turn. The run never starts. The
// failover is the record's delete, which no trigger announces, and the
// end of the listener's connection.
func TestAFailoverEndsAWaitingRunWhoseRecordIsNotThere(t *testing.T) {
	testDSN(t)
	t.Parallel()
	sc := newScratchT(t)
	store := sc.store(t)
	rt := workers.NewRuntime(store, workers.Config{SyncInterval: time.Hour, Limits: workers.Limits{MaxRunning: 1, MaxWaiting: 1}})
	shutdownAtCleanup(t, rt)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	alice := workers.MustOwner("alice")
	started, release := make(chan struct{}), make(chan struct{})
	blocker, err := rt.Submit(ctx, "blocker", func(ctx context.Context, _ *workers.Task) (any, error) {
		close(started)
		<-release // holds the one slot, whatever happens
		return "done", nil
	}, alice)
	if err != nil {
		t.Fatal(err)
	}
	defer close(release)
	<-started
	ran := make(chan struct{}, 1)
	queued, err := rt.Submit(ctx, "queued", func(context.Context, *workers.Task) (any, error) {
		ran <- struct{}{}
		return "ran", nil
	}, alice)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return listeners(t, sc, store) == 1 })
	waited := make(chan error, 1)
	go func() {
		_, err := rt.Wait(ctx, queued.ID, alice)
		waited <- err
	}()
	watched := make(chan error, 1)
	go func() {
		var last error
		for _, err := range rt.Watch(ctx, queued.ID, alice) {
			last = err
		}
		watched <- last
	}()
	sc.vanish(t, `id = $1`, queued.ID)
	if _, err := sc.pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name = 'workers listener' AND position($1 in query) > 0`, postgres.Channel(store)); err != nil {
		t.Fatal(err)
	}
	for what, ch := range map[string]chan error{"Wait": waited, "Watch": watched} {
		select {
		case err := <-ch:
			if !errors.Is(err, workers.ErrNotFound) {
				t.Errorf("%s ended with %v, want ErrNotFound", what, err)
			}
		case <-ctx.Done():
			t.Fatalf("%s never ended", what)
		}
	}
	// The waiting place the run held is free: another task may wait.
	waitFor(t, func() bool {
		_, err := rt.Submit(ctx, "next", func(context.Context, *workers.Task) (any, error) { return "next", nil }, alice)
		var qe *workers.QuotaError
		if err != nil && !errors.As(err, &qe) {
			t.Fatal(err)
		}
		return err == nil
	})
	if snap, err := rt.Status(ctx, blocker.ID, alice); err != nil || snap.Status != workers.StatusRunning {
		t.Fatalf("the blocker: %+v, %v", snap, err)
	}
	select {
	case <-ran:
		t.Fatal("the run whose record is not there started")
	default:
	}
}
