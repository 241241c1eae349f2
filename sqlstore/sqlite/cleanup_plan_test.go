package sqlite_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/internal/sqlcore"
)

// TestCleanupBatchLooksUpItsRecordsByKey: a batch of DeleteFinished
// picks at most a batch of finished records from the status index, then
// deletes those by their key. Planned without statistics, as a store's
// file is (nothing runs ANALYZE on it), a DELETE that read the status
// index again to find the picked records would go through every finished
// record of the history at each batch: each batch would hold the file's
// write lock, which every other process's writes wait for, for a time
// that grows with the history (200 ms at 200,000 finished records), and
// a cleanup would take a time that grows with its square.
func TestCleanupBatchLooksUpItsRecordsByKey(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "tasks.db")
	s := openAt(t, path)
	var del sqlcore.Statement
	for _, st := range sqlcore.IndexedStatements(s.Store, "u::k", "u", workers.Position{CreatedAt: time.Now(), ID: "u::k"}) {
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
	statusReads := 0
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
		if strings.Contains(detail, "INDEX workers_tasks_status ") {
			statusReads++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if statusReads != 1 {
		t.Errorf("a batch of DeleteFinished reads the status index %d times, want once, to pick its records; plan: %q", statusReads, plan)
	}
}
