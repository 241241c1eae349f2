package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/internal/sqltest"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// schemaEnv names, for a child process, the schema of the scenario it
// takes part in.
const schemaEnv = "WORKERS_SQLTEST_SCHEMA"

// backend gives each multi-process scenario a migrated schema of its own;
// parent and children each open their own pool on it.
var backend = sqltest.Backend{
	NewDB: func(t *testing.T) []string {
		sc := newScratchT(t)
		sc.store(t) // migrated once, before any child starts
		return []string{schemaEnv + "=" + sc.schema}
	},
	Open: func(getenv func(string) string) sqltest.Opener {
		return func(ctx context.Context) (workers.Store, func(), error) {
			s, err := postgres.Open(ctx, getenv(dsnEnv), postgres.WithSchema(getenv(schemaEnv)))
			if err != nil {
				return nil, nil, err
			}
			return s, func() { s.Close() }, nil
		}
	},
	// A fault terminates the backends of the scenario's own store
	// handles: those that connected after the fault was prepared and
	// whose last statement names the scenario's schema, a random name no
	// other test's statements hold. The pools reconnect. (A listener's
	// LISTEN names a hash of the schema, not the schema: listeners are
	// left alone.)
	Fault: func(t *testing.T, getenv func(string) string) func(context.Context) {
		schema := getenv(schemaEnv)
		pool, err := pgxpool.New(t.Context(), getenv(dsnEnv))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		var since any
		if err := pool.QueryRow(t.Context(), `SELECT clock_timestamp()`).Scan(&since); err != nil {
			t.Fatal(err)
		}
		return func(ctx context.Context) {
			_, _ = pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
AND backend_start > $1 AND position($2 in query) > 0`, since, schema)
		}
	},
}

// TestProcesses runs the scenarios that need real processes sharing the
// database: concurrent joins and re-runs, a process killed mid-run, and a
// cancel served by a process that does not run the task.
func TestProcesses(t *testing.T) {
	testDSN(t)
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
