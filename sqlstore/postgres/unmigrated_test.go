package postgres_test

import (
	"testing"

	"github.com/taskgate/workers/sqlstore/internal/sqltest"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// A store used before Migrate made its tables says so: its errors name
// Migrate, instead of leaving the caller with the database's "relation
// does not exist" alone.
func TestUnmigratedStoreSaysToMigrate(t *testing.T) {
	sc := newScratchT(t)
	s, err := postgres.New(sc.pool, postgres.WithSchema(sc.schema))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	sqltest.Unmigrated(t, s)
}
