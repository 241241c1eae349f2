package sqlite_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/taskgate/workers"
)

// A migrated store whose write fails on a table of the application's own
// (a trigger the application put on the store's table names a table it
// dropped since) does not say to call Migrate: the store's tables are
// there and current, and Migrate would change nothing.
func TestAnApplicationTableMissingDoesNotSayToMigrate(t *testing.T) {
	err := submitAfter(t,
		`CREATE TABLE audit (task_id TEXT)`,
		`CREATE TRIGGER audit_tasks AFTER INSERT ON workers_tasks BEGIN INSERT INTO audit VALUES (new.id); END`,
		`DROP TABLE audit`,
	)
	if err == nil {
		t.Fatal("Submit succeeded over a trigger that names a dropped table")
	}
	if !strings.Contains(err.Error(), "audit") {
		t.Errorf("Submit = %v, want the database's error, naming the table", err)
	}
	if strings.Contains(err.Error(), "Migrate") {
		t.Errorf("Submit = %v, want an error that does not say to call Migrate", err)
	}
}

// A store whose tasks table lacks a column a later migration added (its
// tables were made by an older release, and Migrate was not called
// since) says to call Migrate when a write names that column: SQLite
// says "table … has no column named …", not "no such column".
func TestAMissingColumnOfAnInsertSaysToMigrate(t *testing.T) {
	err := submitAfter(t, `ALTER TABLE workers_tasks DROP COLUMN stack`)
	if err == nil {
		t.Fatal("Submit succeeded over a tasks table without its stack column")
	}
	if !strings.Contains(err.Error(), "has no column named") || !strings.Contains(err.Error(), "call Migrate") {
		t.Errorf("Submit = %v, want the database's error, and that says to call Migrate", err)
	}
}

// submitAfter migrates a store in a new file, runs stmts on the file
// outside the store, and returns the error of a submission made then.
func submitAfter(t *testing.T, stmts ...string) error {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tasks.db")
	s := openAt(t, path)
	raw := openRaw(t, path)
	for _, q := range stmts {
		if _, err := raw.ExecContext(t.Context(), q); err != nil {
			t.Fatal(err)
		}
	}
	rt := workers.NewRuntime(s, workers.Config{})
	// The run retired in case the refused insert landed cannot write its
	// end either: a Shutdown with a live ctx would wait for it for good.
	t.Cleanup(func() { rt.Shutdown(t.Context()) })
	_, err := rt.Submit(t.Context(), "report", func(context.Context, *workers.Task) (any, error) { return nil, nil }, workers.MustOwner("alice"))
	return err
}
