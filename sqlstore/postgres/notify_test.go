package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// listening runs s.Listen until the test ends; its changes arrive on the
// returned channel, and stop ends it and returns its error.
func listening(t *testing.T, s *postgres.Store) (changes <-chan workers.Change, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	ch := make(chan workers.Change, 1024)
	done := make(chan error, 1)
	go func() {
		done <- s.Listen(ctx, func(c workers.Change) {
			select {
			case ch <- c:
			default:
				t.Error("notice buffer full")
			}
		})
	}()
	var err error
	stopped := false
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			err = <-done
		}
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return ch, stop
}

// next returns the next change, failing the test after a few seconds.
func next(t *testing.T, ch <-chan workers.Change) workers.Change {
	t.Helper()
	select {
	case c := <-ch:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no notice within 10s")
		return workers.Change{}
	}
}

// nextFor returns the next change about id that names a status (or a
// Resync), skipping the rest: an added watcher's notice names only its
// task.
func nextFor(t *testing.T, ch <-chan workers.Change, id string) workers.Change {
	t.Helper()
	for {
		if c := next(t, ch); (c.ID == id && c.Status != "") || c.Resync {
			return c
		}
	}
}

// nextResync returns once a Resync arrives, skipping other changes.
func nextResync(t *testing.T, ch <-chan workers.Change) {
	t.Helper()
	for !next(t, ch).Resync {
	}
}

func TestListen(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	ch, stop := listening(t, s)
	if c := next(t, ch); !c.Resync {
		t.Fatalf("first change = %+v, want the Resync sent once listening", c)
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	rec := workers.Record{ID: "a::k", RunID: "inst.1", Watchers: []string{"a"}, CreatedAt: now,
		State: workers.State{Status: workers.StatusPending, Attempt: 1}}
	if err := s.InsertTask(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if c := nextFor(t, ch, rec.ID); c != (workers.Change{ID: rec.ID, RunID: "inst.1", Status: workers.StatusPending}) {
		t.Fatalf("after insert: %+v", c)
	}
	if ok, err := s.TransitionTask(ctx, rec.ID, rec.RunID, []workers.Status{workers.StatusPending},
		workers.State{Status: workers.StatusCancelled, Attempt: 1, CompletedAt: now, Error: "stop"}); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if c := nextFor(t, ch, rec.ID); c != (workers.Change{ID: rec.ID, RunID: "inst.1", Status: workers.StatusCancelled}) {
		t.Fatalf("after transition: %+v", c)
	}
	// A write that changes nothing sends nothing; the next one that does
	// arrives next.
	if ok, err := s.TransitionTask(ctx, rec.ID, "other.1", []workers.Status{workers.StatusPending},
		workers.State{Status: workers.StatusFailed}); ok || err != nil {
		t.Fatal(ok, err)
	}
	if ok, err := s.AddWatcher(ctx, rec.ID, rec.RunID, "b"); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if c := next(t, ch); c != (workers.Change{ID: rec.ID}) {
		t.Fatalf("after a fenced-out transition and a watcher: %+v, want the watcher's id-only notice", c)
	}
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Listen returned %v, want context.Canceled", err)
	}
}

// TestListenReconnects terminates the listening connection's backend: the
// listener reconnects, says Resync, and delivers later notices.
func TestListenReconnects(t *testing.T) {
	sc := newScratchT(t)
	s := sc.store(t)
	ctx := t.Context()
	ch, stop := listening(t, s)
	if c := next(t, ch); !c.Resync {
		t.Fatalf("first change = %+v, want Resync", c)
	}
	for round := range 3 {
		terminateListeners(t, sc.pool)
		nextResync(t, ch)
		id := "a::k" + string(rune('0'+round))
		if err := s.InsertTask(ctx, workers.Record{ID: id, RunID: "inst.1", Watchers: []string{"a"},
			CreatedAt: time.Now(), State: workers.State{Status: workers.StatusPending}}); err != nil {
			t.Fatal(err)
		}
		if c := nextFor(t, ch, id); c.ID != id {
			t.Fatalf("round %d: after reconnecting: %+v", round, c)
		}
	}
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Listen returned %v, want context.Canceled", err)
	}
}

// terminateListeners ends every backend listening in this database,
// and waits until one was ended.
func terminateListeners(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := pool.QueryRow(t.Context(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE 'LISTEN %'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no listening backend to terminate")
		}
		select {
		case <-t.Context().Done():
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestListenFailsWithoutServer: Listen reports a first connection that
// fails rather than retrying it for ever.
func TestListenFailsWithoutServer(t *testing.T) {
	testDSN(t)
	pool, err := pgxpool.New(t.Context(), "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := postgres.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.Listen(t.Context(), func(workers.Change) { t.Error("a change without a connection") })
	if err == nil || errors.Is(err, context.Canceled) {
		t.Fatalf("Listen = %v, want a connection error", err)
	}
}
