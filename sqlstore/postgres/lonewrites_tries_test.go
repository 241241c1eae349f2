package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// A batch that met rows held elsewhere tries each of its writes on its
// own in the group statement, each try waiting 100 ms at most for a held
// row, within Config.LoneWrites (half the pool) and one more: however
// many of its rows are held, the tries leave a connection of the pool
// free for the store's other statements (the lease's renewals among
// them), where they used to take every connection at once.
func TestABatchsTriesAloneLeaveAConnectionFree(t *testing.T) {
	sc := newScratchT(t)
	cfg := testConfig(t)
	cfg.MaxConns = 4 // LoneWrites: 2
	s := storeOver(t, cfg, postgres.WithSchema(sc.schema))
	ctx := t.Context()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	held := []string{"u::held1", "u::held2", "u::held3", "u::held4"}
	// Inserted through another store, whose notices of them take none of
	// s's connections.
	insertPending(t, sc.store(t), "run-1", append(held, "u::gate", "u::free")...)
	from := []workers.Status{workers.StatusPending}
	running := workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: time.Now()}
	var holders []pgx.Tx
	var wg sync.WaitGroup
	defer func() {
		for _, tx := range holders {
			_ = tx.Rollback(context.Background())
		}
		wg.Wait()
	}()
	for _, id := range held {
		holders = append(holders, holdRow(t, sc, id))
	}
	// The held rows' writes and the free one's queue behind a batch in
	// flight, and go together as the next.
	unboundLockWaits(t, sc)
	g := gateOn(t, sc, s, "u::gate", "run-1")
	free := make(chan error, 1)
	g.queue(&wg, func() {
		ok, err := s.TransitionTask(ctx, "u::free", "run-1", from, running)
		if err == nil && !ok {
			err = fmt.Errorf("fenced off")
		}
		free <- err
	})
	for _, id := range held {
		g.queue(&wg, func() { _, _ = s.TransitionTask(ctx, id, "run-1", from, running) })
	}
	// Migration 0007's bound again: the batch gives up on its held rows
	// after 100 ms, and tries each of its writes on its own.
	boundLockWaits(t, sc)
	// The pool's connections in use, sampled each millisecond while the
	// tries go: until the free row's write has landed, and then for as
	// long as the four held rows' tries take one after another.
	most := make(chan int32, 1)
	stop := make(chan struct{})
	go func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		var m int32
		for {
			m = max(m, s.Pool().Stat().AcquiredConns())
			select {
			case <-stop:
				most <- m
				return
			case <-tick.C:
			}
		}
	}()
	if err := g.release(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-free:
		if err != nil {
			t.Errorf("u::free: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("u::free: no answer in 10 s")
	}
	<-time.After(time.Duration(len(held)) * 200 * time.Millisecond) // the span observed: a bound, not a wait for a condition
	close(stop)
	if m := <-most; m >= cfg.MaxConns {
		t.Errorf("with %d of a batch's rows held elsewhere, its writes held %d of the pool's %d connections at once, none left for the lease's renewals",
			len(held), m, cfg.MaxConns)
	}
}
