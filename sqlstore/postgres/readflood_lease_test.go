package postgres_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// slowRead marks the context of a read that the database answers slowly
// (see slowReads).
type slowRead struct{}

// slowReads makes each statement whose context carries slowRead hold its
// connection for delay before it goes, as a read the database takes long
// to answer does (a listing filtered over a long history, a database
// under load), or until its context ends.
type slowReads struct{ delay time.Duration }

func (r slowReads) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	if ctx.Value(slowRead{}) != nil {
		t := time.NewTimer(r.delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
	return ctx
}

func (slowReads) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A spike of slow reads (the HTTP routes' listings and status reads, many
// times as many at once as the pool has connections) takes turns with
// the replica's own statements for the pool's connections, but it does
// not take them all: the lease's renewals and the runs' writes still get
// one in time, so the replica keeps its lease, its run stays RUNNING and
// its outcome lands.
func TestASpikeOfSlowReadsDoesNotCostTheReplicaItsLease(t *testing.T) {
	sc := newScratchT(t)
	rt, logs, conns := slowReadRuntime(t, sc)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := rt.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	}()
	alice := workers.MustOwner("alice")

	done, err := rt.Submit(t.Context(), "done", func(context.Context, *workers.Task) (any, error) { return "ok", nil }, alice)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Wait(t.Context(), done.ID, alice); err != nil {
		t.Fatal(err)
	}
	sub, release, cut := startBlocked(t, rt, "steady", alice)

	// Eight readers per connection, each reading again as soon as it is
	// answered.
	readers := 8 * conns
	stop := floodReads(t, rt, readers, done.ID, alice)
	select {
	case err := <-cut:
		stop()
		t.Fatalf("with %d slow reads at once over a pool of %d, the replica's run was cut off: %v\n%s",
			readers, conns, err, grepLines(logs.String(), "lease"))
	case <-time.After(3 * time.Second): // three lease lengths
	}
	// The outcome lands under the spike; Wait's own reads take their
	// turns with the spike's, a few slow reads' time each.
	close(release)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	begin := time.Now()
	snap, err := rt.Wait(ctx, sub.ID, alice)
	t.Logf("Wait took %v under the spike", time.Since(begin))
	stop()
	if err != nil || snap.Status != workers.StatusCompleted {
		t.Fatalf("the run's outcome under the spike of reads: %v, %v\n%s", snap.Status, err, grepLines(logs.String(), "lease"))
	}
	if l := grepLines(logs.String(), "lease"); l != "" {
		t.Errorf("the lease under the spike of reads:\n%s", l)
	}
}

// slowReadRuntime starts a runtime over a store of sc's schema whose pool
// has four connections, which it returns, and whose statements made
// under slowRead hold theirs 100 ms (see slowReads), with a lease of a
// second renewed every 100 ms; its logs are returned too. The caller
// shuts it down.
func slowReadRuntime(t *testing.T, sc scratch) (*workers.Runtime[*postgres.Store], *lockedBuffer, int) {
	t.Helper()
	cfg := testConfig(t)
	cfg.MaxConns = 4
	cfg.ConnConfig.Tracer = slowReads{delay: 100 * time.Millisecond}
	s := storeOver(t, cfg, postgres.WithSchema(sc.schema))
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	rt := workers.NewRuntime(s, workers.Config{LeaseInterval: 100 * time.Millisecond, LeaseTTL: time.Second, ShutdownGrace: -1,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err := rt.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	return rt, logs, int(cfg.MaxConns)
}

// floodReads starts readers goroutines that read for auth, each again as
// soon as it is answered, under slowRead: half a ListPage of the
// completed tasks, half the Status of task id. The stop it returns ends
// them and waits for them.
func floodReads(t *testing.T, rt *workers.Runtime[*postgres.Store], readers int, id string, auth workers.TaskAuthority) (stop func()) {
	flood, cancel := context.WithCancel(context.WithValue(t.Context(), slowRead{}, true))
	var wg sync.WaitGroup
	for i := range readers {
		wg.Go(func() {
			for flood.Err() == nil {
				if i%2 == 0 {
					_, _ = rt.ListPage(flood, auth, workers.WithStatus(workers.StatusCompleted))
				} else {
					_, _ = rt.Status(flood, id, auth)
				}
			}
		})
	}
	return func() {
		cancel()
		wg.Wait()
	}
}
