package postgres_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// hungStore returns a migrated store in a scratch schema whose pool
// reaches the database through a freezer.
func hungStore(t *testing.T) (*postgres.Store, *freezer) {
	t.Helper()
	return hungStoreIn(t, newScratchT(t))
}

// hungStoreIn is hungStore in sc's schema.
func hungStoreIn(t *testing.T, sc scratch) (*postgres.Store, *freezer) {
	t.Helper()
	cfg := testConfig(t)
	px := newFreezer(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = px.host, px.port, nil
	cfg.MinConns = 0
	s := storeOver(t, cfg, postgres.WithSchema(sc.schema), postgres.WithListenCheck(50*time.Millisecond, 500*time.Millisecond))
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Before the pool closes, whose closing of a frozen connection would
	// wait for the server's answer to its goodbye.
	t.Cleanup(px.heal)
	return s, px
}

// hang makes the database behind px stop answering: every connection,
// open or made from now on, stays open and carries nothing.
func (f *freezer) hang() {
	f.frozenFromTheStart.Store(true)
	f.freeze()
}

// Every call a user makes on a runtime whose database hangs (accepts
// connections, answers nothing) returns within its context, and
// Shutdown within its own plus the documented slack.
func TestCallsAndShutdownAreBoundedWhileTheDatabaseHangs(t *testing.T) {
	testDSN(t)
	s, px := hungStore(t)
	callsAndShutdownBounded(t, s, px.hang)
}

// The same while another transaction holds the tasks table locked
// (LOCK TABLE ... IN ACCESS EXCLUSIVE MODE): every statement on it waits.
func TestCallsAndShutdownAreBoundedWhileTheTableIsLocked(t *testing.T) {
	testDSN(t)
	sc := newScratchT(t)
	s := sc.store(t)
	callsAndShutdownBounded(t, s, func() {
		conn, err := pgx.Connect(t.Context(), testDSN(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		tx, err := conn.Begin(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		if _, err := tx.Exec(t.Context(), `LOCK TABLE "`+sc.schema+`".workers_tasks IN ACCESS EXCLUSIVE MODE`); err != nil {
			t.Fatal(err)
		}
	})
}

func callsAndShutdownBounded(t *testing.T, s *postgres.Store, hang func()) {
	rt := workers.NewRuntime(s, workers.Config{})
	if err := rt.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	alice := workers.MustOwner("alice")
	release := make(chan struct{})
	var started sync.WaitGroup
	var ids []string
	for i := range 3 {
		started.Add(1)
		sub, err := rt.Submit(t.Context(), "run-"+strconv.Itoa(i), func(ctx context.Context, _ *workers.Task) (any, error) {
			started.Done()
			<-release
			return "done", nil
		}, alice)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sub.ID)
	}
	qstarted := make(chan struct{})
	for i := range 3 {
		_, err := rt.SubmitSequential(t.Context(), "q", "item-"+strconv.Itoa(i), func(ctx context.Context, _ *workers.Task) (any, error) {
			if i == 0 {
				close(qstarted)
			}
			<-release
			return "done", nil
		}, alice)
		if err != nil {
			t.Fatal(err)
		}
	}
	started.Wait()
	<-qstarted

	hang()
	close(release) // the outcomes' writes meet the hung database

	const bound = 300 * time.Millisecond
	const slack = 1500 * time.Millisecond
	check := func(name string, f func(ctx context.Context) error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		begin := time.Now()
		done := make(chan error, 1)
		go func() { done <- f(ctx) }()
		select {
		case err := <-done:
			took := time.Since(begin)
			t.Logf("%s returned after %v: %v", name, took.Round(time.Millisecond), err)
			if took > bound+slack {
				t.Errorf("%s took %v with a context of %v", name, took, bound)
			}
		case <-time.After(bound + 10*time.Second):
			t.Errorf("%s still blocked %v after its context of %v ended", name, 10*time.Second, bound)
		}
	}
	check("Status", func(ctx context.Context) error { _, err := rt.Status(ctx, ids[0], alice); return err })
	check("List", func(ctx context.Context) error { _, err := rt.List(ctx, alice); return err })
	check("Wait", func(ctx context.Context) error { _, err := rt.Wait(ctx, ids[0], alice); return err })
	check("Cancel", func(ctx context.Context) error { return rt.Cancel(ctx, ids[1], alice) })
	check("Submit", func(ctx context.Context) error {
		_, err := rt.Submit(ctx, "new", func(context.Context, *workers.Task) (any, error) { return nil, nil }, alice)
		return err
	})
	check("SubmitSequential", func(ctx context.Context) error {
		_, err := rt.SubmitSequential(ctx, "q", "new", func(context.Context, *workers.Task) (any, error) { return nil, nil }, alice)
		return err
	})
	check("Watch", func(ctx context.Context) error {
		for _, err := range rt.Watch(ctx, ids[2], alice) {
			if err != nil {
				return err
			}
		}
		return nil
	})
	check("RecoverZombies", func(ctx context.Context) error { _, err := rt.RecoverZombies(ctx); return err })

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	begin := time.Now()
	err := rt.Shutdown(ctx)
	took := time.Since(begin)
	t.Logf("Shutdown returned after %v: %v", took, err)
	if took > time.Second+time.Second {
		t.Errorf("Shutdown with a context of 1s took %v while the database hangs", took)
	}
	if se, ok := errors.AsType[*workers.ShutdownError](err); !ok || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown: %v (%T), want a *ShutdownError wrapping DeadlineExceeded", err, se)
	}
}
