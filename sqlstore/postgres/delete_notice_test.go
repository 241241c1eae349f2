package postgres_test

import (
	"errors"
	"maps"
	"strconv"
	"testing"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/internal/sqlcore"
	"github.com/taskgate/workers/sqlstore/internal/sqltest"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// A run waiting for its turn whose record an operator deletes with SQL
// ends at once, on the delete's notice (see
// sqltest.DeletedByHandEndsAWaitingRun).
func TestAWaitingRunWhoseRecordIsDeletedByHandEndsAtOnce(t *testing.T) {
	testDSN(t)
	t.Parallel()
	sqltest.DeletedByHandEndsAWaitingRun(t, func(t *testing.T) sqltest.HandDeleted {
		sc := newScratchT(t)
		return sqltest.HandDeleted{Store: sc.store(t), Del: func(t *testing.T, id string) {
			sc.exec(t, `DELETE FROM workers_tasks WHERE id = $1`, id)
		}}
	})
}

// A statement that deletes live task rows by hand sends each one's id,
// with no run or status; the finished rows it deletes send nothing. One
// that deletes more than 1,000 live rows sends a single Resync instead,
// as a TRUNCATE does.
func TestDeletesByHandAreAnnounced(t *testing.T) {
	testDSN(t)
	t.Parallel()
	sc := newScratchT(t)
	s := sc.store(t)
	ch, _ := listening(t, s)
	firstResync(t, ch)
	// marker writes a row by hand and skips the notices before its own,
	// returning them.
	marks := 0
	marker := func() []workers.Change {
		t.Helper()
		marks++
		id := "marker" + strconv.Itoa(marks)
		sc.exec(t, `INSERT INTO workers_tasks (id, run_id, status) VALUES ($1, 'r', 'completed')`, id)
		var before []workers.Change
		for c := next(t, ch); c.ID != id; c = next(t, ch) {
			before = append(before, c)
		}
		return before
	}
	sc.exec(t, `INSERT INTO workers_tasks (id, run_id, status) VALUES
		('alice::pending', 'r', 'pending'), ('alice::running', 'r', 'running'),
		('alice::completed', 'r', 'completed'), ('alice::failed', 'r', 'failed'), ('alice::cancelled', 'r', 'cancelled')`)
	sc.exec(t, `INSERT INTO workers_watchers (task_id, user_id) VALUES ('alice::pending', 'bob'), ('alice::completed', 'bob')`)
	marker()

	sc.exec(t, `DELETE FROM workers_tasks WHERE id LIKE 'alice::%'`)
	got := map[workers.Change]int{}
	for _, c := range marker() {
		got[c]++
	}
	want := map[workers.Change]int{{ID: "alice::pending"}: 1, {ID: "alice::running"}: 1}
	if !maps.Equal(got, want) {
		t.Errorf("after a delete of two live rows and three finished ones: notices %v, want %v", got, want)
	}

	sc.exec(t, `INSERT INTO workers_tasks (id, run_id, status)
		SELECT 'bob::t' || i, 'r', 'pending' FROM generate_series(1, 1001) i`)
	if n := len(marker()); n != 1001 {
		t.Fatalf("%d notices of 1,001 inserts", n)
	}
	sc.exec(t, `DELETE FROM workers_tasks WHERE id LIKE 'bob::%'`)
	if cs := marker(); len(cs) != 1 || !cs[0].Resync {
		t.Errorf("after a delete of 1,001 live rows: notices %v, want one Resync", cs)
	}

	sc.exec(t, `TRUNCATE workers_tasks CASCADE`)
	if cs := marker(); len(cs) != 1 || !cs[0].Resync {
		t.Errorf("after a TRUNCATE: notices %v, want one Resync", cs)
	}
}

// Cleanup's deletes, of finished records only, send no notice: a
// retention pass does not make every listener re-read its runs.
func TestCleanupSendsNoNotice(t *testing.T) {
	testDSN(t)
	t.Parallel()
	sc := newScratchT(t)
	s := sc.store(t)
	ch, _ := listening(t, s)
	firstResync(t, ch)
	sc.exec(t, `INSERT INTO workers_tasks (id, run_id, status, completed_at)
		SELECT 'alice::t' || i, 'r', (ARRAY['completed', 'failed', 'cancelled'])[i % 3 + 1], now() - interval '1 hour'
		FROM generate_series(1, 300) i`)
	sc.exec(t, `INSERT INTO workers_tasks (id, run_id, status) VALUES ('alice::live', 'r', 'pending')`)
	for c := next(t, ch); c.ID != "alice::live"; c = next(t, ch) {
	}
	n, err := s.DeleteFinished(t.Context(), time.Now())
	if err != nil || n != 300 {
		t.Fatalf("DeleteFinished = %d, %v; want 300", n, err)
	}
	sc.exec(t, `UPDATE workers_tasks SET status = 'running' WHERE id = 'alice::live'`)
	if c := next(t, ch); c != (workers.Change{ID: "alice::live", RunID: "r", Status: workers.StatusRunning}) {
		t.Errorf("after Cleanup, the next notice is %+v, want the update's that followed", c)
	}
}

// A replica of the release before the delete notices (schema version 9)
// goes on over tables migrated past it: the migration is recorded as
// usable by its code, whose Migrate accepts the tables, and whose
// listener takes a notice that names a task alone as the notice of an
// added watcher, which it has always had.
func TestThePreviousReleaseUsesTheTablesWithDeleteNotices(t *testing.T) {
	testDSN(t)
	t.Parallel()
	sc := newScratchT(t)
	sc.store(t) // migrated by this release
	old := sc.ownStore(t, nil)
	if err := sqlcore.MigrateAsRelease(t.Context(), postgres.Core(old), 9); err != nil {
		t.Fatalf("the previous release's Migrate over the tables: %v", err)
	}
	// Recorded as needing code that knows it, the migration would keep
	// the previous release from starting.
	sc.exec(t, `UPDATE workers_schema_version SET compatible_from = 10 WHERE version = 10`)
	if err := sqlcore.MigrateAsRelease(t.Context(), postgres.Core(old), 9); !errors.Is(err, postgres.ErrSchemaTooNew) {
		t.Fatalf("the previous release's Migrate over a version 10 it cannot use = %v, want ErrSchemaTooNew", err)
	}
}
