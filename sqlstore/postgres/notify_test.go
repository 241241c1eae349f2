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

// firstResync fails t unless the next notice on ch, a listener's first,
// is a Resync.
func firstResync(t *testing.T, ch <-chan workers.Change) {
	t.Helper()
	if c := next(t, ch); !c.Resync {
		t.Fatalf("first notice %+v, want a resync", c)
	}
}

// TestListenReconnects terminates the listening connection's backend: the
// listener reconnects, says Resync, and delivers later notices.
func TestListenReconnectsRepeatedly(t *testing.T) {
	sc := newScratchT(t)
	s := sc.store(t)
	ctx := t.Context()
	ch, stop := listening(t, s)
	firstResync(t, ch)
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
	s := unreachableStore(t)
	err := s.Listen(t.Context(), func(workers.Change) { t.Error("a change without a connection") })
	if err == nil || errors.Is(err, context.Canceled) {
		t.Fatalf("Listen = %v, want a connection error", err)
	}
}
