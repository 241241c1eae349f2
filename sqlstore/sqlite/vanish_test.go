package sqlite_test

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// A running task whose record went back to PENDING under its own run id
// (the file restored from a backup taken before its start) is still that
// run's: its outcome lands over it and is what Wait returns, rather than
// being fenced out, leaving the record to recovery, which ended it FAILED
// as abandoned.
func TestAnOutcomeLandsOverItsRunsLostStart(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "tasks.db")
	rt := workers.NewRuntime(openAt(t, path), workers.Config{
		SyncInterval: 20 * time.Millisecond, RecoverInterval: 20 * time.Millisecond,
	})
	if err := rt.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := rt.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	alice := workers.MustOwner("alice")
	started, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	sub, err := rt.Submit(ctx, "report", func(ctx context.Context, _ *workers.Task) (any, error) {
		calls.Add(1)
		close(started)
		<-release
		return "done", nil
	}, alice)
	if err != nil {
		t.Fatal(err)
	}
	<-started
	raw := openRaw(t, path)
	if _, err := raw.ExecContext(ctx, `UPDATE workers_tasks SET status = 'pending', started_at = NULL, attempt = 0`); err != nil {
		t.Fatal(err)
	}
	close(release)
	snap, err := rt.Wait(ctx, sub.ID, alice)
	if err != nil {
		t.Fatal(err)
	}
	if snap.RunID != sub.RunID || snap.Status != workers.StatusCompleted || string(snap.Result) != `"done"` || calls.Load() != 1 {
		t.Fatalf("the run ended %s (%s: %s) with %s after %d calls, want its own outcome, COMPLETED with \"done\", after 1", snap.Status, snap.Cause, snap.Error, snap.Result, calls.Load())
	}
}
