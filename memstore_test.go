package workers

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A listener is not told of the writes made for its own origin: a
// runtime's run writes (its context names it) and the records it inserts
// under its own run ids. It is told of everyone else's, in order.
func TestMemStoreSparesAListenerItsOwnWrites(t *testing.T) {
	s := NewMemStore()
	mine := context.WithValue(ctx, originKey{}, "inst-a")
	theirs := context.WithValue(ctx, originKey{}, "inst-b")
	lctx, stop := context.WithCancel(mine)
	heard := make(chan Change, 16)
	done := make(chan error, 1)
	go func() { done <- s.Listen(lctx, func(c Change) { heard <- c }) }()
	require.True(t, (<-heard).Resync, "the first notice is a Resync")

	require.NoError(t, s.InsertTask(ctx, Record{ID: "mine", RunID: "inst-a.1", State: State{Status: StatusPending}}))
	ok, err := s.TransitionTask(mine, "mine", "inst-a.1", fromPending, State{Status: StatusRunning, Attempt: 1})
	require.True(t, ok)
	require.NoError(t, err)
	require.NoError(t, s.InsertTask(theirs, Record{ID: "theirs", RunID: "inst-b.1", State: State{Status: StatusPending}}))
	require.NoError(t, s.InsertTask(ctx, Record{ID: "anyone", RunID: "x.1", State: State{Status: StatusPending}}))
	assert.Equal(t, Change{ID: "theirs", RunID: "inst-b.1", Status: StatusPending}, <-heard)
	assert.Equal(t, Change{ID: "anyone", RunID: "x.1", Status: StatusPending}, <-heard)
	stop()
	assert.ErrorIs(t, <-done, context.Canceled)
	assert.Empty(t, heard, "the listener's own write was not queued")
}

// errorCounter is a slog.Handler that counts the errors logged.
type errorCounter struct{ n *atomic.Int32 }

func (h errorCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelError }
func (h errorCounter) Handle(context.Context, slog.Record) error    { h.n.Add(1); return nil }
func (h errorCounter) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h errorCounter) WithGroup(string) slog.Handler                { return h }

// Over a MemStore, a runtime takes a lease with its first submission,
// and the Shutdown that settles everything releases it, once: a second
// Shutdown does not try again with its spent context (which logged an
// error).
func TestShutdownReleasesTheLeaseOnce(t *testing.T) {
	var errs atomic.Int32
	s := NewMemStore()
	rt := NewRuntime(s, Config{Logger: slog.New(errorCounter{&errs})})
	sub, err := rt.Submit(ctx, "k", noop, alice)
	require.NoError(t, err)
	settled(t, rt, sub.ID)
	live, err := s.LiveInstances(ctx)
	require.NoError(t, err)
	assert.Contains(t, live, rt.instance)
	require.NoError(t, rt.Shutdown(ctx))
	require.NoError(t, rt.Shutdown(ctx))
	live, err = s.LiveInstances(ctx)
	require.NoError(t, err)
	assert.NotContains(t, live, rt.instance)
	assert.Zero(t, errs.Load(), "errors logged")
}

// A writer never waits for a listener: while one is busy, notices of a
// task coalesce into its latest, and past maxPendingNotices tasks the
// queue is dropped for a single Resync, so memory stays bounded.
func TestMemStoreNoticesCoalesceAndStayBounded(t *testing.T) {
	for _, c := range []struct {
		name  string
		tasks int
		want  []Change
	}{
		{"Coalesced", 2, []Change{
			{ID: "t0", RunID: "r.1", Status: StatusRunning},
			{ID: "t1", RunID: "r.1", Status: StatusRunning},
		}},
		{"Overflow", maxPendingNotices + 1, []Change{{Resync: true}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := NewMemStore()
			lctx, stop := context.WithCancel(ctx)
			busy, release := make(chan struct{}), make(chan struct{})
			var heard []Change
			done := make(chan error, 1)
			go func() {
				done <- s.Listen(lctx, func(ch Change) {
					if ch.Resync && len(heard) == 0 {
						close(busy)
						<-release // the listener is busy while the writes happen
					}
					heard = append(heard, ch)
					if len(heard) == 1+len(c.want) {
						stop()
					}
				})
			}()
			<-busy
			for i := range c.tasks {
				id := fmt.Sprint("t", i)
				require.NoError(t, s.InsertTask(ctx, Record{ID: id, RunID: "r.1", State: State{Status: StatusPending}}))
				ok, err := s.TransitionTask(ctx, id, "r.1", fromPending, State{Status: StatusRunning, Attempt: 1})
				require.True(t, ok)
				require.NoError(t, err)
			}
			close(release)
			assert.ErrorIs(t, <-done, context.Canceled)
			assert.Equal(t, c.want, heard[1:])
		})
	}
}
