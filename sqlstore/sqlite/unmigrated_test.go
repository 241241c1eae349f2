package sqlite_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/taskgate/workers"
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
	alice := workers.MustOwner("alice")
	rt := workers.NewRuntime(s, workers.Config{})
	t.Cleanup(func() { rt.Shutdown(t.Context()) })
	_, statusErr := rt.Status(t.Context(), "alice::report", alice)
	_, listErr := rt.List(t.Context(), alice)
	for name, err := range map[string]error{
		"Start":  rt.Start(t.Context()),
		"Status": statusErr,
		"List":   listErr,
	} {
		if err == nil || !strings.Contains(err.Error(), "call Migrate") {
			t.Errorf("%s before Migrate = %v, want an error that says to call Migrate", name, err)
		}
	}
}
