package postgres_test

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// The terminated-backends test's numbers.
const (
	faultTasks      = 300
	faultSubmitters = 8
	faultEvery      = 60 * time.Millisecond // how often the backends are terminated
)

// TestTerminatedBackendsStrandNothing runs a few hundred short tasks
// while the runtime's database connections (its pool and its listening
// connection) are terminated with pg_terminate_backend every 60ms. Some
// submissions fail: those were never acknowledged. Every acknowledged
// one reaches a terminal record, Wait returns for each, and no refused
// one leaves a live record behind.
func TestTerminatedBackendsStrandNothing(t *testing.T) {
	sc := newScratchT(t)
	sc.store(t) // migrate
	app := "workers_faults_" + strings.ToLower(crand.Text()[:10])
	cfg, err := pgxpool.ParseConfig(testDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := postgres.New(pool, postgres.WithSchema(sc.schema))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	rt := workers.NewRuntime(s, workers.Config{LeaseInterval: 100 * time.Millisecond})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer scancel()
		if err := rt.Shutdown(sctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	}()
	if err := rt.Start(ctx); err != nil {
		t.Fatal(err)
	}

	// The fault: every runtime connection, terminated, over and over.
	var terminated atomic.Int64
	stop := make(chan struct{})
	var faults sync.WaitGroup
	faults.Go(func() {
		tick := time.NewTicker(faultEvery)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			var n int64
			err := sc.pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n)
			if err != nil && ctx.Err() == nil {
				t.Errorf("terminate: %v", err)
			}
			terminated.Add(n)
		}
	})

	alice := workers.MustOwner("alice")
	var (
		mu     sync.Mutex
		acked  []string
		nacked []string // the ids of refused submissions
		failed = map[string]int{}
		next   atomic.Int64
		subs   sync.WaitGroup
	)
	for range faultSubmitters {
		subs.Go(func() {
			for i := int(next.Add(1)); i <= faultTasks; i = int(next.Add(1)) {
				work := time.Duration(1+rand.IntN(20)) * time.Millisecond
				sub, err := rt.Submit(ctx, "fault-"+strconv.Itoa(i), func(ctx context.Context, task *workers.Task) (any, error) {
					// The task's work, simulated: it takes a few ms.
					done := time.NewTimer(work)
					defer done.Stop()
					select {
					case <-done.C:
						return i, nil
					case <-ctx.Done():
						return nil, context.Cause(ctx)
					}
				}, alice)
				mu.Lock()
				if err != nil {
					failed[fmt.Sprintf("%T", errors.Unwrap(err))]++
					nacked = append(nacked, "alice::fault-"+strconv.Itoa(i))
				} else {
					acked = append(acked, sub.ID)
				}
				mu.Unlock()
			}
		})
	}
	subs.Wait()

	// Wait returns for every acknowledged submission, while the faults go
	// on. A Wait that meets a store error is asked again: the answer
	// wanted is the record's end.
	waitErrs := 0
	for _, id := range acked {
		for {
			snap, err := rt.Wait(ctx, id, alice)
			if err == nil {
				if !snap.Status.Terminal() {
					t.Errorf("Wait %s returned %s", id, snap.Status)
				}
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("Wait %s: %v", id, err)
			}
			waitErrs++
		}
	}
	close(stop)
	faults.Wait()

	// Every acknowledged submission has a terminal record, read by a
	// connection the faults never touched.
	check, err := postgres.New(sc.pool, postgres.WithSchema(sc.schema))
	if err != nil {
		t.Fatal(err)
	}
	defer check.Close()
	statuses := map[workers.Status]int{}
	for _, id := range acked {
		rec, err := check.GetTask(ctx, id)
		if err != nil {
			t.Fatalf("acknowledged %s: %v", id, err)
		}
		if !rec.Status.Terminal() {
			t.Errorf("acknowledged %s is %s", id, rec.Status)
		}
		statuses[rec.Status]++
	}
	// A refused submission leaves no live record behind once the runtime
	// has settled: none, or one ended (by the runtime's retries, or by
	// recovery).
	deadline := time.Now().Add(30 * time.Second)
	for _, id := range nacked {
		for {
			rec, err := check.GetTask(ctx, id)
			if errors.Is(err, workers.ErrNotFound) || (err == nil && rec.Status.Terminal()) {
				break
			}
			if err != nil {
				t.Fatalf("refused %s: %v", id, err)
			}
			if time.Now().After(deadline) {
				t.Fatalf("a refused submission left %s %s behind", id, rec.Status)
			}
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	t.Logf("%d submissions acknowledged, %d refused %v; %d backends terminated; %d Wait errors retried; outcomes %v",
		len(acked), faultTasks-len(acked), failed, terminated.Load(), waitErrs, statuses)
	if terminated.Load() == 0 {
		t.Error("no backend was terminated: the test proved nothing")
	}
}
