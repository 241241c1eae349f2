package workers

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// panicOnce is a store whose next InsertTask, once armed, panics (a bug
// in a store, or in a driver under it).
type panicOnce struct {
	Store
	armed atomic.Bool
}

func (s *panicOnce) InsertTask(ctx context.Context, rec Record) error {
	if s.armed.CompareAndSwap(true, false) {
		panic("store bug")
	}
	return s.Store.InsertTask(ctx, rec)
}

// A submission whose store call panics, in a handler whose server
// recovers the panic (net/http does), must not leave the task's lock
// held, nor its admission place taken: the next submission of the key,
// or of the owner, goes on.
func TestAStorePanicInASubmissionLeavesNoLockHeld(t *testing.T) {
	s := &panicOnce{Store: NewMemStore()}
	rt := newRuntime(t, s, Config{Limits: Limits{Owner: OwnerLimits{Running: 1, Waiting: 1}}})
	s.armed.Store(true)
	func() {
		defer func() { _ = recover() }() // as net/http recovers a handler's panic
		_, _ = rt.Submit(ctx, "job", noop, alice)
	}()
	c, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	sub, err := rt.Submit(c, "job", noop, alice)
	require.False(t, errors.Is(err, context.DeadlineExceeded), "the key's lock is still held by the submission that panicked")
	require.NoError(t, err)
	assert.Equal(t, StatusCompleted, settled(t, rt, sub.ID).Status)
}
