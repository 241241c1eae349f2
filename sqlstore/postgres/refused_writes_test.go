package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// logBuffer is a slog destination safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// readOnlyStore returns a migrated store in sc's schema over a pool of
// its own, whose every statement runs with default_transaction_read_only
// as the returned flag says, as on a database gone read-only (a failover
// to a standby, ALTER DATABASE ... SET default_transaction_read_only):
// its writes then fail with SQLSTATE 25006, and its reads answer. Each
// statement acquires its connection from the pool, where the setting is
// made.
func readOnlyStore(t *testing.T, sc scratch, logger *slog.Logger) (*postgres.Store, *atomic.Bool) {
	t.Helper()
	sc.store(t) // migrates
	var readOnly atomic.Bool
	cfg := testConfig(t)
	cfg.PrepareConn = func(ctx context.Context, c *pgx.Conn) (bool, error) {
		setting := "off"
		if readOnly.Load() {
			setting = "on"
		}
		_, err := c.Exec(ctx, "SET default_transaction_read_only = "+setting)
		return err == nil, err
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := postgres.New(pool, postgres.WithSchema(sc.schema), postgres.WithLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, &readOnly
}

// isReadOnly reports whether err is PostgreSQL's refusal of a write in a
// read-only transaction, as the store returns it: wrapping
// workers.ErrUnavailable, for the runtime to retry and an HTTP handler
// to answer 503, never workers.ErrInvalidData, which would blame the
// caller's data.
func isReadOnly(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "25006" &&
		errors.Is(err, workers.ErrUnavailable) && !errors.Is(err, workers.ErrInvalidData)
}

// waitLogged waits until logs hold s.
func waitLogged(t *testing.T, logs *logBuffer, s string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("never logged %q; logs:\n%s", s, logs)
		}
		time.Sleep(time.Millisecond)
	}
}

// While the database refuses writes (read-only, SQLSTATE 25006) and
// answers reads, for less than the lease: a submission fails with the
// database's refusal, ErrUnavailable (it used to wrap no sentinel, which
// an HTTP handler answers 500, where a failover's lost connections were
// 503), never the caller's invalid data, and registers nothing, and its run, retired in case the insert landed,
// reads that it left no record and writes nothing more (it used to retry
// its end for as long as writes were refused, logging each such
// submission, and a Shutdown then counted it among the live records left
// unwritten). A task running meanwhile shows RUNNING, and its outcome,
// refused, is retried, and lands once the database takes writes again,
// its callback run once. The lease is kept.
func TestWritesRefusedForLessThanTheLease(t *testing.T) {
	sc := newScratchT(t)
	logs := &logBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	s, readOnly := readOnlyStore(t, sc, logger)
	ctx := t.Context()
	rt := workers.NewRuntime(s, workers.Config{Logger: logger, LeaseInterval: 50 * time.Millisecond, LeaseTTL: time.Minute})
	if err := rt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var calls atomic.Int32
	running, err := rt.Submit(ctx, "running", func(context.Context, *workers.Task) (any, error) {
		calls.Add(1)
		<-release
		return "done", nil
	}, workers.System)
	if err != nil {
		t.Fatal(err)
	}

	readOnly.Store(true)
	_, err = rt.Submit(ctx, "refused", func(context.Context, *workers.Task) (any, error) { return nil, nil }, workers.System)
	if !isReadOnly(err) || errors.Is(err, workers.ErrInvalidData) {
		t.Fatalf("Submit to a read-only database: %v, want its refusal (25006), ErrUnavailable", err)
	}
	if _, err := rt.Status(ctx, "refused", workers.System); !errors.Is(err, workers.ErrNotFound) {
		t.Errorf("Status of the refused submission: %v, want ErrNotFound", err)
	}
	close(release)
	waitLogged(t, logs, "task=running")
	snap, err := rt.Status(ctx, running.ID, workers.System)
	if err != nil || snap.Status != workers.StatusRunning {
		t.Errorf("Status while its outcome is refused: %v, %v; want RUNNING, as the record says", snap.Status, err)
	}
	if list, err := rt.List(ctx, workers.System); err != nil || len(list) != 1 || list[0].Status != workers.StatusRunning {
		t.Errorf("List while writes are refused: %d tasks, %v; want the running task alone", len(list), err)
	}
	for snap, err := range rt.Watch(ctx, running.ID, workers.System) {
		if err != nil || snap.Status != workers.StatusRunning {
			t.Errorf("Watch while its outcome is refused: %v, %v; want RUNNING first", snap.Status, err)
		}
		break
	}
	if _, err := rt.Cleanup(ctx, 0); !isReadOnly(err) {
		t.Errorf("Cleanup of a read-only database: %v, want its refusal", err)
	}
	readOnly.Store(false)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	snap, err = rt.Wait(wctx, running.ID, workers.System)
	if err != nil || snap.Status != workers.StatusCompleted || string(snap.Result) != `"done"` {
		t.Fatalf("the running task once writes are accepted: %v %s, %v; want COMPLETED with its result", snap.Status, snap.Result, err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the callback ran %d times, want once", n)
	}
	if err := rt.Ready(ctx); err != nil {
		t.Errorf("Ready: %v", err)
	}
	if err := rt.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if strings.Contains(logs.String(), "task=refused ") {
		t.Errorf("the refused submission, which left no record, wrote on; logs:\n%s", logs)
	}
}

// A Shutdown while the database refuses writes returns by its deadline,
// and names, among the records it left unwritten, the running task's,
// and not that of a submission the database refused, which has none.
func TestShutdownWhileWritesAreRefused(t *testing.T) {
	sc := newScratchT(t)
	logs := &logBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	s, readOnly := readOnlyStore(t, sc, logger)
	ctx := t.Context()
	rt := workers.NewRuntime(s, workers.Config{Logger: logger, LeaseTTL: time.Minute, ShutdownGrace: -1})
	running, err := rt.Submit(ctx, "running", func(ctx context.Context, _ *workers.Task) (any, error) {
		<-ctx.Done() // Shutdown's cancel: its outcome is refused
		return nil, ctx.Err()
	}, workers.System)
	if err != nil {
		t.Fatal(err)
	}
	readOnly.Store(true)
	if _, err := rt.Submit(ctx, "refused", func(context.Context, *workers.Task) (any, error) { return nil, nil }, workers.System); !isReadOnly(err) {
		t.Fatalf("Submit to a read-only database: %v, want its refusal (25006)", err)
	}
	shut, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	begin := time.Now()
	err = rt.Shutdown(shut)
	if took := time.Since(begin); took > 2*time.Second {
		t.Errorf("Shutdown with a 500 ms deadline took %v", took)
	}
	var se *workers.ShutdownError
	if !errors.As(err, &se) {
		t.Fatalf("Shutdown while writes are refused: %v, want a *ShutdownError", err)
	}
	if strings.Join(se.UnwrittenIDs, ",") != running.ID {
		t.Errorf("Shutdown while writes are refused left %v unwritten, want only %q: the refused submission has no record", se.UnwrittenIDs, running.ID)
	}
}

// While the database refuses writes for longer than the lease, the lease
// cannot be renewed, as when it is out of reach: Ready and Submit return
// the renewal's error, the database's refusal, and the running task is
// cancelled with ErrAbandoned once. Once writes are accepted again its
// record says FAILED, abandoned, its callback run once, and the runtime
// takes submissions again.
func TestWritesRefusedForLongerThanTheLease(t *testing.T) {
	sc := newScratchT(t)
	logs := &logBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	s, readOnly := readOnlyStore(t, sc, logger)
	ctx := t.Context()
	// Each renewal may take an interval to answer: on a loaded machine a
	// renewal (a new connection, its PrepareConn, the write) takes far
	// more than 50 ms, and one cut off says the store did not answer in
	// place of the refusal Ready is to return.
	rt := workers.NewRuntime(s, workers.Config{Logger: logger, LeaseInterval: 500 * time.Millisecond, LeaseTTL: 2 * time.Second})
	if err := rt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	started := make(chan struct{})
	cause := make(chan error, 1)
	running, err := rt.Submit(ctx, "running", func(ctx context.Context, _ *workers.Task) (any, error) {
		if calls.Add(1) == 1 {
			close(started)
		}
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return nil, ctx.Err()
	}, workers.System)
	if err != nil {
		t.Fatal(err)
	}
	// A run whose lease lapses before its callback begins is abandoned
	// unstarted, and its callback never sees its context end.
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the running task's callback did not begin")
	}

	readOnly.Store(true)
	select {
	case c := <-cause:
		if !errors.Is(c, workers.ErrAbandoned) {
			t.Errorf("the running task was cancelled with %v, want ErrAbandoned", c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the running task was not cancelled with the lease lost")
	}
	if err := rt.Ready(ctx); !isReadOnly(err) {
		t.Errorf("Ready with the lease lost: %v, want the renewal's refusal (25006)", err)
	}
	if _, err := rt.Submit(ctx, "refused", func(context.Context, *workers.Task) (any, error) { return nil, nil }, workers.System); !isReadOnly(err) || errors.Is(err, workers.ErrInvalidData) {
		t.Errorf("Submit with the lease lost: %v, want the renewal's refusal (25006), ErrUnavailable", err)
	}

	readOnly.Store(false)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	snap, err := rt.Wait(wctx, running.ID, workers.System)
	if err != nil || snap.Status != workers.StatusFailed || snap.Cause != workers.CauseAbandoned {
		t.Fatalf("the running task once writes are accepted: %v (%s), %v; want FAILED, abandoned", snap.Status, snap.Cause, err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the callback ran %d times, want once", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for rt.Ready(ctx) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("Ready once writes are accepted: %v", rt.Ready(ctx))
		}
		time.Sleep(time.Millisecond)
	}
	sub, err := rt.Submit(ctx, "after", func(context.Context, *workers.Task) (any, error) { return "ok", nil }, workers.System)
	if err != nil {
		t.Fatalf("Submit once writes are accepted: %v", err)
	}
	if snap, err := rt.Wait(wctx, sub.ID, workers.System); err != nil || snap.Status != workers.StatusCompleted {
		t.Errorf("a task submitted once writes are accepted: %v, %v", snap.Status, err)
	}
	if err := rt.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if n := strings.Count(logs.String(), "instance lease lost"); n != 1 {
		t.Errorf("the lease's loss was logged %d times, want once", n)
	}
}

// A Cancel while the database refuses writes returns the refusal,
// ErrUnavailable, and cancels nothing, as its doc says of a cancel whose
// write did not land: the callback goes on, and the record says
// RUNNING. Once writes are accepted, a Cancel lands, and the task ends
// CANCELLED, its callback run once.
func TestCancelWhileWritesAreRefused(t *testing.T) {
	sc := newScratchT(t)
	logger := slog.New(slog.NewTextHandler(&logBuffer{}, nil))
	s, readOnly := readOnlyStore(t, sc, logger)
	ctx := t.Context()
	rt := workers.NewRuntime(s, workers.Config{Logger: logger, LeaseTTL: time.Minute})
	defer func() {
		if err := rt.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	}()
	var calls atomic.Int32
	started := make(chan context.Context, 1)
	running, err := rt.Submit(ctx, "running", func(ctx context.Context, _ *workers.Task) (any, error) {
		calls.Add(1)
		started <- ctx
		<-ctx.Done()
		return nil, ctx.Err()
	}, workers.System)
	if err != nil {
		t.Fatal(err)
	}
	callback := <-started
	readOnly.Store(true)
	if err := rt.Cancel(ctx, running.ID, workers.System); !isReadOnly(err) {
		t.Fatalf("Cancel while writes are refused: %v, want the refusal (25006), ErrUnavailable", err)
	}
	if err := callback.Err(); err != nil {
		t.Errorf("the refused Cancel cancelled the callback: %v", err)
	}
	if snap, err := rt.Status(ctx, running.ID, workers.System); err != nil || snap.Status != workers.StatusRunning {
		t.Errorf("Status after the refused Cancel: %v, %v; want RUNNING", snap.Status, err)
	}
	readOnly.Store(false)
	if err := rt.Cancel(ctx, running.ID, workers.System); err != nil {
		t.Fatalf("Cancel once writes are accepted: %v", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	snap, err := rt.Wait(wctx, running.ID, workers.System)
	if err != nil || snap.Status != workers.StatusCancelled {
		t.Fatalf("the task once cancelled: %v, %v; want CANCELLED", snap.Status, err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the callback ran %d times, want once", n)
	}
}

// A task whose callback returned while the database refused writes, and
// refused them past the lease, keeps its outcome: once writes are
// accepted again its record says COMPLETED, with its result, not FAILED
// as abandoned by the runtime's own recovery.
func TestAnOutcomeRefusedPastTheLeaseLandsOnceWritesAreAccepted(t *testing.T) {
	sc := newScratchT(t)
	logs := &logBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	s, readOnly := readOnlyStore(t, sc, logger)
	ctx := t.Context()
	rt := workers.NewRuntime(s, workers.Config{Logger: logger, LeaseInterval: 50 * time.Millisecond, LeaseTTL: 250 * time.Millisecond})
	if err := rt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	running, err := rt.Submit(ctx, "running", func(context.Context, *workers.Task) (any, error) {
		<-release
		return "done", nil
	}, workers.System)
	if err != nil {
		t.Fatal(err)
	}
	readOnly.Store(true)
	close(release)
	waitLogged(t, logs, "task=running")
	waitLogged(t, logs, "instance lease lost")
	readOnly.Store(false)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	snap, err := rt.Wait(wctx, running.ID, workers.System)
	if err != nil || snap.Status != workers.StatusCompleted || string(snap.Result) != `"done"` {
		t.Errorf("the task once writes are accepted: %v (%s) %s, %v; want COMPLETED with its result", snap.Status, snap.Cause, snap.Result, err)
	}
	if err := rt.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}
