package postgres_test

import (
	"testing"

	"github.com/taskgate/workers/sqlstore/internal/sqltest"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// TestStoreSurface checks that Store's API is its capabilities' methods
// and its own, with nothing of the implementation it shares with the
// SQLite store.
func TestStoreSurface(t *testing.T) {
	sqltest.CheckSurface[postgres.Store](t, "Close", "Migrate", "Pool")
}
