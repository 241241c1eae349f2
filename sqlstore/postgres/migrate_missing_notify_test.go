package postgres_test

import (
	"errors"
	"testing"

	"github.com/taskgate/workers/sqlstore/postgres"
)

// Migrate refuses tables that lack a function the store needs
// (ErrSchemaMismatch; the README's "a missing table, column or
// function"): the trigger functions that send every write's notice and
// every delete's are two. Accepted, the tables send no notice again (or
// none of a delete), and every replica falls back to its sync loop
// without a word.
func TestMigrateRefusesAMissingNoticeFunction(t *testing.T) {
	for _, fn := range []string{"workers_notify", "workers_notify_delete"} {
		t.Run(fn, func(t *testing.T) {
			sc := newScratchT(t)
			s := sc.store(t)
			if _, err := sc.pool.Exec(t.Context(), `DROP FUNCTION "`+sc.schema+`".`+fn+`() CASCADE`); err != nil {
				t.Fatal(err)
			}
			if err := s.Migrate(t.Context()); !errors.Is(err, postgres.ErrSchemaMismatch) {
				t.Fatalf("Migrate over tables without their notice function %s = %v, want ErrSchemaMismatch", fn, err)
			}
		})
	}
}
