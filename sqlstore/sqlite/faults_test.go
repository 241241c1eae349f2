package sqlite_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/sqlite"
)

// reopening is a store whose SQLite handle is closed and reopened on the
// same file under the runtime's feet: a call that meets the closed
// handle fails as a lost connection would.
type reopening struct {
	path string

	mu sync.Mutex
	s  *sqlite.Store // guarded by mu
	qa workers.QueueAuthorizer
	wa workers.WatchAuthorizer
}

func (r *reopening) cur() *sqlite.Store {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.s
}

// reopen closes the handle and opens a new one on the file.
func (r *reopening) reopen(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.s.Close(); err != nil {
		return err
	}
	s, err := sqlite.Open(ctx, r.path)
	if err != nil {
		return err
	}
	r.s = s
	return nil
}

func (r *reopening) GetTask(ctx context.Context, id string) (workers.Record, error) {
	return r.cur().GetTask(ctx, id)
}
func (r *reopening) InsertTask(ctx context.Context, rec workers.Record) error {
	return r.cur().InsertTask(ctx, rec)
}
func (r *reopening) SetTask(ctx context.Context, rec workers.Record) error {
	return r.cur().SetTask(ctx, rec)
}
func (r *reopening) ReplaceTask(ctx context.Context, rec workers.Record, prev string) error {
	return r.cur().ReplaceTask(ctx, rec, prev)
}
func (r *reopening) TransitionTask(ctx context.Context, id, runID string, from []workers.Status, next workers.State) (bool, error) {
	return r.cur().TransitionTask(ctx, id, runID, from, next)
}
func (r *reopening) AddWatcher(ctx context.Context, id, runID, watcher string) (bool, error) {
	return r.cur().AddWatcher(ctx, id, runID, watcher)
}
func (r *reopening) ListTasks(ctx context.Context, f workers.Filter) ([]workers.Record, error) {
	return r.cur().ListTasks(ctx, f)
}
func (r *reopening) DeleteFinished(ctx context.Context, cutoff time.Time) (int, error) {
	return r.cur().DeleteFinished(ctx, cutoff)
}
func (r *reopening) RenewLease(ctx context.Context, instance string, ttl time.Duration) (bool, error) {
	return r.cur().RenewLease(ctx, instance, ttl)
}
func (r *reopening) ReleaseLease(ctx context.Context, instance string) error {
	return r.cur().ReleaseLease(ctx, instance)
}
func (r *reopening) LiveInstances(ctx context.Context) ([]string, error) {
	return r.cur().LiveInstances(ctx)
}
func (r *reopening) QueueAuthorizer() workers.QueueAuthorizer     { return r.qa }
func (r *reopening) SetQueueAuthorizer(a workers.QueueAuthorizer) { r.qa = a }
func (r *reopening) WatchAuthorizer() workers.WatchAuthorizer     { return r.wa }
func (r *reopening) SetWatchAuthorizer(a workers.WatchAuthorizer) { r.wa = a }

var (
	_ workers.Store  = (*reopening)(nil)
	_ workers.Leaser = (*reopening)(nil)
)

// TestReopenedFileStrandsNothing runs a couple of hundred short tasks
// while the store's handle on the file is closed and reopened every 100ms:
// every acknowledged submission reaches a terminal record, Wait returns
// for each, and a refused one leaves nothing live.
func TestReopenedFileStrandsNothing(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "tasks.db")
	first := openAt(t, path) // migrated; closed by the first reopen
	r := &reopening{path: path, s: first}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	rt := workers.NewRuntime[workers.Store](r, workers.Config{LeaseInterval: 100 * time.Millisecond})
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer scancel()
		if err := rt.Shutdown(sctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := r.cur().Close(); err != nil && r.cur() != first {
			t.Error(err)
		}
	}()
	if err := rt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var reopened atomic.Int64
	stop := make(chan struct{})
	var faults sync.WaitGroup
	faults.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if err := r.reopen(ctx); err != nil {
				t.Errorf("reopen: %v", err)
				return
			}
			reopened.Add(1)
		}
	})

	alice := workers.MustOwner("alice")
	// At least 200 tasks, and submissions until the file was reopened
	// a few times: on a fast machine 200 tasks end before the first
	// reopen, and the test would prove nothing.
	const tasks, reopens = 200, 3
	more := func(i int) bool {
		return i <= tasks || (reopened.Load() < reopens && ctx.Err() == nil)
	}
	var (
		mu            sync.Mutex
		acked, nacked []string
		next          atomic.Int64
		subs          sync.WaitGroup
	)
	for range 8 {
		subs.Go(func() {
			for i := int(next.Add(1)); more(i); i = int(next.Add(1)) {
				work := time.Duration(1+rand.IntN(10)) * time.Millisecond
				sub, err := rt.Submit(ctx, "fault-"+strconv.Itoa(i), func(ctx context.Context, _ *workers.Task) (any, error) {
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
					nacked = append(nacked, "alice::fault-"+strconv.Itoa(i))
					if len(nacked) < 3 {
						t.Log(err)
					}
				} else {
					acked = append(acked, sub.ID)
				}
				mu.Unlock()
			}
		})
	}
	subs.Wait()
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

	check := openAt(t, path)
	for _, id := range acked {
		rec, err := check.GetTask(ctx, id)
		if err != nil {
			t.Fatalf("acknowledged %s: %v", id, err)
		}
		if !rec.Status.Terminal() {
			t.Errorf("acknowledged %s is %s", id, rec.Status)
		}
	}
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
	t.Logf("%d acknowledged, %d refused, %d reopens, %d Wait errors retried", len(acked), len(nacked), reopened.Load(), waitErrs)
	if reopened.Load() == 0 {
		t.Error("the file was never reopened: the test proved nothing")
	}
}
