package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/internal/sqlcore"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// A write of a free row that shared its batch with a write of a held row
// is made alone as the held one is; once Config.LoneWrites (half the
// pool) writes of held rows wait on their rows, it waits for a slot of
// theirs, though the pool has connections free and its own row is free:
// a held row holds back another task's write, for as long as the held
// writes' contexts last (StoreTimeout, under a runtime), which contradicts
// writeGroup's doc ("a held row holds back only its own caller and the
// writes of its own task behind it").
func TestAFreeRowsLoneWriteIsNotHeldBackByOtherTasksHeldRows(t *testing.T) {
	sc := newScratchT(t)
	cfg := testConfig(t)
	cfg.MaxConns = 4 // LoneWrites: 2
	s := storeOver(t, cfg, postgres.WithSchema(sc.schema))
	ctx := t.Context()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	sqlcore.SetStall(postgres.Core(s), 0) // no spare batch: queued writes go together
	held := []string{"u::held1", "u::held2", "u::held3"}
	insertPending(t, s, "run-1", append(held, "u::gate", "u::free")...)
	from := []workers.Status{workers.StatusPending}
	running := workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: time.Now()}
	waiting := func() int {
		var n int
		err := sc.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`, sc.schema).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	var holders []pgx.Tx
	var wg sync.WaitGroup
	defer func() {
		for _, tx := range holders {
			_ = tx.Rollback(context.Background())
		}
		wg.Wait()
	}()
	write := func(id string) {
		wg.Go(func() {
			ok, err := s.TransitionTask(ctx, id, "run-1", from, running)
			if err != nil || !ok {
				t.Errorf("%s: ok %v, %v", id, ok, err)
			}
		})
	}
	for _, id := range held {
		holders = append(holders, holdRow(t, sc, id))
	}
	// Two held rows' writes wait on their rows, alone: the two slots.
	for i, id := range held[:2] {
		write(id)
		waitFor(t, func() bool { return waiting() >= i+1 })
	}
	// A batch in flight, waiting on a row without a bound, so that the
	// next two writes queue and go together in the next batch.
	unboundLockWaits(t, sc)
	gateTx := holdRow(t, sc, "u::gate")
	gate := make(chan error, 1)
	go func() {
		_, err := s.TransitionTask(ctx, "u::gate", "run-1", from, running)
		gate <- err
	}()
	waitFor(t, func() bool { return waiting() >= 3 })
	write("u::held3")
	waitFor(t, func() bool { return sqlcore.Queued(postgres.Core(s)) >= 1 })
	free := make(chan error, 1)
	go func() {
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		ok, err := s.TransitionTask(fctx, "u::free", "run-1", from, running)
		if err == nil && !ok {
			err = fmt.Errorf("fenced off")
		}
		free <- err
	}()
	waitFor(t, func() bool { return sqlcore.Queued(postgres.Core(s)) >= 2 })
	// Migration 0007's bound again: the next batch gives up on u::held3
	// after 100 ms, and both its writes go alone.
	boundLockWaits(t, sc)
	if err := gateTx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-gate; err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	if err := <-free; err != nil {
		t.Errorf("u::free, whose row is free, with %d of the pool's %d connections free: %v after %v",
			cfg.MaxConns-int32(waiting()), cfg.MaxConns, err, time.Since(begin))
	}
}
