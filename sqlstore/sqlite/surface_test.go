package sqlite_test

import (
	"testing"

	"github.com/taskgate/workers/sqlstore/internal/sqltest"
	"github.com/taskgate/workers/sqlstore/sqlite"
)

// TestStoreSurface checks that Store's API is its capabilities' methods
// and its own, with nothing of the implementation it shares with the
// PostgreSQL store.
func TestStoreSurface(t *testing.T) {
	sqltest.CheckSurface[sqlite.Store](t, "Close", "Migrate")
}
