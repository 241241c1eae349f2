package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/storetest"
)

// A Wait on a running task whose record vanished behind the runtime's
// back, with no notice of it (a failover to a replica that never had the
// record) returns ErrNotFound once the sync loop finds the record gone
// and cancels the run, as a Watch on it ends then, even while the
// callback, cancelled, has not returned: Wait follows the record, not
// the callback.
func TestWaitEndsWhenARunningRecordIsDeleted(t *testing.T) {
	testDSN(t)
	t.Parallel()
	sc := newScratchT(t)
	faults := &storetest.Faults{}
	store := sc.store(t)
	rt := workers.NewRuntime(storetest.Faulty(store, faults), workers.Config{SyncInterval: 20 * time.Millisecond})
	shutdownAtCleanup(t, rt)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	alice := workers.MustOwner("alice")
	started, release := make(chan struct{}), make(chan struct{})
	cause := make(chan error, 1)
	sub, err := rt.Submit(ctx, "report", func(ctx context.Context, _ *workers.Task) (any, error) {
		close(started)
		<-ctx.Done()
		cause <- context.Cause(ctx)
		<-release // the callback is slow to return
		return nil, context.Cause(ctx)
	}, alice)
	if err != nil {
		t.Fatal(err)
	}
	defer close(release)
	<-started
	// The runtime listens (the run took the lease, which starts the
	// listener): its own runs' Waits count on its events alone.
	waitFor(t, func() bool { return listeners(t, sc, store) == 1 })
	// The Wait, and the sync loop, read the RUNNING record before it is
	// deleted: each read of it hangs once it has landed, until the
	// delete is made.
	faults.Add(storetest.Rule{Op: storetest.OpGetTask, Fault: storetest.HangAfter})
	waited := make(chan error, 1)
	go func() {
		_, err := rt.Wait(ctx, sub.ID, alice)
		waited <- err
	}()
	waitFor(t, func() bool { return faults.Hung() == 2 })
	sc.vanish(t, `true`)
	faults.Heal()
	select {
	case c := <-cause:
		if !errors.Is(c, workers.ErrDeleted) {
			t.Errorf("the run was cancelled with %v, want ErrDeleted", c)
		}
	case <-ctx.Done():
		t.Fatal("the run whose record was deleted was never cancelled")
	}
	select {
	case err := <-waited:
		if !errors.Is(err, workers.ErrNotFound) {
			t.Errorf("Wait: %v, want ErrNotFound", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return within 5s of the run's cancel: it waits for the callback")
	}
}

// shutdownAtCleanup starts rt and shuts it down in t's cleanup, within
// a bound it checks.
func shutdownAtCleanup[S workers.Store](t *testing.T, rt *workers.Runtime[S]) {
	t.Helper()
	if err := rt.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		begun := time.Now()
		if err := rt.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		if d := time.Since(begun); d > 6*time.Second {
			t.Errorf("Shutdown took %v", d)
		}
	})
}

// exec runs a statement in sc's schema, as an operator or a failover would.
func (sc scratch) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	err := pgx.BeginFunc(t.Context(), sc.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(t.Context(), `SET LOCAL search_path TO "`+sc.schema+`"`); err != nil {
			return err
		}
		_, err := tx.Exec(t.Context(), sql, args...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// vanish deletes the task rows that where selects, with their watchers,
// as a failover to a replica that never had them would make them
// vanish: no trigger fires, so no notice announces them gone (an
// operator's DELETE would announce the live ones).
func (sc scratch) vanish(t *testing.T, where string, args ...any) {
	t.Helper()
	err := pgx.BeginFunc(t.Context(), sc.pool, func(tx pgx.Tx) error {
		for _, q := range []string{
			`SET LOCAL search_path TO "` + sc.schema + `"`,
			`SET LOCAL session_replication_role = replica`,
		} {
			if _, err := tx.Exec(t.Context(), q); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(t.Context(), `DELETE FROM workers_watchers WHERE task_id IN (SELECT id FROM workers_tasks WHERE `+where+`)`, args...); err != nil {
			return err
		}
		_, err := tx.Exec(t.Context(), `DELETE FROM workers_tasks WHERE `+where, args...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
