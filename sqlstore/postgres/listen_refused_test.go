package postgres_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// pendingReads is a store that tells the test each time a GetTask of
// the id it watches finds that record PENDING: a Wait has read it, and
// waits for its next change.
type pendingReads struct {
	*postgres.Store
	id   atomic.Pointer[string]
	read chan struct{}
}

func (s *pendingReads) GetTask(ctx context.Context, id string) (workers.Record, error) {
	rec, err := s.Store.GetTask(ctx, id)
	if p := s.id.Load(); err == nil && p != nil && *p == id && rec.Status == workers.StatusPending {
		select {
		case s.read <- struct{}{}:
		default:
		}
	}
	return rec, err
}

// listeners counts the listener connections on s's channel.
func listeners(t *testing.T, sc scratch, s *postgres.Store) int {
	t.Helper()
	var n int
	if err := sc.pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
		WHERE application_name = 'workers listener' AND position($1 in query) > 0`, postgres.Channel(s)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A runtime whose listener lost its connection, and cannot open another
// (the server refuses new connections, while the pool's work), is not
// listening: a change made elsewhere meanwhile must still reach a Wait on
// one of its runs, by the fallback poll, as it does once Listen returns.
// Here a run waiting for a slot is cancelled by another process; its
// record is CANCELLED, and the Wait in the runtime that holds the run
// should return it.
func TestAWaitOutlivesAListenerThatCannotReconnect(t *testing.T) {
	t.Parallel()
	sc := newScratchT(t)
	sc.store(t) // migrates

	cfg := testConfig(t)
	var refuse atomic.Bool
	var dialer net.Dialer
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if refuse.Load() {
			return nil, &net.OpError{Op: "dial", Net: network, Err: errors.New("refused by the test")}
		}
		return dialer.DialContext(ctx, network, addr)
	}
	sa := &pendingReads{Store: storeOver(t, cfg, postgres.WithSchema(sc.schema)), read: make(chan struct{}, 1)}
	rtA := workers.NewRuntime(sa, workers.Config{Limits: workers.Limits{MaxRunning: 1}})
	alice := workers.MustOwner("alice")
	release := make(chan struct{})
	defer func() {
		refuse.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rtA.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	}()
	defer close(release)
	started := make(chan struct{})
	if _, err := rtA.Submit(t.Context(), "blocker", func(ctx context.Context, _ *workers.Task) (any, error) {
		close(started)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil, nil
	}, alice); err != nil {
		t.Fatal(err)
	}
	<-started
	queued, err := rtA.Submit(t.Context(), "queued", func(context.Context, *workers.Task) (any, error) { return "ran", nil }, alice)
	if err != nil {
		t.Fatal(err)
	}
	// The pool has connections to work with; the listener listens.
	var conns []interface{ Release() }
	for range 4 {
		c, err := sa.Pool().Acquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	waitFor(t, func() bool { return listeners(t, sc, sa.Store) == 1 })

	// The server refuses new connections, and the listener's is ended.
	refuse.Store(true)
	if _, err := sc.pool.Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name = 'workers listener' AND position($1 in query) > 0`, postgres.Channel(sa.Store)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return listeners(t, sc, sa.Store) == 0 })

	// A Wait on the queued run reads it PENDING, and waits.
	sa.id.Store(&queued.ID)
	type result struct {
		snap workers.Snapshot
		err  error
	}
	done := make(chan result, 1)
	waitCtx, stopWait := context.WithTimeout(context.Background(), 20*time.Second)
	waited := false
	defer func() {
		stopWait()
		if !waited {
			<-done
		}
	}()
	go func() {
		snap, err := rtA.Wait(waitCtx, queued.ID, alice)
		done <- result{snap, err}
	}()
	select {
	case <-sa.read:
	case <-time.After(10 * time.Second):
		t.Fatal("the Wait did not read the record")
	}

	// Another process cancels the queued run: its record ends CANCELLED.
	rtB := workers.NewRuntime(sc.store(t), workers.Config{})
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rtB.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	}()
	if err := rtB.Cancel(t.Context(), queued.ID, alice); err != nil {
		t.Fatal(err)
	}
	if snap, err := rtB.Status(t.Context(), queued.ID, alice); err != nil || snap.Status != workers.StatusCancelled {
		t.Fatalf("after the cancel elsewhere the record is %s, %v; want CANCELLED", snap.Status, err)
	}
	cancelledAt := time.Now()

	// Well within the Wait's own bound, and past the fallback poll's
	// interval (a second) several times over.
	select {
	case r := <-done:
		waited = true
		if r.err != nil || r.snap.Status != workers.StatusCancelled {
			t.Fatalf("Wait = %s, %v; want CANCELLED", r.snap.Status, r.err)
		}
		t.Logf("Wait returned %v after the cancel", time.Since(cancelledAt).Round(time.Millisecond))
	case <-time.After(8 * time.Second):
		t.Fatalf("Wait on a run cancelled elsewhere has not returned %v after the record ended CANCELLED: the listener is down, cannot reconnect, and the runtime still counts on its notices", time.Since(cancelledAt).Round(time.Millisecond))
	}
}
