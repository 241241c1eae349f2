package postgres_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// TestStoreFaults runs a few hundred short tasks while the database drops
// the runtime's connections, and checks that every acknowledged
// submission reaches a terminal record and that Wait returns for each.
// The Terminate case kills the store's backends over and over; the
// Restart case, which needs control of the server and is run only with
// WORKERS_TEST_PG_RESTART=1, restarts PostgreSQL mid-run.
func TestStoreFaults(t *testing.T) {
	testDSN(t)
	t.Parallel()
	t.Run("Terminate", func(t *testing.T) {
		t.Parallel()
		storeFaults(t, func(sc scratch, app string) {
			_, _ = sc.pool.Exec(context.Background(),
				`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, app)
		}, 100*time.Millisecond)
	})
	t.Run("Restart", func(t *testing.T) {
		if os.Getenv("WORKERS_TEST_PG_RESTART") != "1" {
			t.Skip("restarting PostgreSQL needs control of the server: set WORKERS_TEST_PG_RESTART=1")
		}
		restarted := false
		storeFaults(t, func(scratch, string) {
			if restarted {
				return
			}
			restarted = true
			out, err := exec.Command("sh", "-c", `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql | sort -V | tail -n 1) main restart`).CombinedOutput()
			if err != nil {
				t.Errorf("restart PostgreSQL: %v: %s", err, out)
			}
		}, 50*time.Millisecond)
	})
}

// storeFaults submits tasks through a runtime whose pool is named app
// while fault runs every interval, then lets the database heal and
// checks the records.
func storeFaults(t *testing.T, fault func(sc scratch, app string), every time.Duration) {
	sc := newScratchT(t)
	s, app := sc.namedStore(t, "workers-faults")
	rt := workers.NewRuntime(s, workers.Config{LeaseInterval: 100 * time.Millisecond})

	stop, once := make(chan struct{}), make(chan struct{})
	var faults sync.WaitGroup
	faults.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			case <-tick.C:
				fault(sc, app)
				if n == 0 {
					close(once)
				}
			}
		}
	})

	const n = 300
	alice := workers.MustOwner("alice")
	var (
		mu    sync.Mutex
		acked []string
		wg    sync.WaitGroup
	)
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < n; i += 4 {
				d := time.Duration(5+rand.IntN(25)) * time.Millisecond
				sub, err := rt.Submit(t.Context(), "task-"+strconv.Itoa(i), func(ctx context.Context, tk *workers.Task) (any, error) {
					tk.SetProgress(50)
					select {
					case <-time.After(d):
						return i, nil
					case <-ctx.Done():
						return nil, context.Cause(ctx)
					}
				}, alice)
				if err != nil {
					continue // refused: the caller knows; nothing was acknowledged
				}
				mu.Lock()
				acked = append(acked, sub.ID)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	<-once // the runs may still be going: the fault hits them at least once
	close(stop)
	faults.Wait()
	t.Logf("%d of %d submissions acknowledged under faults", len(acked), n)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, id := range acked {
		snap, err := rt.Wait(ctx, id, alice)
		if err != nil {
			t.Fatalf("Wait(%s): %v", id, err)
		}
		if !snap.Status.Terminal() {
			t.Errorf("%s: Wait returned %s", id, snap.Status)
		}
		if snap.Status != workers.StatusCompleted && !errors.Is(snap.Err(), workers.ErrAbandoned) {
			t.Errorf("%s ended %s (%s), want COMPLETED, or abandoned after a failed insert", id, snap.Status, snap.Error)
		}
	}
	if err := rt.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown after the faults: %v", err)
	}
	recs, err := s.ListTasks(ctx, workers.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if !r.Status.Terminal() {
			t.Errorf("%s left %s after Shutdown", r.ID, r.Status)
		}
	}
}
