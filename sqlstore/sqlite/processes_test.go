package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"

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
}

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
