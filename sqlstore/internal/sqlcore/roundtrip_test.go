package sqlcore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"strings"
	"sync"
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

type connector struct{ d *countingDriver }

func (c connector) Connect(context.Context) (driver.Conn, error) { return countingConn{c.d}, nil }
func (c connector) Driver() driver.Driver                        { return c.d }
