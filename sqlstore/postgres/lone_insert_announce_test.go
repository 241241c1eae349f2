package postgres_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/internal/sqlcore"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// While announcements fail, an insert goes in the WriteMany statement,
// which notifies from the trigger. If its batch meets a held row, the
// insert is retried alone in that same statement: it must not be queued
// on the announcer as well (only InsertMany's rows are announced), as
// writeOne's lone insert never is.
func TestALoneRetriedWriteManyInsertIsNotAnnounced(t *testing.T) {
	sc := newScratchT(t)
	s := sc.store(t)
	ctx := t.Context()
	sqlcore.SetStall(postgres.Core(s), 0)
	insertPending(t, s, "run-1", "u::held", "u::gate")
	if _, err := sc.pool.Exec(ctx, `DROP FUNCTION "`+sc.schema+`".workers_announce(text[])`); err != nil {
		t.Fatal(err)
	}
	insertPending(t, s, "run-1", "u::first")
	waitFor(t, func() bool { return sqlcore.AnnounceFailing(postgres.Core(s)) })
	before := sqlcore.Announced(postgres.Core(s))

	from := []workers.Status{workers.StatusPending}
	running := workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: time.Now()}
	heldTx := holdRow(t, sc, "u::held")
	unboundLockWaits(t, sc)
	g := gateOn(t, sc, s, "u::gate", "run-1")
	var wg sync.WaitGroup
	defer wg.Wait()
	held := make(chan error, 1)
	g.queue(&wg, func() {
		hctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		_, err := s.TransitionTask(hctx, "u::held", "run-1", from, running)
		held <- err
	})
	ins := make(chan error, 1)
	g.queue(&wg, func() {
		ins <- s.InsertTask(ctx, workers.Record{ID: "u::new", RunID: "run-1", Watchers: []string{"u"}, CreatedAt: time.Now(), State: workers.State{Status: workers.StatusPending}})
	})
	boundLockWaits(t, sc)
	if err := g.release(); err != nil {
		t.Fatal(err)
	}
	if err := <-ins; err != nil {
		t.Fatal(err)
	}
	if err := heldTx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	if got := sqlcore.Announced(postgres.Core(s)); got != before {
		t.Errorf("the announcer was handed %d more id(s) for an insert made through WriteMany, which notifies from its trigger", got-before)
	}
}
