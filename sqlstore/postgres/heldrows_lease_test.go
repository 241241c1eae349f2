package postgres_test

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// A few task rows held locked by a transaction elsewhere (an
// administrator's open transaction) hold back only their own tasks'
// writes: the database answers everything else, so the replica keeps
// its lease, and its other runs go on. Here the outcome writes of as many
// held rows as the pool has connections wait on their rows, each on a
// connection, within StoreTimeout (LeaseTTL by default), while the lease
// renewals wait for a connection.
func TestHeldRowsDoNotCostTheReplicaItsLease(t *testing.T) {
	testDSN(t)
	sc := newScratchT(t)
	s := sc.store(t)
	conns := int(s.Pool().Config().MaxConns)
	logs := &lockedBuffer{}
	rt := workers.NewRuntime(s, workers.Config{LeaseInterval: 100 * time.Millisecond, LeaseTTL: time.Second, ShutdownGrace: -1,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err := rt.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	var held []pgx.Tx
	defer func() {
		for _, tx := range held { // the rows go first: Shutdown then settles every run
			_ = tx.Rollback(context.Background())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		begin := time.Now()
		if err := rt.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		t.Logf("Shutdown took %v", time.Since(begin))
	}()
	alice := workers.MustOwner("alice")

	bystander, release := heldRuns(t, sc, rt, alice, conns, &held)
	release() // each outcome write waits on its held row

	select {
	case err := <-bystander:
		t.Fatalf("with %d task rows held elsewhere (the pool's size), the replica's other run was cancelled: %v\n%s",
			conns, err, grepLines(logs.String(), "lease"))
	case <-time.After(3 * time.Second): // three lease lengths
	}
}

// heldRuns starts a bystander run, which sends why its context ended on
// bystander, and n runs whose task rows, once each has started, a
// transaction elsewhere holds locked (see holdRow), each appended to
// held. The runs end on release: their outcome writes then wait on their
// rows.
func heldRuns(t *testing.T, sc scratch, rt *workers.Runtime[*postgres.Store], alice workers.TaskAuthority, n int, held *[]pgx.Tx) (bystander <-chan error, release func()) {
	t.Helper()
	cause := make(chan error, 1)
	bystanderStarted := make(chan struct{})
	if _, err := rt.Submit(t.Context(), "bystander", func(ctx context.Context, _ *workers.Task) (any, error) {
		close(bystanderStarted)
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return nil, context.Cause(ctx)
	}, alice); err != nil {
		t.Fatal(err)
	}
	<-bystanderStarted

	stop := make(chan struct{})
	var started sync.WaitGroup
	var ids []string
	for i := range n {
		started.Add(1)
		sub, err := rt.Submit(t.Context(), "held-"+strconv.Itoa(i), func(context.Context, *workers.Task) (any, error) {
			started.Done()
			<-stop
			return "done", nil
		}, alice)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sub.ID)
	}
	started.Wait()
	for _, id := range ids {
		*held = append(*held, holdRow(t, sc, id))
	}
	return cause, func() { close(stop) }
}

func grepLines(s, what string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, what) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
