package workers

import (
	"context"
	"iter"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// heldEnd is a MemStore whose next terminal write, once armed, lands and
// then holds its answer until release: the run's goroutine is between its
// end write and its report of that end, as any run briefly is.
type heldEnd struct {
	*MemStore
	armed   chan struct{} // closed to arm
	landed  chan struct{} // closed once the held write has landed
	release chan struct{} // closed to let it answer
}

func (s *heldEnd) TransitionTask(ctx context.Context, id, runID string, from []Status, next State) (bool, error) {
	ok, err := s.MemStore.TransitionTask(ctx, id, runID, from, next)
	select {
	case <-s.armed:
		if next.Status.Terminal() {
			select {
			case <-s.landed:
			default:
				close(s.landed)
				<-s.release
			}
		}
	default:
	}
	return ok, err
}

// One runtime runs both runs: run A's end lands, and its owner re-runs the
// key here before run A's goroutine reports that end. The Watch that
// showed run A RUNNING still ends with run A's end: the re-run's report
// makes it read the store, which holds run B; run A, finishing here,
// reports its end before it settles, and that late report of an earlier
// run is kept for the stream.
func TestWatchDeliversTheEndOfThisRuntimesRunReportedAfterItsRerun(t *testing.T) {
	s := &heldEnd{MemStore: NewMemStore(), armed: make(chan struct{}), landed: make(chan struct{}), release: make(chan struct{})}
	rt := newRuntime(t, s, Config{})
	a := newGate()
	subA, err := rt.Submit(ctx, "job", a.fn, alice)
	require.NoError(t, err)
	wait(t, a.started, "run A to start")
	tkA := a.task.Load()

	next, stop := iter.Pull2(rt.Watch(ctx, subA.ID, alice))
	defer stop()
	pullRunning(t, next, subA.RunID)

	close(s.armed)
	a.open() // run A returns; its COMPLETED write lands and is held
	wait(t, s.landed, "run A's end to land")

	b := newGate()
	t.Cleanup(b.open)
	subB, err := rt.Submit(ctx, "job", b.fn, alice)
	require.NoError(t, err)
	require.NotEqual(t, subA.RunID, subB.RunID)
	wait(t, b.started, "run B to start")

	close(s.release) // run A's goroutine reports its end, and settles
	eventually(t, tkA.isSettled, "run A to settle")

	snap, err, ok := next()
	require.True(t, ok, "the stream ended with nothing after run A's RUNNING")
	require.NoError(t, err, "the Watch of run A, ended COMPLETED by this very runtime, ended without its end")
	require.Equal(t, subA.RunID, snap.RunID)
	require.Equal(t, StatusCompleted, snap.Status)
}

// readSeen is heldEnd that also tells, once watching is closed, of the
// next read of a record: the Watch's, once run B's report reached it.
type readSeen struct {
	*heldEnd
	watching chan struct{} // closed to look for the read
	read     chan struct{} // closed at that read
	once     sync.Once
}

func (s *readSeen) GetTask(ctx context.Context, id string) (Record, error) {
	select {
	case <-s.watching:
		s.once.Do(func() { close(s.read) })
	default:
	}
	return s.heldEnd.GetTask(ctx, id)
}

// The same with a run that timed out, whose callback ignores its context:
// the run settles only when the callback returns, which here is never
// while the test looks. The Watch, which read the store when run B's
// report came and found no end of run A yet, ends with run A's end as
// soon as the run reports it, not once the run settles.
func TestWatchDeliversTheEndOfThisRuntimesTimedOutRunReportedAfterItsRerun(t *testing.T) {
	s := &readSeen{
		heldEnd:  &heldEnd{MemStore: NewMemStore(), armed: make(chan struct{}), landed: make(chan struct{}), release: make(chan struct{})},
		watching: make(chan struct{}), read: make(chan struct{}),
	}
	rt := newRuntime(t, s, Config{})
	heedless, started := make(chan struct{}), make(chan struct{})
	subA, err := rt.Submit(ctx, "job", func(context.Context, *Task) (any, error) {
		close(started)
		<-heedless // ignores its context
		return nil, nil
	}, alice, WithTimeout(200*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { close(heedless) })
	wait(t, started, "run A to start")
	next, stop := iter.Pull2(rt.Watch(ctx, subA.ID, alice))
	defer stop()
	pullRunning(t, next, subA.RunID)

	close(s.armed)
	wait(t, s.landed, "run A's timeout to land") // and held
	b := newGate()
	t.Cleanup(b.open)
	_, err = rt.Submit(ctx, "job", b.fn, alice)
	require.NoError(t, err)
	wait(t, b.started, "run B to start")

	type pulled struct {
		snap Snapshot
		err  error
	}
	got := make(chan pulled, 1)
	close(s.watching)
	go func() {
		snap, err, _ := next()
		got <- pulled{snap, err}
	}()
	wait(t, s.read, "the Watch to read the store") // it finds run B
	close(s.release)                               // run A reports its end; its callback runs on
	select {
	case p := <-got:
		require.NoError(t, p.err)
		require.Equal(t, subA.RunID, p.snap.RunID)
		require.True(t, p.snap.Status.Terminal(), "run A's end, %s", p.snap.Status)
	case <-time.After(10 * time.Second):
		close(heedless) // lets the run settle, and the pull end
		heedless = make(chan struct{})
		<-got
		t.Fatal("the Watch waited for the timed-out run to settle, not for its end")
	}
}
