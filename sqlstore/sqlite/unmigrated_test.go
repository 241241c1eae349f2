package sqlite_test

import (
	"path/filepath"
	"testing"

	"github.com/taskgate/workers/sqlstore/internal/sqltest"
	"github.com/taskgate/workers/sqlstore/sqlite"
)

// A store used before Migrate made its tables says so: its errors name
// Migrate, instead of leaving the caller with the database's "no such
// table" alone.
func TestUnmigratedStoreSaysToMigrate(t *testing.T) {
	s, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "tasks.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	sqltest.Unmigrated(t, s)
}
