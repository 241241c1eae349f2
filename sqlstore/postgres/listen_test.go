package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// Listen reports a Resync once it listens, then a notice for each
// committed change made through any handle on the tables; after its
// connection is killed it reconnects and reports a Resync again; and it
// returns ctx's error when ctx ends.
func TestListen(t *testing.T) {
	t.Parallel()
	sc := newScratchT(t)
	listener, writer := sc.store(t), sc.store(t)
	changes := make(chan workers.Change, 64)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- listener.Listen(ctx, func(c workers.Change) { changes <- c })
	}()
	next := func(what string) workers.Change {
		t.Helper()
		select {
		case c := <-changes:
			return c
		case <-time.After(10 * time.Second):
			t.Fatalf("no notice: want %s", what)
			return workers.Change{}
		}
	}
	if c := next("a resync at start"); !c.Resync {
		t.Fatalf("first notice %+v, want a resync", c)
	}

	at := time.Now().UTC().Truncate(time.Microsecond)
	rec := workers.Record{ID: "alice::k", RunID: "inst.1", CreatedAt: at, State: workers.State{Status: workers.StatusPending}}
	if err := writer.InsertTask(t.Context(), rec); err != nil {
		t.Fatal(err)
	}
	if c := next("the insert"); c != (workers.Change{ID: rec.ID, RunID: "inst.1", Status: workers.StatusPending}) {
		t.Errorf("insert notice %+v", c)
	}
	ok, err := writer.TransitionTask(t.Context(), rec.ID, "inst.1", []workers.Status{workers.StatusPending},
		workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: at})
	if err != nil || !ok {
		t.Fatalf("TransitionTask = %v, %v", ok, err)
	}
	if c := next("the transition"); c.ID != rec.ID || c.Status != workers.StatusRunning {
		t.Errorf("transition notice %+v", c)
	}
	if ok, err := writer.AddWatcher(t.Context(), rec.ID, "inst.1", "bob"); err != nil || !ok {
		t.Fatalf("AddWatcher = %v, %v", ok, err)
	}
	if c := next("the watcher"); c.ID != rec.ID {
		t.Errorf("watcher notice %+v", c)
	}

	// Kill the listener's connection: it comes back with a resync.
	if _, err := sc.pool.Exec(t.Context(),
		`SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name = 'workers listener' AND query LIKE '%' || $1 || '%'`,
		listener.Channel()); err != nil {
		t.Fatal(err)
	}
	if c := next("a resync after the reconnect"); !c.Resync {
		t.Fatalf("after the kill: %+v, want a resync", c)
	}
	if err := writer.SetTask(t.Context(), workers.Record{ID: rec.ID, State: workers.State{Status: workers.StatusRunning, Progress: 50, Attempt: 1, StartedAt: at}}); err != nil {
		t.Fatal(err)
	}
	if c := next("a change after the reconnect"); c.ID != rec.ID {
		t.Errorf("notice after the reconnect %+v", c)
	}

	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Listen after ctx ended = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Listen did not return when its ctx ended")
	}
}
