package sqltest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/internal/sqlcore"
)

// upgradeRows are records as the first schema held them, written by a
// release that kept no cause codes: the message was all there was. want
// is the cause Migrate must derive for each, and cause the error
// Snapshot.Err must then unwrap to.
var upgradeRows = []struct {
	id, status, message string
	want                workers.Cause
	cause               error
}{
	{"alice::done", "completed", "", workers.CauseCompleted, nil},
	{"alice::cancelled", "cancelled", "Cancelled by user", workers.CauseCancelled, workers.ErrCancelled},
	{"alice::shutdown", "cancelled", "Cancelled by worker shutdown", workers.CauseShutdown, workers.ErrShutdown},
	{"alice::superseded", "cancelled", "Superseded by a newer run", workers.CauseSuperseded, workers.ErrSuperseded},
	{"alice::timeout", "failed", "Timed out after 5s", workers.CauseTimeout, workers.ErrTimeout},
	{"alice::abandoned", "failed", "Abandoned: its run is no longer alive", workers.CauseAbandoned, workers.ErrAbandoned},
	{"alice::panicked", "failed", "workers: task panicked: assignment to entry in nil map", workers.CausePanicked, nil},
	{"alice::failed", "failed", "connection refused", workers.CauseFailed, nil},
	{"alice::live", "running", "", workers.CauseNone, nil},
	{"bob::shared", "completed", "", workers.CauseCompleted, nil}, // alice watches it
}

// CheckUpgradeFromFirstSchema builds the store's tables at version 1,
// fills them as that release did, migrates them forward and checks that
// every record reads back with a derived cause code, that Snapshot.Err
// maps it to its error, and that the ordered, paged listing (whose
// watcher rows gained created_at) lists the old rows in order.
func CheckUpgradeFromFirstSchema(t *testing.T, s *sqlcore.Store, store workers.Store) {
	t.Helper()
	ctx := t.Context()
	if err := sqlcore.MigrateTo(ctx, s, 1); err != nil {
		t.Fatalf("migrate to version 1: %v", err)
	}
	base := time.Date(2024, time.June, 1, 12, 0, 0, 0, time.UTC)
	for i, r := range upgradeRows {
		created := base.Add(time.Duration(i) * time.Minute)
		var started, completed any = created, created.Add(time.Second)
		if r.status == "running" {
			completed = time.Time{}
		}
		owner, _ := workers.OwnerOf(r.id)
		if err := sqlcore.ExecRaw(ctx, s, `INSERT INTO {tasks}
	(id, run_id, queue, owner, created_at, status, progress, attempt, result, error, started_at, completed_at)
VALUES ($1, $2, '', $3, $4, $5, 100, 1, NULL, $6, $7, $8)`,
			r.id, "old-run-"+r.id, owner.ID(), created, r.status, r.message, started, completed); err != nil {
			t.Fatalf("insert a version-1 row: %v", err)
		}
		watchers := []string{owner.ID()}
		if r.id == "bob::shared" {
			watchers = append(watchers, "alice")
		}
		for _, w := range watchers {
			if err := sqlcore.ExecRaw(ctx, s, `INSERT INTO {watchers} (task_id, user_id) VALUES ($1, $2)`, r.id, w); err != nil {
				t.Fatalf("insert a version-1 watcher: %v", err)
			}
		}
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("migrate forward: %v", err)
	}

	rt := workers.NewRuntime(store, workers.Config{})
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := rt.Shutdown(sctx); err != nil {
			t.Error(err)
		}
	}()
	for _, r := range upgradeRows {
		rec, err := store.GetTask(ctx, r.id)
		if err != nil {
			t.Fatalf("read %s after migrating: %v", r.id, err)
		}
		if rec.Cause != r.want || rec.Error != r.message || string(rec.Status) != r.status {
			t.Errorf("%s after migrating: status %s, cause %q, message %q; want %s, %q, %q",
				r.id, rec.Status, rec.Cause, rec.Error, r.status, r.want, r.message)
		}
		snap, err := rt.Status(ctx, r.id, workers.System)
		if err != nil {
			t.Fatal(err)
		}
		err = snap.Err()
		switch {
		case r.cause != nil && !errors.Is(err, r.cause):
			t.Errorf("%s: Snapshot.Err() = %v, want an error matching %v", r.id, err, r.cause)
		case r.cause == nil && r.status == "failed" && errors.Unwrap(err) != nil:
			t.Errorf("%s: Snapshot.Err() = %v unwraps to %v, want no cause", r.id, err, errors.Unwrap(err))
		}
		if r.cause == workers.ErrTimeout {
			var te *workers.TimeoutError
			if !errors.As(err, &te) || te.Timeout != 5*time.Second {
				t.Errorf("%s: Snapshot.Err() = %v, want a *TimeoutError of 5s", r.id, err)
			}
		}
	}

	// alice's listing, newest first in pages of 3, includes bob::shared
	// (watched, so read through the watcher rows) in creation order.
	var want, got []string
	for i := len(upgradeRows) - 1; i >= 0; i-- {
		want = append(want, upgradeRows[i].id)
	}
	cursor := ""
	for range len(upgradeRows) {
		p, err := rt.ListPage(ctx, workers.MustOwner("alice"), workers.WithLimit(3), workers.WithCursor(cursor))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range p.Tasks {
			got = append(got, s.ID)
		}
		if cursor = p.Next; cursor == "" {
			break
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("alice's pages after migrating list %q, want %q", got, want)
	}
}
