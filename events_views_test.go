package workers

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A run whose last published snapshot is PENDING (a stream saw it queued,
// then left) and which started while nobody subscribed has its progress
// offered to a later stream at once: not only once the sync loop writes
// it, or, over a store without leases or notices, never.
func TestProgressReachesAStreamAfterARunStartedUnseen(t *testing.T) {
	for name, store := range map[string]func() Store{
		"MemStore":      func() Store { return NewMemStore() },
		"a plain store": func() Store { return bareStore{NewMemStore()} },
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rt := NewRuntime(store(), Config{})
				head := newGate()
				_, err := rt.SubmitSequential(ctx, "q", "head", head.fn, alice)
				require.NoError(t, err)
				<-head.started

				// A first stream sees x submitted PENDING, then leaves.
				_, leave := streamed(ctx, rt, alice)
				synctest.Wait()
				step := make(chan int)
				started := make(chan struct{})
				sub, err := rt.SubmitSequential(ctx, "q", "x", func(_ context.Context, tk *Task) (any, error) {
					close(started)
					for p := range step {
						tk.SetProgress(p)
					}
					return nil, nil
				}, alice)
				require.NoError(t, err)
				synctest.Wait()
				leave()
				synctest.Wait()
				require.Zero(t, rt.hub.n.Load())

				head.open() // x starts while nobody subscribes
				<-started
				synctest.Wait()

				seen, stop := streamed(ctx, rt, alice)
				synctest.Wait()
				first := drain(seen)
				require.Len(t, first, 1)
				require.Equal(t, sub.ID, first[0].ID)
				require.Equal(t, StatusRunning, first[0].Status)
				step <- 50
				synctest.Wait()
				var got []int
				for _, snap := range drain(seen) {
					assert.Equal(t, sub.ID, snap.ID)
					assert.False(t, snap.StartedAt.IsZero())
					got = append(got, snap.Progress)
				}
				assert.Equal(t, []int{50}, got)
				close(step)
				synctest.Wait()
				stop()
				require.NoError(t, rt.Shutdown(ctx))
			})
		})
	}
}

// heldWrites is a MemStore whose TransitionTask calls wait while its gate
// is blocked.
type heldWrites struct {
	*MemStore
	holdGate
}

func (s *heldWrites) TransitionTask(ctx context.Context, id, runID string, from []Status, next State) (bool, error) {
	s.wait()
	return s.MemStore.TransitionTask(ctx, id, runID, from, next)
}

// The progress a stream is offered of a run that started before anyone
// subscribed always carries the run's start time, also while a write of
// the run's holds its state.
func TestPumpedProgressKeepsTheStartTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemStore()
		hw := &heldWrites{MemStore: mem}
		rt := NewRuntime[Store](leasedNoNotices{hw, mem}, Config{}) // shares progress every second
		sub, step := stepped(t, rt, "x", alice)
		synctest.Wait()
		seen, stop := streamed(ctx, rt, alice)
		synctest.Wait()
		first := <-seen
		require.Equal(t, StatusRunning, first.Status)
		require.False(t, first.StartedAt.IsZero())
		step <- 10
		synctest.Wait()
		hw.block()
		time.Sleep(1100 * time.Millisecond) // the share pass writes 10, and waits
		synctest.Wait()
		step <- 20
		synctest.Wait()
		hw.unblock()
		synctest.Wait()
		var progress []int
		for _, snap := range drain(seen) {
			if snap.ID == sub.ID && snap.Status == StatusRunning {
				assert.False(t, snap.StartedAt.IsZero(), "RUNNING at %d%% with no StartedAt", snap.Progress)
				progress = append(progress, snap.Progress)
			}
		}
		assert.Contains(t, progress, 20, "the last progress is shown")
		close(step)
		synctest.Wait()
		stop()
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// streamed ranges over rt.Subscribe(ctx, auth, opts...) on a goroutine
// and sends what it yields on the channel it returns (room for 64), until
// the stream ends; stop ends the stream and waits for the goroutine.
func streamed[S Store](ctx context.Context, rt *Runtime[S], auth TaskAuthority, opts ...ListOption) (_ <-chan Snapshot, stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	seen := make(chan Snapshot, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for snap, err := range rt.Subscribe(ctx, auth, opts...) {
			if err != nil {
				return
			}
			select {
			case seen <- snap:
			case <-ctx.Done():
				return
			}
		}
	}()
	return seen, func() { cancel(); <-done }
}

// drain returns what seen holds now.
func drain(seen <-chan Snapshot) []Snapshot {
	var out []Snapshot
	for len(seen) > 0 {
		out = append(out, <-seen)
	}
	return out
}

// A stream shows the end of another process's run once, even when the
// audience reader's read of its notice comes after the stream's own, and
// after as many other ends as the stream remembers.
func TestAStreamShowsAnEndOnceAfterManyOthers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemStore()
		gs := &gatedReads{MemStore: mem, readerOnly: true} // the audience reader's reads
		front, runner := NewRuntime[Store](gs, Config{}), NewRuntime(mem, Config{})
		require.NoError(t, front.Start(ctx))
		require.NoError(t, runner.Start(ctx))
		synctest.Wait()
		sctx, cancel := context.WithCancel(ctx)
		_ = front.Subscribe(sctx, MustOwner("carol")) // others subscribe: notices go through the reader
		xID, _ := ScopedTaskKey("x", bob)
		var mu sync.Mutex
		var xs []Snapshot
		done := make(chan struct{})
		go func() {
			defer close(done)
			for snap, err := range front.Subscribe(context.WithValue(sctx, tagged{}, "sys"), System) {
				if err != nil {
					return
				}
				if snap.ID == xID {
					mu.Lock()
					xs = append(xs, snap)
					mu.Unlock()
				}
			}
		}()
		synctest.Wait()
		for i := range maxTracked - 1 { // the stream remembers maxTracked-1 ends
			_, err := front.Submit(ctx, "own"+strconv.Itoa(i), noop, alice)
			require.NoError(t, err)
			if i%64 == 63 {
				synctest.Wait()
			}
		}
		synctest.Wait()
		g := newGate()
		_, err := runner.Submit(ctx, "x", g.fn, bob)
		require.NoError(t, err)
		<-g.started
		synctest.Wait() // the stream shows x RUNNING, and follows it

		gs.block() // the reader's reads wait
		g.open()
		settled(t, runner, xID)
		synctest.Wait() // the stream shows x's end
		_, err = front.Submit(ctx, "last", noop, alice)
		require.NoError(t, err)
		synctest.Wait() // one end more than the stream remembers
		gs.unblock()
		synctest.Wait()

		mu.Lock()
		ends := 0
		for _, s := range xs {
			if s.Status.Terminal() {
				ends++
			}
		}
		mu.Unlock()
		assert.Equal(t, 1, ends, "x's end was yielded %d times", ends)
		cancel()
		<-done
		require.NoError(t, runner.Shutdown(ctx))
		require.NoError(t, front.Shutdown(ctx))
	})
}
