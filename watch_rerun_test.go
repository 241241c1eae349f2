package workers

import (
	"context"
	"iter"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A Watch of a run that another runtime executes (here: a second runtime
// over the same MemStore, as replicas share a SQL store) must end with
// that run's end, or an error, when the run ends and its key is re-run
// before this runtime reads the end. It must never go from run A's
// RUNNING straight on to run B: the doc promises "ending after the
// terminal one" and "the terminal one is always delivered, last", and a
// Watch of a run of this runtime ends with A's end in the same case.
func TestWatchOfAnotherRuntimesRunNeverSkipsItsEndForARerun(t *testing.T) {
	store := NewMemStore()
	rt1 := newRuntime(t, store, Config{})
	rt2 := newRuntime(t, store, Config{})
	a := newGate()
	subA, err := rt2.Submit(ctx, "job", a.fn, alice)
	require.NoError(t, err)
	wait(t, a.started, "run A to start")

	next, stop := iter.Pull2(rt1.Watch(ctx, subA.ID, alice))
	defer stop()
	pullRunning(t, next, subA.RunID)

	// While the consumer holds its first snapshot, run A ends and the
	// owner submits the key again, through the same other runtime.
	a.open()
	settled(t, rt2, subA.ID)
	b := newGate()
	t.Cleanup(b.open)
	subB, err := rt2.Submit(ctx, "job", b.fn, alice)
	require.NoError(t, err)
	require.NotEqual(t, subA.RunID, subB.RunID)
	wait(t, b.started, "run B to start")

	snap, err, ok := next()
	require.True(t, ok, "the stream ended with nothing after run A's RUNNING")
	if err != nil {
		return // ended without A's end, as the doc's ErrNotFound case: no new run shown
	}
	require.Equal(t, subA.RunID, snap.RunID,
		"after run A's RUNNING the Watch yielded run B (%s, %s) without run A's end", snap.RunID, snap.Status)
	require.True(t, snap.Status.Terminal(), "run A's next snapshot is its end")
}

// readGate is a store without notices (a MemStore seen as a bare Store)
// whose next GetTask made with a context tagged watchTag, once armed,
// waits before it reads until released.
type readGate struct {
	Store
	armed   atomic.Bool
	reading chan struct{}
	release chan struct{}
}

type watchTag struct{}

func (s *readGate) GetTask(ctx context.Context, id string) (Record, error) {
	if ctx.Value(watchTag{}) != nil && s.armed.CompareAndSwap(true, false) {
		close(s.reading)
		<-s.release
	}
	return s.Store.GetTask(ctx, id)
}

// eventLog is an observer that keeps the events it hears, for a test to
// wait on; one it has no room for is dropped.
type eventLog chan Event

func newEventLog() eventLog { return make(eventLog, 64) }

func (l eventLog) Observe(_ context.Context, e Event) {
	select {
	case l <- e:
	default:
	}
}

// wait waits for an event of kind of run runID, which comes after the
// hub has published the change to the streams.
func (l eventLog) wait(t *testing.T, kind EventKind, runID string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case e := <-l:
			if e.Kind == kind && e.RunID == runID {
				return
			}
		case <-deadline:
			t.Fatalf("timed out waiting for %v of %s", kind, runID)
		}
	}
}

// A Watch of this runtime's own run, over a store without notices, reads
// the store every second. If the run ends and the key is re-run while
// that read is in flight, the read returns the new run, and the old
// run's end, which the runtime had already offered to the stream's
// inbox, is then dropped as "a late report of an earlier run": the
// stream goes from run A's RUNNING to run B and never shows A's end.
func TestWatchKeepsAnEndThatLandsDuringItsPollRead(t *testing.T) {
	events := newEventLog()
	s := &readGate{Store: NewMemStore(), reading: make(chan struct{}), release: make(chan struct{})}
	rt := newRuntime(t, s, Config{Observers: []Observer{events}})
	a := newGate()
	subA, err := rt.Submit(ctx, "job", a.fn, alice)
	require.NoError(t, err)
	wait(t, a.started, "run A to start")

	wctx := context.WithValue(ctx, watchTag{}, true)
	next, stop := iter.Pull2(rt.Watch(wctx, subA.ID, alice))
	defer stop()
	pullRunning(t, next, subA.RunID)

	type got struct {
		snap Snapshot
		err  error
		ok   bool
	}
	results := make(chan got, 1)
	s.armed.Store(true)
	go func() {
		snap, err, ok := next()
		results <- got{snap, err, ok}
	}()
	var once sync.Once
	release := func() { once.Do(func() { close(s.release) }) }
	pulled := false
	defer func() { // on a failure below: let the pull end before stop runs
		release()
		if !pulled {
			select {
			case <-results:
			case <-time.After(10 * time.Second):
			}
		}
	}()
	wait(t, s.reading, "the Watch's poll read (after about a second)")

	// While that read waits: run A ends, and the owner re-runs the key.
	a.open()
	events.wait(t, EventFinished, subA.RunID) // published to the stream's inbox
	b := newGate()
	t.Cleanup(b.open)
	subB, err := rt.Submit(ctx, "job", b.fn, alice)
	require.NoError(t, err)
	require.NotEqual(t, subA.RunID, subB.RunID)
	events.wait(t, EventStarted, subB.RunID)
	release()

	var r got
	select {
	case r = <-results:
		pulled = true
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting for the Watch's next snapshot")
	}
	require.True(t, r.ok, "the stream ended with nothing after run A's RUNNING")
	require.NoError(t, r.err)
	require.Equal(t, subA.RunID, r.snap.RunID,
		"after run A's RUNNING the Watch yielded run B (%s, %s): run A's end, held in its inbox, was dropped", r.snap.RunID, r.snap.Status)
	require.Equal(t, StatusCompleted, r.snap.Status)
}

// pullRunning pulls a Watch's first snapshot, which must show run runID
// RUNNING.
func pullRunning(t *testing.T, next func() (Snapshot, error, bool), runID string) {
	t.Helper()
	first, err, ok := next()
	require.True(t, ok)
	require.NoError(t, err)
	require.Equal(t, runID, first.RunID)
	require.Equal(t, StatusRunning, first.Status)
}
