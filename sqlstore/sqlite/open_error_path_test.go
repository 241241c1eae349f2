package sqlite_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/taskgate/workers/sqlstore/sqlite"
)

// A file that cannot be opened (its directory is missing, a new user's
// typo in -db) is refused with an error that names the file, as the
// PostgreSQL store's names the database it could not reach: "unable to
// open database file (14)" alone does not say which file.
func TestOpenErrorNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "no-such-dir", "tasks.db")
	s, err := sqlite.Open(t.Context(), path)
	if err == nil {
		s.Close()
		t.Fatal("opened a file in a missing directory")
	}
	if !strings.Contains(err.Error(), path) {
		t.Errorf("the error does not name the file %q: %v", path, err)
	}
}
