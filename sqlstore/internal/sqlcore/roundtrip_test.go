package sqlcore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// countingDriver is a database/sql driver that runs nothing: it records
// each round trip a store makes (begin, statement, commit) and reports one
// row affected by every statement.
type countingDriver struct {
	mu    sync.Mutex
	calls []string
}

func (d *countingDriver) note(s string) {
	d.mu.Lock()
	d.calls = append(d.calls, s)
	d.mu.Unlock()
}

func (d *countingDriver) Open(string) (driver.Conn, error) { return countingConn{d}, nil }

type countingConn struct{ d *countingDriver }

func (c countingConn) Prepare(q string) (driver.Stmt, error) { return countingStmt{c.d, q}, nil }
func (c countingConn) Close() error                          { return nil }
func (c countingConn) Begin() (driver.Tx, error)             { c.d.note("BEGIN"); return countingTx{c.d}, nil }

type countingTx struct{ d *countingDriver }

func (t countingTx) Commit() error   { t.d.note("COMMIT"); return nil }
func (t countingTx) Rollback() error { t.d.note("ROLLBACK"); return nil }

type countingStmt struct {
	d *countingDriver
	q string
}

func (s countingStmt) Close() error  { return nil }
func (s countingStmt) NumInput() int { return -1 }
func (s countingStmt) Exec([]driver.Value) (driver.Result, error) {
	s.d.note(strings.Fields(s.q)[0])
	return driver.RowsAffected(1), nil
}
func (s countingStmt) Query([]driver.Value) (driver.Rows, error) { return nil, driver.ErrSkip }

// CheckNamedValue accepts every argument, as pgx's stdlib driver does
// (the watcher array among them).
func (s countingStmt) CheckNamedValue(*driver.NamedValue) error { return nil }

func TestInsertWithWatchersIsOneRoundTrip(t *testing.T) {
	rec := workers.Record{ID: "alice::k", RunID: "r1", Watchers: []string{"alice", "bob"},
		CreatedAt: time.Now(), State: workers.State{Status: workers.StatusPending}}
	for _, tc := range []struct {
		name, insert string
		want         []string
	}{
		{"one statement", "WITH t AS ({insert}) INSERT INTO {watchers} SELECT 1", []string{"WITH"}},
		{"transaction", "", []string{"BEGIN", "INSERT", "INSERT", "COMMIT"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &countingDriver{}
			db := sql.OpenDB(connector{d})
			defer db.Close()
			s, err := New(&Dialect{Name: "test", Time: func(t time.Time) any { return t }, InsertWithWatchers: tc.insert},
				db, db, Config{Prefix: DefaultPrefix})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.InsertTask(context.Background(), rec); err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(d.calls, " "); got != strings.Join(tc.want, " ") {
				t.Errorf("round trips: %s, want %s", got, strings.Join(tc.want, " "))
			}
		})
	}
}

// connector opens a test driver's connections for sql.OpenDB.
type connector struct{ d driver.Driver }

func (c connector) Connect(context.Context) (driver.Conn, error) { return c.d.Open("") }
func (c connector) Driver() driver.Driver                        { return c.d }

// errLost is lossyDriver's lost connection.
var errLost = errors.New("connection lost")

// lossyDriver is a database/sql driver whose writes change nothing (every
// one is fenced off) and whose reads fail with errLost while lost is
// above zero, each failure taking one off, and otherwise return one row,
// the run id "r2". Its writes fail likewise while lostWrites is above
// zero. A failure is cut, the error wrapping the context's as well, while
// cut is set.
type lossyDriver struct {
	lost, reads, lostWrites atomic.Int32
	cut                     atomic.Bool
	row                     atomic.Value // the one row's value, if not "r2"
}

// failure is the error of a statement whose connection was lost.
func (d *lossyDriver) failure() error {
	if d.cut.Load() {
		return fmt.Errorf("%w: %w", errLost, context.DeadlineExceeded)
	}
	return errLost
}

func (d *lossyDriver) Open(string) (driver.Conn, error) { return lossyConn{d}, nil }

type lossyConn struct{ d *lossyDriver }

func (c lossyConn) Prepare(q string) (driver.Stmt, error) { return lossyStmt{c.d}, nil }
func (c lossyConn) Close() error                          { return nil }
func (c lossyConn) Begin() (driver.Tx, error)             { return nil, errors.New("no transactions here") }

type lossyStmt struct{ d *lossyDriver }

func (s lossyStmt) Close() error                             { return nil }
func (s lossyStmt) NumInput() int                            { return -1 }
func (s lossyStmt) CheckNamedValue(*driver.NamedValue) error { return nil }
func (s lossyStmt) Exec([]driver.Value) (driver.Result, error) {
	if s.d.lostWrites.Add(-1) >= 0 {
		return nil, s.d.failure()
	}
	return driver.RowsAffected(0), nil
}
func (s lossyStmt) Query([]driver.Value) (driver.Rows, error) {
	s.d.reads.Add(1)
	if s.d.lost.Add(-1) >= 0 {
		return nil, s.d.failure()
	}
	if v, ok := s.d.row.Load().(string); ok {
		return &oneRow{v: v}, nil
	}
	return &oneRow{v: "r2"}, nil
}

// lossyStore returns a store over d that makes a read again, up to three
// times, when its connection is lost.
func lossyStore(t *testing.T, d *lossyDriver) *Store {
	t.Helper()
	db := sql.OpenDB(connector{d})
	t.Cleanup(func() { db.Close() })
	s, err := New(&Dialect{Name: "test", Time: func(t time.Time) any { return t }, ConnLost: func(err error) bool { return errors.Is(err, errLost) }},
		db, db, Config{Prefix: DefaultPrefix, ReadAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// oneRow is a result of one row and one column.
type oneRow struct {
	v    string
	done bool
}

func (r *oneRow) Columns() []string { return []string{"run_id"} }
func (r *oneRow) Close() error      { return nil }
func (r *oneRow) Next(dest []driver.Value) error {
	if r.done {
		return io.EOF
	}
	r.done = true
	dest[0] = r.v
	return nil
}

// The read that follows a write which changed nothing, to say why (a
// transition fenced off, a watcher's append to another run), is made
// again on a lost connection, as every read outside a transaction is: a
// database that restarts leaves the pool's idle connections dead, and
// the write's answer must not become an error that says it may have
// landed.
func TestReadAfterAWriteThatChangedNothingRidesOutALostConnection(t *testing.T) {
	d := &lossyDriver{}
	s := lossyStore(t, d)
	ctx := context.Background()
	d.lost.Store(1)
	ok, err := s.TransitionTask(ctx, "alice::k", "r1", []workers.Status{workers.StatusPending},
		workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: time.Now()})
	if ok || err != nil {
		t.Errorf("TransitionTask = %v, %v; want false, nil (fenced off)", ok, err)
	}
	d.lost.Store(1)
	ok, err = s.AddWatcher(ctx, "alice::k", "r1", "bob")
	if ok || !errors.Is(err, workers.ErrConflict) {
		t.Errorf("AddWatcher = %v, %v; want false, ErrConflict (another run's record)", ok, err)
	}
	if n := d.reads.Load(); n != 4 {
		t.Errorf("%d reads, want 4: each lost once, then made again", n)
	}
}

// The read of the live instances, which a submission may make to tell a
// live run from an abandoned one, is made again on a lost connection.
func TestLiveInstancesRidesOutALostConnection(t *testing.T) {
	d := &lossyDriver{}
	s := lossyStore(t, d)
	d.lost.Store(2)
	live, err := s.LiveInstances(context.Background())
	if err != nil || len(live) != 1 || live[0] != "r2" {
		t.Errorf("LiveInstances = %q, %v; want the one row", live, err)
	}
	if n := d.reads.Load(); n != 3 {
		t.Errorf("%d reads, want 3: lost twice, then made again", n)
	}
}

// Each statement that finds its connection lost calls Config.Lost once,
// with its error, for the store to drop the pool's other connections,
// dead alike after a restart: each failed try of a read, the last one
// too, the read after a write fenced off, a write, an announcement, and
// the prune of a renewal whose error is dropped. A statement cut because
// its context ended calls nothing.
func TestEachLostStatementIsReportedOnce(t *testing.T) {
	ctx := context.Background()
	live := func(s *Store) error { _, err := s.LiveInstances(ctx); return err }
	transition := func(s *Store) error {
		_, err := s.TransitionTask(ctx, "alice::k", "r1", []workers.Status{workers.StatusPending},
			workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: time.Now()})
		return err
	}
	announce := func(s *Store) error { _, err := s.sendNotices(ctx, []string{"alice::k"}); return err }
	renew := func(s *Store) error { _, err := s.RenewLease(ctx, "i1", time.Second); return err }
	for _, tc := range []struct {
		name        string
		op          func(*Store) error
		lost, write int32
		cut         bool
		want        int
		wantErr     bool
	}{
		{name: "a read lost twice, then made", op: live, lost: 2, want: 2},
		{name: "a read lost on every try", op: live, lost: 5, want: 3, wantErr: true},
		{name: "a write", op: transition, write: 1, want: 1, wantErr: true},
		// Fenced off (the driver changes no row), it reads why.
		{name: "the read after a write fenced off, lost twice", op: transition, lost: 2, want: 2},
		{name: "the read after a write fenced off, lost on every try", op: transition, lost: 5, want: 3, wantErr: true},
		{name: "an announcement", op: announce, lost: 1, want: 1, wantErr: true},
		{name: "the prune after a lease taken anew", op: renew, write: 1, want: 1},
		{name: "a read cut by its context", op: live, lost: 1, cut: true, wantErr: true},
		{name: "a write cut by its context", op: transition, write: 1, cut: true, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &lossyDriver{}
			s := lossyStore(t, d)
			var lost atomic.Int32
			s.cfg.Lost = func(err error) {
				if !errors.Is(err, errLost) {
					t.Errorf("Lost(%v), want the lost connection's error", err)
				}
				lost.Add(1)
			}
			d.lost.Store(tc.lost)
			d.lostWrites.Store(tc.write)
			d.cut.Store(tc.cut)
			d.row.Store("false") // a lease taken anew, for RenewLease; a run id for the rest
			if err := tc.op(s); (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want an error: %t", err, tc.wantErr)
			}
			if n := lost.Load(); n != int32(tc.want) {
				t.Errorf("Lost called %d times, want %d", n, tc.want)
			}
		})
	}
}

// rollbackDriver is a database/sql driver whose connections only begin,
// commit and roll back transactions; each rollback is signalled on
// rolledBack.
type rollbackDriver struct{ rolledBack chan struct{} }

type rollbackConn struct{ d *rollbackDriver }

func (d *rollbackDriver) Open(string) (driver.Conn, error) { return rollbackConn{d}, nil }

func (rollbackConn) Prepare(string) (driver.Stmt, error) { return nil, errors.New("not supported") }
func (rollbackConn) Close() error                        { return nil }
func (c rollbackConn) Begin() (driver.Tx, error)         { return c, nil }
func (rollbackConn) Commit() error                       { return nil }
func (c rollbackConn) Rollback() error {
	c.d.rolledBack <- struct{}{}
	return nil
}

// A transaction whose context ends before its commit is rolled back by
// database/sql, whose Commit then says only that the transaction is
// done: the store reports ctx's error, which its callers test for.
func TestCommitAfterTheContextEndedReportsTheContextsError(t *testing.T) {
	d := &rollbackDriver{rolledBack: make(chan struct{}, 1)}
	db := sql.OpenDB(connector{d})
	defer db.Close()
	s := &Store{d: &Dialect{Name: "test"}, w: db}
	ctx, cancel := context.WithCancel(context.Background())
	err := s.inTx(ctx, func(*sql.Tx) error {
		cancel()
		<-d.rolledBack // database/sql's own rollback, as ctx ended
		return nil
	})
	if !errors.Is(err, context.Canceled) || errors.Is(err, sql.ErrTxDone) {
		t.Fatalf("inTx = %v, want context.Canceled", err)
	}
}
