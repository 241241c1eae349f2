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

// heldRead is a store without notices (a MemStore seen as a bare Store,
// shared by two runtimes as replicas share a SQL store) whose next
// GetTask made with a context tagged watchTag, once armed, reads the
// record and then holds the answer until released: a read whose answer
// is slow to come back.
type heldRead struct {
	Store
	armed   atomic.Bool
	reading chan struct{}
	release chan struct{}
}

func (s *heldRead) GetTask(ctx context.Context, id string) (Record, error) {
	rec, err := s.Store.GetTask(ctx, id)
	if ctx.Value(watchTag{}) != nil && s.armed.CompareAndSwap(true, false) {
		close(s.reading)
		<-s.release
	}
	return rec, err
}

// Bob joins alice's global task through replica rt2; the run executes on
// rt1, whose copy of its watchers does not name him. Bob watches it on
// rt1: the Watch's first read finds him among the record's watchers and
// shows him run A RUNNING. Run A's end, which rt1 reports, reaches the
// stream as a bare "read again" (the run does not know bob), and alice
// re-runs the key on rt1 (watchers: alice) before that read. Bob had
// not read run A's end, which this runtime reported: Watch's doc says
// the stream then "ends with the end of the run the caller followed";
// only an end made and re-run by another process is excused, where the
// stream ends with ErrNotFound.
func TestWatchOfAJoinedRunGetsItsEndThoughTheKeyIsRerunHere(t *testing.T) {
	mem := NewMemStore()
	mem.SetWatchAuthorizer(func(string, []string, string) bool { return true })
	s := &heldRead{Store: mem, reading: make(chan struct{}), release: make(chan struct{})}
	events := newEventLog()
	rt1 := newRuntime(t, s, Config{Observers: []Observer{events}})
	rt2 := newRuntime(t, s, Config{})

	a := newGate()
	subA, err := rt1.Submit(ctx, "shared", a.fn, alice, WithScope(ScopeGlobal))
	require.NoError(t, err)
	wait(t, a.started, "run A to start")
	joined, err := rt2.Submit(ctx, "shared", noop, bob, WithScope(ScopeGlobal))
	require.NoError(t, err)
	require.True(t, joined.Joined, "bob joins run A through rt2")
	require.Equal(t, subA.RunID, joined.RunID)

	wctx := context.WithValue(ctx, watchTag{}, true)
	s.armed.Store(true)
	next, stop := iter.Pull2(rt1.Watch(wctx, subA.ID, bob))
	defer stop()
	type got struct {
		snap Snapshot
		err  error
		ok   bool
	}
	results := make(chan got, 2)
	pull := func() {
		snap, err, ok := next()
		results <- got{snap, err, ok}
	}
	var once sync.Once
	release := func() { once.Do(func() { close(s.release) }) }
	defer release()
	go pull()
	wait(t, s.reading, "the Watch's first read")

	// The read found run A RUNNING with bob; before its answer arrives,
	// run A ends and alice re-runs the key here.
	a.open()
	events.wait(t, EventFinished, subA.RunID)
	b := newGate()
	t.Cleanup(b.open)
	subB, err := rt1.Submit(ctx, "shared", b.fn, alice, WithScope(ScopeGlobal))
	require.NoError(t, err)
	require.False(t, subB.Joined)
	events.wait(t, EventStarted, subB.RunID)
	release()

	receive := func() got {
		t.Helper()
		select {
		case r := <-results:
			return r
		case <-time.After(10 * time.Second):
			t.Fatal("timed out waiting for the Watch's next snapshot")
		}
		return got{}
	}
	first := receive()
	require.True(t, first.ok)
	require.NoError(t, first.err)
	require.Equal(t, subA.RunID, first.snap.RunID)
	require.Equal(t, StatusRunning, first.snap.Status)

	go pull()
	r := receive()
	require.True(t, r.ok, "the stream ended with nothing after run A's RUNNING")
	require.NoError(t, r.err, "bob was shown run A live, and this runtime reported its end: the stream ends with that end")
	require.Equal(t, subA.RunID, r.snap.RunID)
	require.Equal(t, StatusCompleted, r.snap.Status)
}
