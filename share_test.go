package workers

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// progressFaults is a MemStore, its leases and notices included, whose
// progress writes (a RUNNING state over a RUNNING record) fail while
// failing is set.
type progressFaults struct {
	*MemStore
	failing atomic.Bool
}

func (s *progressFaults) TransitionTask(ctx context.Context, id, runID string, from []Status, next State) (bool, error) {
	if s.failing.Load() && next.Status == StatusRunning && len(from) == 1 && from[0] == StatusRunning {
		return false, errStoreDown
	}
	return s.MemStore.TransitionTask(ctx, id, runID, from, next)
}

// A run whose progress writes keep failing is logged once, not at every
// pass, until one of its writes lands; a failure after that is logged
// again. Each pass tries every such run again.
func TestAFailingProgressWriteIsLoggedOnceUntilOneLands(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var errs atomic.Int32
		s := &progressFaults{MemStore: NewMemStore()}
		s.failing.Store(true)
		rt := NewRuntime[Store](s, Config{Logger: slog.New(errorCounter{&errs}), SyncInterval: time.Hour, ProgressInterval: 10 * time.Millisecond})
		const runs = 3
		steps := make([]chan<- int, runs)
		ids := make([]string, runs)
		for i := range steps {
			var sub Submission
			sub, steps[i] = stepped(t, rt, "k"+string(rune('a'+i)), alice)
			ids[i] = sub.ID
		}
		defer func() {
			for _, ch := range steps {
				close(ch)
			}
			synctest.Wait()
			assert.NoError(t, rt.Shutdown(ctx))
		}()
		stored := func(p int) {
			t.Helper()
			for _, id := range ids {
				rec, err := s.MemStore.GetTask(ctx, id)
				require.NoError(t, err)
				assert.Equal(t, p, rec.Progress, id)
			}
		}
		setAll := func(p int) {
			for _, ch := range steps {
				ch <- p
			}
			time.Sleep(100 * time.Millisecond) // ten passes
			synctest.Wait()
		}

		setAll(50)
		assert.EqualValues(t, runs, errs.Load(), "a run's failing progress writes were logged more than once")
		stored(0)
		s.failing.Store(false)
		time.Sleep(20 * time.Millisecond)
		synctest.Wait()
		stored(50)
		s.failing.Store(true)
		setAll(60)
		assert.EqualValues(t, 2*runs, errs.Load(), "a failure after a write landed was not logged")
	})
}

// ProgressInterval defaults to a second over a store processes share,
// and a negative value turns it off: progress is then stored by the sync
// loop only.
func TestProgressIntervalDefaultsAndTurnsOff(t *testing.T) {
	mem := NewMemStore()
	assert.Equal(t, time.Second, NewRuntime(mem, Config{}).cfg.ProgressInterval, "over a MemStore")
	assert.Equal(t, time.Second, NewRuntime(leasedNoNotices{mem, mem}, Config{}).cfg.ProgressInterval, "over a shared store")
	assert.Zero(t, NewRuntime(bareStore{mem}, Config{}).cfg.ProgressInterval, "over a store no other process shares")

	synctest.Test(t, func(t *testing.T) {
		mem := NewMemStore()
		rt := NewRuntime(leasedNoNotices{mem, mem}, Config{ProgressInterval: -1, SyncInterval: time.Minute})
		require.NoError(t, rt.Start(ctx))
		sub, step := stepped(t, rt, "k", alice)
		step <- 40
		time.Sleep(10 * time.Second)
		synctest.Wait()
		rec, err := mem.GetTask(ctx, sub.ID)
		require.NoError(t, err)
		assert.Zero(t, rec.Progress, "progress was written with ProgressInterval off")
		time.Sleep(time.Minute)
		synctest.Wait()
		rec, err = mem.GetTask(ctx, sub.ID)
		require.NoError(t, err)
		assert.Equal(t, 40, rec.Progress, "the sync loop")
		close(step)
		_, err = rt.Wait(ctx, sub.ID, alice)
		require.NoError(t, err)
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// Over a MemStore, progress is written only while another runtime
// listens to the store: a runtime alone reads its runs' progress live,
// and nobody else reads the store.
func TestProgressOverAMemStoreIsWrittenOnlyForAnotherRuntime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemStore()
		rt := NewRuntime(mem, Config{SyncInterval: time.Hour})
		require.NoError(t, rt.Start(ctx))
		synctest.Wait() // its listener's Resync checked every run (none) and wrote their progress
		sub, step := stepped(t, rt, "k", alice)
		stored := func() int {
			rec, err := mem.GetTask(ctx, sub.ID)
			require.NoError(t, err)
			return rec.Progress
		}
		step <- 40
		time.Sleep(5 * time.Second)
		synctest.Wait()
		assert.Zero(t, stored(), "written with nobody else to read it")
		snap, err := rt.Status(ctx, sub.ID, alice)
		require.NoError(t, err)
		assert.Equal(t, 40, snap.Progress, "the runtime's own Status, live")

		other := NewRuntime(mem, Config{})
		require.NoError(t, other.Start(ctx)) // listens
		synctest.Wait()
		step <- 41
		time.Sleep(time.Second)
		synctest.Wait()
		assert.Equal(t, 41, stored(), "not written with another runtime listening")
		close(step)
		_, err = rt.Wait(ctx, sub.ID, alice)
		require.NoError(t, err)
		require.NoError(t, other.Shutdown(ctx))
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// A Wait on a running task reads its record once per change that may
// end it, not once per progress write: here its progress is written
// fifty times while it waits, by this runtime and, for a Wait in
// another runtime, by the one that runs it.
func TestWaitReadsNothingForProgress(t *testing.T) {
	for _, elsewhere := range []bool{false, true} {
		t.Run(fmt.Sprintf("run elsewhere=%v", elsewhere), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := NewMemStore()
				counter := &readCounter{MemStore: mem, reads: map[string]int{}}
				cfg := Config{ProgressInterval: 20 * time.Millisecond, SyncInterval: time.Hour}
				waiter := NewRuntime[Store](counter, cfg) // not a *MemStore: it shares progress
				runner := waiter
				if elsewhere {
					runner = NewRuntime[Store](leasedNoNotices{bareStore{mem}, mem}, cfg)
					require.NoError(t, waiter.Start(ctx))
					synctest.Wait()
				}
				sub, step := stepped(t, runner, "k", alice)
				waited := make(chan error, 1)
				go func() {
					_, err := waiter.Wait(context.WithValue(ctx, tagged{}, "wait"), sub.ID, alice)
					waited <- err
				}()
				synctest.Wait()
				for p := 1; p <= 50; p++ {
					step <- p
					time.Sleep(20 * time.Millisecond)
				}
				close(step)
				require.NoError(t, <-waited)
				assert.LessOrEqual(t, counter.count("wait"), 4, "Wait read the record for progress writes")
				rec, err := mem.GetTask(ctx, sub.ID)
				require.NoError(t, err)
				assert.Equal(t, 50, rec.Progress, "the progress was written")
				require.NoError(t, runner.Shutdown(ctx))
				require.NoError(t, waiter.Shutdown(ctx))
			})
		})
	}
}
