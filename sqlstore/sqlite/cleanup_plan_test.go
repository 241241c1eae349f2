package sqlite_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/internal/sqlcore"
	"github.com/taskgate/workers/sqlstore/sqlite"
)

// cleanupPlan returns SQLite's plan of a batch of DeleteFinished over a
// file as a store leaves it, without statistics: nothing runs ANALYZE
// on it, so SQLite plans by its rules alone, whatever the rows.
func cleanupPlan(t *testing.T) []string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tasks.db")
	s := openAt(t, path)
	var del sqlcore.Statement
	for _, st := range sqlcore.IndexedStatements(sqlite.Core(s), "u::k", "u", workers.Position{CreatedAt: time.Now(), ID: "u::k"}) {
		if st.Name == "delete finished" {
			del = st
		}
	}
	if del.SQL == "" {
		t.Fatal("no delete finished statement")
	}
	rows, err := openRaw(t, path).QueryContext(t.Context(), "EXPLAIN QUERY PLAN "+del.SQL, del.Args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return plan
}

// TestCleanupBatchDeletesItsRecordsByKey: a batch of DeleteFinished
// picks at most a batch of finished records, then deletes those by their
// key. A DELETE that read the status index to find the records picked
// would go through every finished record of the history at each batch:
// each batch would hold the file's write lock, which every other
// process's writes wait for, for a time that grows with the history
// (200 ms at 200,000 finished records), and a cleanup would take a time
// that grows with its square.
func TestCleanupBatchDeletesItsRecordsByKey(t *testing.T) {
	t.Parallel()
	plan := cleanupPlan(t)
	if len(plan) == 0 || !strings.HasPrefix(plan[0], "SEARCH workers_tasks USING INTEGER PRIMARY KEY ") {
		t.Errorf("a batch of DeleteFinished does not delete the records it picked by their key; plan: %q", plan)
	}
}

// TestCleanupBatchReadsOnlyTheRecordsBeforeTheCutoff: a batch of
// DeleteFinished picks its records from ranges of the (status,
// completed_at) index that hold only records it deletes. A pick by
// status alone would read, at each batch, every record of a status
// completed since the cutoff, all the records the cleanup keeps
// (a day's worth, by default), under the file's write lock; a scan of
// the table, every record there is.
func TestCleanupBatchReadsOnlyTheRecordsBeforeTheCutoff(t *testing.T) {
	t.Parallel()
	plan := cleanupPlan(t)
	reads := 0
	for _, step := range plan {
		if !strings.Contains(step, "workers_tasks") || strings.Contains(step, "USING INTEGER PRIMARY KEY") {
			continue // not a read of the records, or the delete's by key
		}
		if !strings.HasPrefix(step, "SEARCH ") || !strings.Contains(step, "INDEX workers_tasks_status (") {
			t.Errorf("a batch of DeleteFinished reads records otherwise than from ranges of the status index: %q; plan: %q", step, plan)
			continue
		}
		reads++
		if !strings.Contains(step, "completed_at<?") && !strings.Contains(step, "completed_at=?") {
			t.Errorf("a batch of DeleteFinished reads the status index by status alone: %q; plan: %q", step, plan)
		}
	}
	if reads == 0 {
		t.Errorf("a batch of DeleteFinished does not read the status index; plan: %q", plan)
	}
}
