package postgres_test

import (
	"errors"
	"testing"

	"github.com/taskgate/workers/sqlstore/postgres"
)

// Migrate refuses tables that lack a function the store needs
// (ErrSchemaMismatch; the README's "a missing table, column or
// function"): the trigger function that sends every write's notice is
// one. Accepted, the tables send no notice again, and every replica
// falls back to its sync loop without a word.
func TestMigrateRefusesAMissingNoticeFunction(t *testing.T) {
	sc := newScratchT(t)
	s := sc.store(t)
	if _, err := sc.pool.Exec(t.Context(), `DROP FUNCTION "`+sc.schema+`".workers_notify() CASCADE`); err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(t.Context()); !errors.Is(err, postgres.ErrSchemaMismatch) {
		t.Fatalf("Migrate over tables without their notice function = %v, want ErrSchemaMismatch", err)
	}
}
