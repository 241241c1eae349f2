package sqlcore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/taskgate/workers"
)

// schemaLostDriver is a database/sql driver whose transactions and
// statements succeed and whose every query fails with errLost.
type schemaLostDriver struct{}

func (schemaLostDriver) Open(string) (driver.Conn, error) { return schemaLostConn{}, nil }

type schemaLostConn struct{}

func (schemaLostConn) Prepare(string) (driver.Stmt, error) { return schemaLostStmt{}, nil }
func (schemaLostConn) Close() error                        { return nil }
func (schemaLostConn) Begin() (driver.Tx, error)           { return schemaLostTx{}, nil }

type schemaLostTx struct{}

func (schemaLostTx) Commit() error   { return nil }
func (schemaLostTx) Rollback() error { return nil }

type schemaLostStmt struct{}

func (schemaLostStmt) Close() error                               { return nil }
func (schemaLostStmt) NumInput() int                              { return -1 }
func (schemaLostStmt) CheckNamedValue(*driver.NamedValue) error   { return nil }
func (schemaLostStmt) Exec([]driver.Value) (driver.Result, error) { return driver.RowsAffected(0), nil }
func (schemaLostStmt) Query([]driver.Value) (driver.Rows, error)  { return nil, errLost }

// Migrate's read of whether its schema exists fails as every other
// statement of the migration does: a lost connection is ErrUnavailable,
// and is reported (Config.Lost), so that the dead connections of the
// pool are closed.
func TestMigratesSchemaReadOnALostConnectionIsUnavailable(t *testing.T) {
	db := sql.OpenDB(connector{schemaLostDriver{}})
	defer db.Close()
	var lost atomic.Int32
	s, err := New(&Dialect{
		Name: "test", Time: func(t time.Time) any { return t },
		ConnLost:     func(err error) bool { return errors.Is(err, errLost) },
		SchemaExists: "SELECT true",
		Migrations:   fstest.MapFS{"migrations/0001_init.sql": {Data: []byte("CREATE TABLE t (a int)")}},
	}, db, db, Config{Prefix: DefaultPrefix, Schema: "jobs", Lost: func(error) { lost.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Migrate(context.Background())
	if !errors.Is(err, workers.ErrUnavailable) || !errors.Is(err, errLost) {
		t.Errorf("Migrate with the schema's read on a lost connection = %v, want an error wrapping ErrUnavailable and the loss", err)
	}
	if n := lost.Load(); n != 1 {
		t.Errorf("the lost connection reported %d times, want once", n)
	}
}

// A statement that finds a table of the store's own missing, in a store
// whose Config names a schema, reads whether the schema exists to say
// which is missing; when that read fails too (its connection lost), the
// statement's own failure is returned, with the hint to call Migrate,
// not the read's, and not as though the schema were missing.
func TestASchemaReadThatFailsLeavesTheStatementsError(t *testing.T) {
	db := sql.OpenDB(connector{schemaLostDriver{}})
	defer db.Close()
	errMissing := errors.New(`relation "jobs.workers_tasks" does not exist`)
	s, err := New(&Dialect{
		Name: "test", Time: func(t time.Time) any { return t },
		ConnLost: func(err error) bool { return errors.Is(err, errLost) },
		Missing: func(err error) (string, bool) {
			return "jobs.workers_tasks", errors.Is(err, errMissing)
		},
		SchemaExists: "SELECT true",
		Migrations:   fstest.MapFS{"migrations/0001_init.sql": {Data: []byte("CREATE TABLE t (a int)")}},
	}, db, db, Config{Prefix: DefaultPrefix, Schema: "jobs"})
	if err != nil {
		t.Fatal(err)
	}
	err = s.wrap(context.Background(), "get task", errMissing)
	if !errors.Is(err, errMissing) || errors.Is(err, errLost) || errors.Is(err, ErrNoSchema) || errors.Is(err, workers.ErrUnavailable) {
		t.Errorf("wrap with the schema's read failing = %v, want the statement's own error alone", err)
	}
	if !strings.Contains(err.Error(), "call Migrate") {
		t.Errorf("wrap with the schema's read failing = %v, want the hint to call Migrate", err)
	}
}
