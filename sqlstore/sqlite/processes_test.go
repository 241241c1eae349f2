package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/internal/sqltest"
	"github.com/taskgate/workers/sqlstore/sqlite"
)

// pathEnv names, for a child process, the database file of the scenario
// it takes part in.
const pathEnv = "WORKERS_SQLTEST_SQLITE"

// backend gives each multi-process scenario a migrated database file of
// its own; parent and children each open their own store on it.
var backend = sqltest.Backend{
	NewDB: func(t *testing.T) []string {
		path := filepath.Join(t.TempDir(), "tasks.db")
		openAt(t, path) // migrated once, before any child starts
		return []string{pathEnv + "=" + path}
	},
	Open: func(getenv func(string) string) sqltest.Opener {
		return func(ctx context.Context) (workers.Store, func(), error) {
			s, err := sqlite.Open(ctx, getenv(pathEnv))
			if err != nil {
				return nil, nil, err
			}
			return s, func() { s.Close() }, nil
		}
	},
	// A fault holds the file's write lock from a connection of its own,
	// for faultHold: the stores' writes wait for it, within their busy
	// timeout.
	Fault: func(t *testing.T, getenv func(string) string) func(context.Context) {
		db, err := sql.Open("sqlite", getenv(pathEnv)+"?_busy_timeout=5000")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return func(ctx context.Context) {
			conn, err := db.Conn(ctx)
			if err != nil {
				return // the load ended
			}
			defer conn.Close()
			if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(faultHold):
			}
			if _, err := conn.ExecContext(context.Background(), "ROLLBACK"); err != nil {
				t.Errorf("release the write lock: %v", err)
			}
		}
	},
}

// faultHold is how long a fault of the soak scenario holds the write lock.
const faultHold = 200 * time.Millisecond

// TestProcesses runs the scenarios that need real processes sharing the
// database file: concurrent joins and re-runs, a process killed mid-run,
// and a cancel served by a process that does not run the task.
func TestProcesses(t *testing.T) {
	t.Parallel()
	sqltest.RunProcesses(t, backend)
}

// TestHelperProcess is a child process of TestProcesses; run on its own,
// it does nothing.
func TestHelperProcess(t *testing.T) { sqltest.HelperProcess(t, backend) }

// TestReplicas runs the replica tests in this process: a rolling deploy,
// renewals slow enough to nearly lose the lease, and a replica stalled
// past it.
func TestReplicas(t *testing.T) {
	t.Parallel()
	sqltest.RunReplicas(t, backend)
}
