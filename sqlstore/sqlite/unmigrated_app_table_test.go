package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/sqlite"
)

// A migrated store whose write fails on a table of the application's own
// (a trigger the application put on the store's table names a table it
// dropped since) does not say to call Migrate: the store's tables are
// there and current, and Migrate would change nothing.
func TestAnApplicationTableMissingDoesNotSayToMigrate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tasks.db")
	s, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	raw, err := sql.Open("sqlite", path+"?_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	for _, q := range []string{
		`CREATE TABLE audit (task_id TEXT)`,
		`CREATE TRIGGER audit_tasks AFTER INSERT ON workers_tasks BEGIN INSERT INTO audit VALUES (new.id); END`,
		`DROP TABLE audit`,
	} {
		if _, err := raw.ExecContext(t.Context(), q); err != nil {
			t.Fatal(err)
		}
	}
	rt := workers.NewRuntime(s, workers.Config{})
	t.Cleanup(func() { rt.Shutdown(t.Context()) })
	_, err = rt.Submit(t.Context(), "report", func(context.Context, *workers.Task) (any, error) { return nil, nil }, workers.MustOwner("alice"))
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
