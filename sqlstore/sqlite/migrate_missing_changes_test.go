package sqlite_test

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/sqlite"
)

// Migrate refuses tables that lack what the store needs
// (ErrSchemaMismatch: "a missing table or column"): the changes table
// that every write's trigger appends to and Listen reads is one of them.
// Accepted, it leaves a store whose every write fails.
func TestMigrateRefusesAMissingChangesTable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tasks.db")
	s := openAt(t, path)
	if _, err := openRaw(t, path).Exec(`DROP TABLE workers_changes`); err != nil {
		t.Fatal(err)
	}
	err := s.Migrate(t.Context())
	if !errors.Is(err, sqlite.ErrSchemaMismatch) {
		insErr := s.InsertTask(t.Context(), workers.Record{ID: "x", RunID: "r", State: workers.State{Status: workers.StatusPending}})
		t.Fatalf("Migrate over tables without the changes table = %v, want ErrSchemaMismatch; then InsertTask = %v", err, insErr)
	}
}
