package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/internal/sqlcore"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// A row held locked by a transaction that stays open delays only its own
// notice: the notices of other new tasks still go, and the held row's
// goes once the transaction ends.
func TestAnnounceOfAHeldRowHoldsBackNoOther(t *testing.T) {
	t.Parallel()
	sc := newScratchT(t)
	listener, writer := sc.store(t), sc.store(t)
	changes, _ := listening(t, listener)
	waitID := func(id string, d time.Duration) bool {
		t.Helper()
		deadline := time.After(d)
		for {
			select {
			case c := <-changes:
				if c.ID == id {
					return true
				}
			case <-deadline:
				return false
			}
		}
	}
	nextResync(t, changes)
	tasks := `"` + sc.schema + `".workers_tasks`
	if _, err := sc.pool.Exec(t.Context(), `INSERT INTO `+tasks+` (id, run_id, status) VALUES ('held', 'r', 'pending')`); err != nil {
		t.Fatal(err)
	}
	nextFor(t, changes, "held") // the row inserted by hand
	// A transaction elsewhere writes the row and stays open.
	tx, err := sc.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(t.Context(), `UPDATE `+tasks+` SET progress = 1 WHERE id = 'held'`); err != nil {
		t.Fatal(err)
	}
	// An insert of the held id whose caller gives up while it waits ends
	// with its commit unknown: its id is queued to be announced.
	short, stop := context.WithTimeout(t.Context(), 30*time.Millisecond)
	err = writer.InsertTask(short, workers.Record{ID: "held", RunID: "r2", CreatedAt: time.Now(), State: workers.State{Status: workers.StatusPending}})
	stop()
	if err == nil {
		t.Fatal("the insert of a taken id went through")
	}
	waitFor(t, func() bool { return sqlcore.Announced(postgres.Core(writer)) == 1 })
	// A new task, inserted and committed: its notice should not wait for
	// the held row.
	if err := writer.InsertTask(t.Context(), workers.Record{ID: "fresh", RunID: "r", CreatedAt: time.Now(), State: workers.State{Status: workers.StatusPending}}); err != nil {
		t.Fatal(err)
	}
	if !waitID("fresh", 3*time.Second) {
		t.Error("no notice of a new task in 3s while another row is held")
	}
	if err := tx.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !waitID("held", 5*time.Second) {
		t.Error("no notice of the held row once its transaction ended")
	}
}

// While the store's announcements fail, new tasks' inserts notify from
// the trigger, as the other writes do: none goes unannounced.
func TestInsertsNotifyWhileAnnouncementsFail(t *testing.T) {
	t.Parallel()
	sc := newScratchT(t)
	listener, writer := sc.store(t), sc.store(t)
	ch, _ := listening(t, listener)
	firstResync(t, ch)
	if _, err := sc.pool.Exec(t.Context(), `DROP FUNCTION "`+sc.schema+`".workers_announce(text[])`); err != nil {
		t.Fatal(err)
	}
	pending := func(id string) workers.Record {
		return workers.Record{ID: id, RunID: "run-1", CreatedAt: time.Now(), State: workers.State{Status: workers.StatusPending}}
	}
	if err := writer.InsertTask(t.Context(), pending("alice::first")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return sqlcore.AnnounceFailing(postgres.Core(writer)) })
	if err := writer.InsertTask(t.Context(), pending("alice::second")); err != nil {
		t.Fatal(err)
	}
	if c := next(t, ch); c != (workers.Change{ID: "alice::second", RunID: "run-1", Status: workers.StatusPending}) {
		t.Fatalf("notice %+v, want the second insert's", c)
	}
}
