package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/sqlite"
)

// oldRows returns a store over a new database holding recs, inserted as
// any release would, then each changed as set says, through raw SQL, to
// what an earlier release could store and this one refuses to write: a
// time before year 1, a run id holding a NUL byte.
func oldRows(t *testing.T, recs []workers.Record, set ...oldColumn) *sqlite.Store {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tasks.db")
	s := openAt(t, path)
	for _, rec := range recs {
		if err := s.InsertTask(t.Context(), rec); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := sql.Open("sqlite", path+"?_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	for _, c := range set {
		if _, err := raw.ExecContext(t.Context(), `UPDATE workers_tasks SET `+c.column+` = ? WHERE id = ?`, c.value, c.id); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// oldColumn is a column of the row of task id, and the value an earlier
// release stored in it.
type oldColumn struct {
	id, column string
	value      any
}

// oldRuntime returns a runtime over s, shut down with the test.
func oldRuntime(t *testing.T, s workers.Store) *workers.Runtime[workers.Store] {
	rt := workers.NewRuntime(s, workers.Config{})
	t.Cleanup(func() { rt.Shutdown(context.Background()) })
	return rt
}

// oldRun is a RUNNING record of run, which no runtime here holds.
func oldRun(run string) workers.Record {
	now := time.Now()
	return workers.Record{ID: "u::old", RunID: run, CreatedAt: now, Watchers: []string{"u"},
		State: workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: now}}
}

var year100BC = time.Date(-100, 1, 1, 0, 0, 0, 0, time.UTC)

// TestOldRowBeforeYear1PagesWithoutRepeats: a walk oldest first over
// rows an earlier release stored, one created before year 1 among them,
// lists each record once: a page after that row's position lists in the
// store's own order, which puts the undated rows before it, and so never
// lists them again.
func TestOldRowBeforeYear1PagesWithoutRepeats(t *testing.T) {
	now := time.Now()
	done := workers.State{Status: workers.StatusCompleted, CompletedAt: now}
	s := oldRows(t, []workers.Record{
		{ID: "u::undated", RunID: "x.1", State: done},
		{ID: "u::ancient", RunID: "x.1", CreatedAt: now, State: done},
		{ID: "u::recent", RunID: "x.1", CreatedAt: now.Add(time.Second), State: done},
	}, oldColumn{"u::ancient", "created_at", year100BC.UnixMicro()})
	var seen []string
	var after *workers.Position
	for range 10 {
		page, err := s.ListTasks(t.Context(), workers.Filter{Limit: 1, After: after})
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		seen = append(seen, page[0].ID)
		after = &workers.Position{CreatedAt: page[0].CreatedAt, ID: page[0].ID}
	}
	slices.Sort(seen)
	if !slices.Equal(slices.Compact(slices.Clone(seen)), seen) || len(seen) != 3 {
		t.Errorf("paging oldest first, one record a page, listed %q; want each of the 3 records once", seen)
	}
}

// TestRecoveryEndsOldRuns: recovery ends an abandoned RUNNING record an
// earlier release stored with a StartedAt before year 1, which the state
// it writes must not carry (CheckState refuses it), or with a run id
// holding a NUL byte, which its fenced write must still match.
func TestRecoveryEndsOldRuns(t *testing.T) {
	for _, c := range []struct {
		name string
		set  oldColumn
	}{
		{"started before year 1", oldColumn{"u::old", "started_at", year100BC.UnixMicro()}},
		{"a NUL byte in the run id", oldColumn{"u::old", "run_id", "go\x00ne.1"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := oldRows(t, []workers.Record{oldRun("gone.1")}, c.set)
			n, err := oldRuntime(t, s).RecoverZombies(t.Context())
			got, gerr := s.GetTask(t.Context(), "u::old")
			if err != nil || n != 1 || gerr != nil || got.Status != workers.StatusFailed {
				t.Errorf("RecoverZombies = %d, %v; the record is %s (%v), want 1, nil and FAILED", n, err, got.Status, gerr)
			}
		})
	}
}

// TestRerunOverAnOldRowWithANULRunID: a key whose finished record an
// earlier release stored with a run id holding a NUL byte can be run
// again: the re-run's ReplaceTask, fenced on that run id, matches it.
func TestRerunOverAnOldRowWithANULRunID(t *testing.T) {
	rec := oldRun("gone.1")
	rec.Status, rec.CompletedAt = workers.StatusCompleted, time.Now()
	s := oldRows(t, []workers.Record{rec}, oldColumn{rec.ID, "run_id", "go\x00ne.1"})
	if got, err := s.GetTask(t.Context(), rec.ID); err != nil || got.RunID != "go\x00ne.1" {
		t.Fatalf("old row reads back %q, %v", got.RunID, err)
	}
	sub, err := oldRuntime(t, s).Submit(t.Context(), "old", func(context.Context, *workers.Task) (any, error) { return 1, nil }, workers.MustOwner("u"))
	if err != nil {
		t.Fatalf("Submit over the old finished row: %v", err)
	}
	if got, err := s.GetTask(t.Context(), rec.ID); err != nil || got.RunID == "go\x00ne.1" {
		t.Errorf("the record is still run %q (%v), want the re-run's (submission %+v)", got.RunID, err, sub)
	}
}

// TestCancelEndsAnOldRunStartedBeforeYear1: a Cancel of a RUNNING record
// an earlier release stored with a StartedAt before year 1, whose run
// this runtime does not hold, ends it: the end it writes says the run
// has no start time, rather than carry one CheckState refuses.
func TestCancelEndsAnOldRunStartedBeforeYear1(t *testing.T) {
	s := oldRows(t, []workers.Record{oldRun("elsewhere.1")}, oldColumn{"u::old", "started_at", year100BC.UnixMicro()})
	err := oldRuntime(t, s).Cancel(t.Context(), "u::old", workers.MustOwner("u"))
	got, gerr := s.GetTask(t.Context(), "u::old")
	if err != nil || gerr != nil || got.Status != workers.StatusCancelled || !got.StartedAt.IsZero() {
		t.Errorf("Cancel = %v; the record is %s, started %v (%v), want nil, CANCELLED and no start time", err, got.Status, got.StartedAt, gerr)
	}
}
