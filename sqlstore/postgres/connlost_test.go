package postgres_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// A read that finds its pooled connection ended by the server (as a
// restart or an operator ends every idle backend) is made again on
// another: GetTask and ListTasks answer, where they used to fail once per
// dead connection.
func TestReadsRideOutEndedConnections(t *testing.T) {
	sc := newScratchT(t)
	s, app := sc.namedStore(t, "workers-connlost")
	ctx := t.Context()
	pending := workers.State{Status: workers.StatusPending}
	if err := s.InsertTask(ctx, workers.Record{ID: "u::t", RunID: "run-1", Watchers: []string{"u"}, CreatedAt: time.Now(), State: pending}); err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		// Open several connections and leave them idle.
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				if _, err := s.ListTasks(ctx, workers.Filter{}); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		ended := endConnections(t, sc, app)
		if ended == 0 {
			t.Fatalf("round %d: no connection of the store to end", round)
		}
		if round%2 == 0 {
			if _, err := s.GetTask(ctx, "u::t"); err != nil {
				t.Fatalf("round %d, %d connections ended: GetTask: %v", round, ended, err)
			}
		} else if recs, err := s.ListTasks(ctx, workers.Filter{VisibleTo: "u"}); err != nil || len(recs) != 1 {
			t.Fatalf("round %d, %d connections ended: ListTasks = %d records, %v", round, ended, len(recs), err)
		}
	}
}

// needIdleSessionTimeout skips t on a server before PostgreSQL 14, which
// has no idle_session_timeout.
func needIdleSessionTimeout(t *testing.T, sc scratch) {
	t.Helper()
	var version int
	if err := sc.pool.QueryRow(t.Context(), `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version < 140000 {
		t.Skip("idle_session_timeout needs PostgreSQL 14")
	}
}

// A connection the server ends for idle_session_timeout (SQLSTATE 57P05,
// a FATAL error, as any that ends the session) is lost like one an
// operator ended (57P01): a read made on it goes again on another, and
// a write fails with ErrUnavailable, for the runtime to make again.
func TestAConnectionEndedForIdlingIsLost(t *testing.T) {
	sc := newScratchT(t)
	needIdleSessionTimeout(t, sc)
	sc.store(t) // migrates
	app := "workers-idle-" + strings.ToLower(rand.Text())
	s := sc.ownStore(t, map[string]string{"application_name": app, "idle_session_timeout": "200ms"})
	ctx := t.Context()
	insertPending(t, s, "run-1", "u::a")
	ended := func() {
		t.Helper()
		waitFor(t, func() bool { // the server ends the pool's idle connection
			var n int
			err := sc.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n)
			return err == nil && n == 0
		})
	}
	ended()
	if _, err := s.GetTask(ctx, "u::a"); err != nil {
		t.Errorf("GetTask on a connection ended for idling: %v; want the read made again", err)
	}
	ended()
	running := workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: time.Now()}
	if _, err := s.TransitionTask(ctx, "u::a", "run-1", []workers.Status{workers.StatusPending}, running); err != nil && !errors.Is(err, workers.ErrUnavailable) {
		t.Errorf("TransitionTask on a connection ended for idling: %v; want ErrUnavailable", err)
	}
}

// A FATAL error in connecting that says nothing of the server's
// availability (here a database that does not exist) is not a lost
// connection: the store does not take it for a blip (ErrUnavailable),
// which the runtime and a caller would try again.
func TestAMissingDatabaseIsNotUnavailable(t *testing.T) {
	cfg := testConfig(t)
	cfg.ConnConfig.Database = "workers_no_such_database_" + strings.ToLower(rand.Text())
	_, err := storeOver(t, cfg).GetTask(t.Context(), "u::t")
	if err == nil || errors.Is(err, workers.ErrUnavailable) {
		t.Fatalf("GetTask on a database that does not exist: %v, want an error that is not ErrUnavailable", err)
	}
	if !strings.Contains(err.Error(), "3D000") {
		t.Fatalf("GetTask on a database that does not exist: %v, want the server's refusal (3D000)", err)
	}
}

// endConnections ends every backend whose application name is app, as a
// restart or an operator would, waits until the server has let them go,
// and returns how many it ended.
func endConnections(t *testing.T, sc scratch, app string) int {
	t.Helper()
	var pids []int32
	if err := sc.pool.QueryRow(t.Context(),
		`SELECT coalesce(array_agg(pid), '{}') FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&pids); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.pool.Exec(t.Context(), `SELECT pg_terminate_backend(p) FROM unnest($1::int[]) p`, pids); err != nil {
		t.Fatal(err)
	}
	// Only the connections ended: one the store dials meanwhile (an
	// announce of new tasks made again, say) is not waited for.
	waitFor(t, func() bool {
		var n int
		err := sc.pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, pids).Scan(&n)
		return err == nil && n == 0
	})
	return len(pids)
}

// A write that finds its pooled connection ended by the server resets the
// pool, here the one New was given: its idle connections, dead alike, are
// closed, and the next write dials a new one, where each write used to
// fail in turn on the next dead one. (A registering write that fails so
// is made again by the runtime, at most three times.)
func TestAWriteOnAnEndedConnectionResetsThePool(t *testing.T) {
	sc := newScratchT(t)
	cfg := testConfig(t)
	app := "workers-reset-" + strings.ToLower(rand.Text())
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.MaxConns = 8
	// The pool pings a connection idle for over a second before lending
	// it, which on a slow machine would find a dead one first: here only
	// a statement finds it, as on a busy pool.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	s := storeOver(t, cfg, postgres.WithSchema(sc.schema))
	ctx := t.Context()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// Open six connections and leave them idle.
	conns := make([]*pgxpool.Conn, 6)
	for i := range conns {
		c, err := s.Pool().Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	for _, c := range conns {
		c.Release()
	}
	if ended := endConnections(t, sc, app); ended < len(conns) {
		t.Fatalf("%d connections ended, want %d", ended, len(conns))
	}
	failed := 0
	for i := range len(conns) + 1 {
		err := s.InsertTask(ctx, workers.Record{ID: fmt.Sprintf("u::t%d", i), RunID: "run-1", Watchers: []string{"u"},
			CreatedAt: time.Now(), State: workers.State{Status: workers.StatusPending}})
		if err == nil {
			break
		}
		if !errors.Is(err, workers.ErrUnavailable) {
			t.Fatalf("write %d: %v, want an error wrapping ErrUnavailable", i, err)
		}
		failed++
	}
	if failed != 1 {
		t.Fatalf("%d writes failed on ended connections, want 1: the first, whose failure resets the pool", failed)
	}
}

// A connection the pool could not dial (the server down a moment, or its
// name not resolving) says nothing of those the pool holds: they are
// kept, and serve the next statements.
func TestAFailedDialDoesNotResetThePool(t *testing.T) {
	sc := newScratchT(t)
	cfg := testConfig(t)
	cfg.MaxConns = 3
	var refuse atomic.Bool
	var dialer net.Dialer
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if refuse.Load() {
			return nil, &net.OpError{Op: "dial", Net: network, Err: errors.New("refused by the test")}
		}
		return dialer.DialContext(ctx, network, addr)
	}
	s := storeOver(t, cfg, postgres.WithSchema(sc.schema))
	ctx := t.Context()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// Hold two connections of the pool, which the next statement would
	// need a third beside, and make dials fail. (No insert here: its
	// notices, sent after it returns, would take a connection.)
	s.Pool().Reset()
	var held []*pgxpool.Conn
	release := func() {
		for _, c := range held {
			c.Release()
		}
		held = nil
	}
	defer release()
	for range 2 {
		c, err := s.Pool().Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	refuse.Store(true)
	if _, err := s.GetTask(ctx, "u::t"); !errors.Is(err, workers.ErrUnavailable) {
		t.Fatalf("GetTask with no connection to be had: %v, want an error wrapping ErrUnavailable", err)
	}
	release()
	if _, err := s.GetTask(ctx, "u::t"); !errors.Is(err, workers.ErrNotFound) {
		t.Fatalf("GetTask on the connections the pool held: %v, want ErrNotFound", err)
	}
}

// unreachableStore returns a store over a pool whose database nothing
// answers: no server listens at its address.
func unreachableStore(t *testing.T) *postgres.Store {
	t.Helper()
	cfg, err := pgxpool.ParseConfig("postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	return storeOver(t, cfg)
}

// A store whose database cannot be reached fails each call with an
// error that wraps workers.ErrUnavailable, which an HTTP handler answers
// as 503; a runtime over it says so too. The test needs no server.
func TestUnreachableDatabaseIsUnavailable(t *testing.T) {
	s := unreachableStore(t)
	if _, err := s.GetTask(t.Context(), "u::t"); !errors.Is(err, workers.ErrUnavailable) {
		t.Fatalf("GetTask: %v, want an error wrapping ErrUnavailable", err)
	}
	rt := workers.NewRuntime(s, workers.Config{Logger: slog.New(slog.DiscardHandler)})
	_, err := rt.Submit(t.Context(), "k", func(context.Context, *workers.Task) (any, error) { return nil, nil }, workers.MustOwner("u"))
	if !errors.Is(err, workers.ErrUnavailable) {
		t.Fatalf("Submit: %v, want an error wrapping ErrUnavailable", err)
	}
	if err := rt.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
}
