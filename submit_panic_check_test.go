package workers

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// resyncThenPanic is a panicReadOnce over which a Resync notice arrives
// while a submission registers (armed: right after its insert), and whose
// next read then panics.
type resyncThenPanic struct {
	panicReadOnce
	resync func()
	armed  atomic.Bool
}

func (s *resyncThenPanic) InsertTask(ctx context.Context, rec Record) error {
	err := s.MemStore.InsertTask(ctx, rec)
	if err == nil && s.armed.CompareAndSwap(true, false) {
		s.resync()
		s.panicReadOnce.armed.Store(true)
	}
	return err
}

// A submission whose store read panics after its run was registered (the
// read that checks the run against a notice that came meanwhile), in a
// handler whose server recovers the panic, must not leave that run
// registered and never dispatched: its record would stay RUNNING for
// good (the runtime holds its handle, so no recovery ends it), its
// admission slot taken, and Shutdown would wait for it in vain.
func TestAStorePanicAfterRegistrationLeavesNoRunBehind(t *testing.T) {
	s := &resyncThenPanic{panicReadOnce: panicReadOnce{MemStore: NewMemStore()}}
	rt := NewRuntime(s, Config{Limits: Limits{Owner: OwnerLimits{Running: 1}}})
	s.resync = rt.ends.resync
	var shutErr error
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		shutErr = rt.Shutdown(c)
		assert.NoError(t, shutErr, "Shutdown waited in vain for the run left behind")
	})

	require.NoError(t, rt.Ready(ctx))
	s.armed.Store(true)
	func() {
		defer func() { _ = recover() }() // as net/http recovers a handler's panic
		_, _ = rt.Submit(ctx, "job", noop, alice)
	}()
	id, err := ScopedTaskKey("job", alice)
	require.NoError(t, err)
	c, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	snap, err := rt.Wait(c, id, alice)
	require.NoError(t, err, "the run registered by the submission that panicked never ends")
	assert.True(t, snap.Status.Terminal())

	// The owner's running slot is free again.
	sub, err := rt.Submit(ctx, "next", noop, alice)
	require.NoError(t, err)
	c2, cancel2 := context.WithTimeout(ctx, 3*time.Second)
	defer cancel2()
	snap, err = rt.Wait(c2, sub.ID, alice)
	require.NoError(t, err)
	assert.Equal(t, StatusCompleted, snap.Status)
}
