package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/sqlite"
)

// A record restored to an earlier state of its own run, RUNNING for a
// run that has ended (the file restored from a copy taken while it
// ran), is ended FAILED as abandoned by the recovery loop of the
// process that ran it, whose lease is live: a Wait in another process
// returns that end, within about a RecoverInterval.
func TestRestoredRecordOfAnEndedRunIsRecovered(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "tasks.db")
	a, b := openAt(t, path), openAt(t, path)
	raw := openRaw(t, path)
	cfg := workers.Config{RecoverInterval: 50 * time.Millisecond, LeaseInterval: 100 * time.Millisecond}
	rtA, rtB := workers.NewRuntime(a, cfg), workers.NewRuntime(b, cfg)
	for _, rt := range []*workers.Runtime[*sqlite.Store]{rtA, rtB} {
		if err := rt.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := rt.Shutdown(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	alice := workers.MustOwner("alice")
	sub, err := rtA.Submit(t.Context(), "report", func(ctx context.Context, _ *workers.Task) (any, error) { return 1, nil }, alice)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := rtA.Wait(t.Context(), sub.ID, alice)
	if err != nil || snap.Status != workers.StatusCompleted {
		t.Fatalf("the run ended %s, %v; want COMPLETED", snap.Status, err)
	}
	// The restore: the record as it was while the run ran.
	if _, err := raw.Exec(`UPDATE workers_tasks SET status = 'running', completed_at = NULL, result = NULL, cause = '' WHERE id = ?`, sub.ID); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	snap, err = rtB.Wait(ctx, sub.ID, alice)
	if err != nil {
		t.Fatalf("another process's Wait on the restored record: %v", err)
	}
	if snap.Status != workers.StatusFailed || snap.Cause != workers.CauseAbandoned || snap.RunID != sub.RunID {
		t.Errorf("the restored record ended %s (%s) for run %s, want FAILED (abandoned) for run %s", snap.Status, snap.Cause, snap.RunID, sub.RunID)
	}
}
