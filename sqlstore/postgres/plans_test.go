package postgres_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/taskgate/workers/sqlstore/internal/sqlcore"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// TestGroupWriteNeverScansTheTasksTable runs group commit's statement as
// the store does, prepared on a connection that keeps it, from the first
// batches of a new table to a table of many rows never analyzed since: no
// execution scans the whole tasks table to find the rows it transitions,
// whatever plan the database cached while the table was small.
func TestGroupWriteNeverScansTheTasksTable(t *testing.T) {
	testDSN(t)
	t.Parallel()
	sc := newScratchT(t)
	s := sc.store(t)
	ctx := t.Context()
	tasks := `"` + sc.schema + `".workers_tasks`
	fill := func(from, to int) {
		t.Helper()
		if _, err := sc.pool.Exec(ctx, `INSERT INTO `+tasks+` (id, run_id, status)
			SELECT 'k' || i, 'r' || i, 'running' FROM generate_series($1::int, $2::int) AS i`, from, to); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := sc.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// batch runs one batch of two transitions, fenced off by a run id
	// no row has, and returns how many sequential scans of the tasks
	// table it made, and how many blocks of the table and of its primary
	// key it read: a plan that read either whole, by a scan or by a full
	// walk of the index, reads far more than two lookups do.
	batch := func() (scans, blocks int64) {
		t.Helper()
		var before, after [2]int64
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			// The counts not yet reported to the statistics, which the
			// batch's add to.
			const counts = `SELECT pg_stat_get_xact_numscans($1::regclass),
				pg_stat_get_xact_blocks_fetched($1::regclass) + pg_stat_get_xact_blocks_fetched($2::regclass)`
			if err := tx.QueryRow(ctx, counts, tasks, tasks+"_pkey").Scan(&before[0], &before[1]); err != nil {
				return err
			}
			none, zero, times := []string{}, []int64{}, []time.Time{}
			two, twoN, twoT := []string{"k1", "k2"}, []int64{1, 1}, []time.Time{time.Now(), time.Now()}
			rows, err := tx.Query(ctx, sqlcore.GroupWriteSQL(postgres.Core(s)),
				none, none, zero, zero, none, none, times, times, none, none, none, none, none, none, times, none,
				none, none,
				two, []string{"stale", "stale"}, []string{"running", "running"}, []string{"completed", "completed"},
				twoN, twoN, []string{"", ""}, two, twoT, twoT, []string{"completed", "completed"}, two, two, two)
			if err != nil {
				return err
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
			return tx.QueryRow(ctx, counts, tasks, tasks+"_pkey").Scan(&after[0], &after[1])
		})
		if err != nil {
			t.Fatal(err)
		}
		return after[0] - before[0], after[1] - before[1]
	}
	// Two lookups read at most a few blocks each; the table of 20,000
	// rows fills some 150 blocks and its primary key some 90.
	const fewBlocks = 16
	fill(1, 20)
	for i := range 8 { // past the executions after which a generic plan is cached
		if scans, blocks := batch(); scans != 0 || blocks > fewBlocks {
			t.Errorf("batch %d on a new table: %d sequential scans of it, %d blocks read", i+1, scans, blocks)
		}
	}
	fill(21, 20_000)
	if scans, blocks := batch(); scans != 0 || blocks > fewBlocks {
		t.Errorf("batch on a table grown to 20,000 rows since: %d sequential scans of it, %d blocks read", scans, blocks)
	}
}

// TestMigrateRefusesAMissingGroupWriteFunction: a schema whose
// write_many function is gone (dropped by hand, say) is refused like one
// missing a column, rather than failing every batch.
func TestMigrateRefusesAMissingGroupWriteFunction(t *testing.T) {
	testDSN(t)
	t.Parallel()
	sc := newScratchT(t)
	s := sc.store(t)
	if _, err := sc.pool.Exec(t.Context(), `DROP FUNCTION "`+sc.schema+`".workers_write_many`); err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(t.Context()); !errors.Is(err, postgres.ErrSchemaMismatch) {
		t.Fatalf("Migrate without write_many = %v, want ErrSchemaMismatch", err)
	}
}
