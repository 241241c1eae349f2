package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// oldRows returns a store whose database holds rows an earlier release
// wrote and this one refuses to write: times before year 1, a run id
// holding a NUL byte. They are inserted as such a release would, then
// set through raw SQL.
func oldRows(t *testing.T) (*ssStore, *sql.DB) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tasks.db")
	s := openAt(t, path)
	raw, err := sql.Open("sqlite", path+"?_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	return &ssStore{s}, raw
}

type ssStore struct{ workers.Store }

var year100BC = time.Date(-100, 1, 1, 0, 0, 0, 0, time.UTC)

// TestOldRowBeforeYear1PagesWithoutRepeats: a walk oldest first over
// rows an earlier release stored, one created before year 1 among them,
// lists each record once. The page after that record's position now
// adds the NULL (undated) rows, which the SQL order already listed
// before it.
func TestOldRowBeforeYear1PagesWithoutRepeats(t *testing.T) {
	s, raw := oldRows(t)
	ctx := t.Context()
	now := time.Now()
	for _, r := range []workers.Record{
		{ID: "u::undated", RunID: "x.1", State: workers.State{Status: workers.StatusCompleted, CompletedAt: now}},
		{ID: "u::ancient", RunID: "x.1", CreatedAt: now, State: workers.State{Status: workers.StatusCompleted, CompletedAt: now}},
		{ID: "u::recent", RunID: "x.1", CreatedAt: now.Add(time.Second), State: workers.State{Status: workers.StatusCompleted, CompletedAt: now}},
	} {
		if err := s.InsertTask(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := raw.ExecContext(ctx, `UPDATE workers_tasks SET created_at = ? WHERE id = 'u::ancient'`, year100BC.UnixMicro()); err != nil {
		t.Fatal(err)
	}
	var seen []string
	var after *workers.Position
	for range 10 {
		page, err := s.ListTasks(ctx, workers.Filter{Limit: 1, After: after})
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

// TestRecoveryEndsAnOldRunStartedBeforeYear1: recovery ends an abandoned
// RUNNING record an earlier release stored with a StartedAt before
// year 1. It carries the stored StartedAt into the state it writes,
// which TransitionTask now refuses, so the record stays RUNNING on every
// pass.
func TestRecoveryEndsAnOldRunStartedBeforeYear1(t *testing.T) {
	s, raw := oldRows(t)
	ctx := t.Context()
	now := time.Now()
	rec := workers.Record{ID: "u::old", RunID: "gone.1", CreatedAt: now, Watchers: []string{"u"},
		State: workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: now}}
	if err := s.InsertTask(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.ExecContext(ctx, `UPDATE workers_tasks SET started_at = ? WHERE id = 'u::old'`, year100BC.UnixMicro()); err != nil {
		t.Fatal(err)
	}
	rt := workers.NewRuntime[workers.Store](s, workers.Config{})
	t.Cleanup(func() { rt.Shutdown(ctx) })
	n, err := rt.RecoverZombies(ctx)
	got, gerr := s.GetTask(ctx, rec.ID)
	if err != nil || n != 1 || gerr != nil || got.Status != workers.StatusFailed {
		t.Errorf("RecoverZombies = %d, %v; the record is %s (%v), want 1, nil and FAILED", n, err, got.Status, gerr)
	}
}

// TestRecoveryEndsAnOldRunWithANULRunID: recovery ends an abandoned
// RUNNING record whose run id, stored by an earlier release, holds a NUL
// byte. TransitionTask no longer sends such a run id, and answers false,
// so the record stays RUNNING, a live record of no live run.
func TestRecoveryEndsAnOldRunWithANULRunID(t *testing.T) {
	s, raw := oldRows(t)
	ctx := t.Context()
	now := time.Now()
	rec := workers.Record{ID: "u::old", RunID: "gone.1", CreatedAt: now, Watchers: []string{"u"},
		State: workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: now}}
	if err := s.InsertTask(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.ExecContext(ctx, `UPDATE workers_tasks SET run_id = ? WHERE id = 'u::old'`, "go\x00ne.1"); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetTask(ctx, rec.ID); err != nil || got.RunID != "go\x00ne.1" {
		t.Fatalf("old row reads back %q, %v", got.RunID, err)
	}
	rt := workers.NewRuntime[workers.Store](s, workers.Config{})
	t.Cleanup(func() { rt.Shutdown(ctx) })
	n, err := rt.RecoverZombies(ctx)
	got, gerr := s.GetTask(ctx, rec.ID)
	if err != nil || n != 1 || gerr != nil || got.Status != workers.StatusFailed {
		t.Errorf("RecoverZombies = %d, %v; the record is %s (%v), want 1, nil and FAILED", n, err, got.Status, gerr)
	}
}

// TestRerunOverAnOldRowWithANULRunID: a key whose finished record an
// earlier release stored with a run id holding a NUL byte can be run
// again. The re-run's ReplaceTask is fenced on that run id, which
// ReplaceTask no longer sends, answering ErrConflict whatever the row.
func TestRerunOverAnOldRowWithANULRunID(t *testing.T) {
	s, raw := oldRows(t)
	ctx := t.Context()
	now := time.Now()
	rec := workers.Record{ID: "u::old", RunID: "gone.1", CreatedAt: now, Watchers: []string{"u"},
		State: workers.State{Status: workers.StatusCompleted, Attempt: 1, StartedAt: now, CompletedAt: now}}
	if err := s.InsertTask(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.ExecContext(ctx, `UPDATE workers_tasks SET run_id = ? WHERE id = 'u::old'`, "go\x00ne.1"); err != nil {
		t.Fatal(err)
	}
	rt := workers.NewRuntime[workers.Store](s, workers.Config{})
	t.Cleanup(func() { rt.Shutdown(ctx) })
	sub, err := rt.Submit(ctx, "old", func(context.Context, *workers.Task) (any, error) { return 1, nil }, workers.MustOwner("u"))
	if err != nil {
		t.Fatalf("Submit over the old finished row: %v", err)
	}
	if got, err := s.GetTask(ctx, rec.ID); err != nil || got.RunID == "go\x00ne.1" {
		t.Errorf("the record is still run %q (%v), want the re-run's (submission %+v)", got.RunID, err, sub)
	}
}

// TestCancelEndsAnOldRunStartedBeforeYear1: a Cancel of a RUNNING record
// an earlier release stored with a StartedAt before year 1, whose run
// this runtime does not hold, ends it: the end it writes says the run
// has no start time, rather than carry one CheckState refuses.
func TestCancelEndsAnOldRunStartedBeforeYear1(t *testing.T) {
	s, raw := oldRows(t)
	ctx := t.Context()
	now := time.Now()
	rec := workers.Record{ID: "u::old", RunID: "elsewhere.1", CreatedAt: now, Watchers: []string{"u"},
		State: workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: now}}
	if err := s.InsertTask(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.ExecContext(ctx, `UPDATE workers_tasks SET started_at = ? WHERE id = 'u::old'`, year100BC.UnixMicro()); err != nil {
		t.Fatal(err)
	}
	rt := workers.NewRuntime[workers.Store](s, workers.Config{})
	t.Cleanup(func() { rt.Shutdown(ctx) })
	err := rt.Cancel(ctx, rec.ID, workers.MustOwner("u"))
	got, gerr := s.GetTask(ctx, rec.ID)
	if err != nil || gerr != nil || got.Status != workers.StatusCancelled || !got.StartedAt.IsZero() {
		t.Errorf("Cancel = %v; the record is %s, started %v (%v), want nil, CANCELLED and no start time", err, got.Status, got.StartedAt, gerr)
	}
}
