package workers

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	alice = MustOwner("alice")
	bob   = MustOwner("bob")
	carol = MustOwner("carol")
)

// newRuntime returns a runtime over s that the test shuts down, requiring
// every run to settle.
func newRuntime[S Store](t testing.TB, s S, cfg Config) *Runtime[S] {
	t.Helper()
	rt := NewRuntime(s, cfg)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, rt.Shutdown(ctx))
	})
	return rt
}

// bareStore is a store seen through the Store interface alone, without
// the optional capabilities of the store it wraps (a MemStore's leases,
// notices and clearing): the store of the tests of the paths a runtime
// takes over a store that polls, or that has no leases.
type bareStore struct{ Store }

func memRuntime(t testing.TB) *Runtime[*MemStore] {
	return newRuntime(t, NewMemStore(), Config{})
}

// gate is a callback that signals when it starts and returns when
// released (with "released") or, unless stubborn, when its context ends
// (with the cause).
type gate struct {
	task     atomic.Pointer[Task] // the run, once started
	started  chan struct{}
	release  chan struct{}
	once     sync.Once
	stubborn bool
	ran      chan struct{} // closed when the callback has returned
	retOnce  sync.Once
}

func newGate() *gate {
	return &gate{started: make(chan struct{}), release: make(chan struct{}), ran: make(chan struct{})}
}

func stubbornGate() *gate { g := newGate(); g.stubborn = true; return g }

// startGated submits key as alice with a gate's callback on rt and waits
// until the run has started.
func startGated[S Store](t testing.TB, rt *Runtime[S], key string) (Submission, *gate) {
	t.Helper()
	g := newGate()
	sub, err := rt.Submit(ctx, key, g.fn, alice)
	require.NoError(t, err)
	wait(t, g.started, key+" to start")
	return sub, g
}

func (g *gate) fn(ctx context.Context, tk *Task) (any, error) {
	g.once.Do(func() {
		g.task.Store(tk)
		close(g.started)
	})
	defer g.retOnce.Do(func() { close(g.ran) })
	if g.stubborn {
		<-g.release
		return "released", nil
	}
	select {
	case <-g.release:
		return "released", nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

func (g *gate) open() { close(g.release) }

// wait blocks until ch is closed, failing the test after a deadline.
func wait(t testing.TB, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// eventually polls cond until it holds, failing the test after a deadline.
func eventually(t testing.TB, cond func() bool, what string) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// listening waits until n Listen calls listen to store.
func listening(t testing.TB, store *MemStore, n int) {
	t.Helper()
	eventually(t, func() bool {
		ls := store.listeners.Load()
		return ls != nil && len(*ls) == n
	}, strconv.Itoa(n)+" listeners")
}

// settled waits until the task reaches a terminal status and returns it.
func settled[S Store](t testing.TB, rt *Runtime[S], id string) Snapshot {
	t.Helper()
	var snap Snapshot
	eventually(t, func() bool {
		var err error
		snap, err = rt.Status(context.Background(), id, System)
		require.NoError(t, err)
		return snap.Status.Terminal()
	}, "task "+id+" to end")
	return snap
}

func noop(context.Context, *Task) (any, error) { return nil, nil }

// stepped submits key as auth on rt with a callback that sets each
// progress value sent on the channel it returns, and returns once the
// channel is closed.
func stepped[S Store](t testing.TB, rt *Runtime[S], key string, auth TaskAuthority, opts ...SubmitOption) (Submission, chan<- int) {
	t.Helper()
	step := make(chan int)
	sub, err := rt.Submit(ctx, key, func(_ context.Context, tk *Task) (any, error) {
		for p := range step {
			tk.SetProgress(p)
		}
		return nil, nil
	}, auth, opts...)
	require.NoError(t, err)
	return sub, step
}

func returns(v any, err error) Func {
	return func(context.Context, *Task) (any, error) { return v, err }
}

// submitOn submits fn as key on queue, or on its own goroutine when queue
// is "".
func submitOn[S Store](rt *Runtime[S], queue, key string, fn Func, auth TaskAuthority, opts ...SubmitOption) (Submission, error) {
	if queue == "" {
		return rt.Submit(ctx, key, fn, auth, opts...)
	}
	return rt.SubmitSequential(ctx, queue, key, fn, auth, opts...)
}

// holdGate makes the calls that pass through it (wait) wait from block
// until unblock: the test stores embed it.
type holdGate struct{ p atomic.Pointer[chan struct{}] }

func (g *holdGate) block() {
	ch := make(chan struct{})
	g.p.Store(&ch)
}

func (g *holdGate) unblock() {
	if ch := g.p.Swap(nil); ch != nil {
		close(*ch)
	}
}

func (g *holdGate) wait() {
	if ch := g.p.Load(); ch != nil {
		<-*ch
	}
}
