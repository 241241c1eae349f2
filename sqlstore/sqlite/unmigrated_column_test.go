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

// A store whose tasks table lacks a column a later migration added (its
// tables were made by an older release, and Migrate was not called
// since) says to call Migrate when a write names that column: SQLite
// says "table … has no column named …", not "no such column".
func TestAMissingColumnOfAnInsertSaysToMigrate(t *testing.T) {
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
	if _, err := raw.ExecContext(t.Context(), `ALTER TABLE workers_tasks DROP COLUMN stack`); err != nil {
		t.Fatal(err)
	}
	rt := workers.NewRuntime(s, workers.Config{})
	t.Cleanup(func() { rt.Shutdown(t.Context()) })
	_, err = rt.Submit(t.Context(), "report", func(context.Context, *workers.Task) (any, error) { return nil, nil }, workers.MustOwner("alice"))
	if err == nil {
		t.Fatal("Submit succeeded over a tasks table without its stack column")
	}
	if !strings.Contains(err.Error(), "has no column named") || !strings.Contains(err.Error(), "call Migrate") {
		t.Errorf("Submit = %v, want the database's error, and that says to call Migrate", err)
	}
}
