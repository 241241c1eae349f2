package sqlite_test

import (
	"errors"
	"maps"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/internal/sqlcore"
	"github.com/taskgate/workers/sqlstore/internal/sqltest"
	"github.com/taskgate/workers/sqlstore/sqlite"
)

// A run waiting for its turn whose record another process deletes with
// SQL ends within the listener's poll, on the delete's change (see
// sqltest.DeletedByHandEndsAWaitingRun).
func TestAWaitingRunWhoseRecordIsDeletedByHandEndsAtOnce(t *testing.T) {
	t.Parallel()
	sqltest.DeletedByHandEndsAWaitingRun(t, func(t *testing.T) sqltest.HandDeleted {
		path := filepath.Join(t.TempDir(), "tasks.db")
		s := openAt(t, path)
		raw := openRaw(t, path)
		return sqltest.HandDeleted{Store: s, Del: func(t *testing.T, id string) {
			if _, err := raw.ExecContext(t.Context(), `DELETE FROM workers_tasks WHERE id = ?`, id); err != nil {
				t.Fatal(err)
			}
		}}
	})
}

// A delete of live task rows made by another process appends a change
// naming each one's task alone, which Listen hears within its poll; the
// finished rows it deletes append nothing.
func TestDeletesByHandAreAnnounced(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "tasks.db")
	s := openAt(t, path, sqlite.WithNoticeInterval(5*time.Millisecond))
	next, stop := listen(t, s)
	defer stop()
	raw := openRaw(t, path)
	exec := func(q string) {
		t.Helper()
		if _, err := raw.ExecContext(t.Context(), q); err != nil {
			t.Fatal(err)
		}
	}
	marks := 0
	// marker writes a row and returns the notices heard before its own.
	marker := func() []workers.Change {
		t.Helper()
		marks++
		id := "marker" + strconv.Itoa(marks)
		exec(`INSERT INTO workers_tasks (id, run_id, status) VALUES ('` + id + `', 'r', 'completed')`)
		var before []workers.Change
		for c := next(); c.ID != id; c = next() {
			before = append(before, c)
		}
		return before
	}
	exec(`INSERT INTO workers_tasks (id, run_id, status) VALUES
		('alice::pending', 'r', 'pending'), ('alice::running', 'r', 'running'),
		('alice::completed', 'r', 'completed'), ('alice::failed', 'r', 'failed'), ('alice::cancelled', 'r', 'cancelled')`)
	exec(`INSERT INTO workers_watchers (task_id, user_id) VALUES ('alice::pending', 'bob'), ('alice::completed', 'bob')`)
	marker()

	exec(`DELETE FROM workers_tasks WHERE id LIKE 'alice::%'`)
	got := map[workers.Change]int{}
	for _, c := range marker() {
		got[c]++
	}
	if want := map[workers.Change]int{{ID: "alice::pending"}: 1, {ID: "alice::running"}: 1}; !maps.Equal(got, want) {
		t.Errorf("after a delete of two live rows and three finished ones: notices %v, want %v", got, want)
	}
}

// Cleanup's deletes, of finished records only, append no change: a
// retention pass does not make every listener read its records.
func TestCleanupSendsNoNotice(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "tasks.db")
	s := openAt(t, path, sqlite.WithNoticeInterval(5*time.Millisecond))
	raw := openRaw(t, path)
	if _, err := raw.ExecContext(t.Context(), `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300)
		INSERT INTO workers_tasks (id, run_id, status, completed_at)
		SELECT 'alice::t' || i, 'r', CASE i % 3 WHEN 0 THEN 'completed' WHEN 1 THEN 'failed' ELSE 'cancelled' END, 1 FROM n`); err != nil {
		t.Fatal(err)
	}
	next, stop := listen(t, s) // from the end of the changes
	defer stop()
	n, err := s.DeleteFinished(t.Context(), time.Now())
	if err != nil || n != 300 {
		t.Fatalf("DeleteFinished = %d, %v; want 300", n, err)
	}
	if _, err := raw.ExecContext(t.Context(), `INSERT INTO workers_tasks (id, run_id, status) VALUES ('alice::live', 'r', 'pending')`); err != nil {
		t.Fatal(err)
	}
	if c := next(); c != (workers.Change{ID: "alice::live", RunID: "r", Status: workers.StatusPending}) {
		t.Errorf("after Cleanup, the next notice is %+v, want the insert's that followed", c)
	}
}

// A process of the release before the delete notices (schema version 7)
// goes on over a file migrated past it: the migration is recorded as
// usable by its code, whose Migrate accepts the file, and whose listener
// takes a change that names a task alone as the change of an added
// watcher, which it has always had.
func TestThePreviousReleaseUsesTheTablesWithDeleteNotices(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "tasks.db")
	openAt(t, path) // migrated by this release
	old, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := sqlcore.MigrateAsRelease(t.Context(), sqlite.Core(old), 7); err != nil {
		t.Fatalf("the previous release's Migrate over the file: %v", err)
	}
	// Recorded as needing code that knows it, the migration would keep
	// the previous release from starting.
	if _, err := openRaw(t, path).ExecContext(t.Context(), `UPDATE workers_schema_version SET compatible_from = 8 WHERE version = 8`); err != nil {
		t.Fatal(err)
	}
	if err := sqlcore.MigrateAsRelease(t.Context(), sqlite.Core(old), 7); !errors.Is(err, sqlite.ErrSchemaTooNew) {
		t.Fatalf("the previous release's Migrate over a version 8 it cannot use = %v, want ErrSchemaTooNew", err)
	}
}
