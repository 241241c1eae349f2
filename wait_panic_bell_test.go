package workers

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// panicReadOnce is a MemStore whose next GetTask, once armed, panics (a
// bug in a store, or in a driver under it).
type panicReadOnce struct {
	*MemStore
	armed atomic.Bool
}

func (s *panicReadOnce) GetTask(ctx context.Context, id string) (Record, error) {
	if s.armed.CompareAndSwap(true, false) {
		panic("store bug")
	}
	return s.MemStore.GetTask(ctx, id)
}

// A Wait whose store read panics, in a handler whose server recovers the
// panic (net/http does), must not leave its bell behind: each such Wait
// would keep one for good, and the count of listeners it leaves above
// zero makes every change of every task take the bells' lock.
func TestAStorePanicInAWaitLeavesNoBell(t *testing.T) {
	s := &panicReadOnce{MemStore: NewMemStore()}
	rt := newRuntime(t, s, Config{})
	sub, err := rt.Submit(ctx, "job", noop, alice)
	require.NoError(t, err)
	c, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = rt.Wait(c, sub.ID, alice)
	require.NoError(t, err)

	for i := range 3 {
		s.armed.Store(true)
		func() {
			defer func() { _ = recover() }() // as net/http recovers a handler's panic
			_, _ = rt.Wait(ctx, "alice::other"+string(rune('a'+i)), alice)
		}()
	}
	rt.bells.mu.Lock()
	bells := len(rt.bells.m)
	rt.bells.mu.Unlock()
	assert.Zero(t, rt.bells.listeners.Load(), "Waits that panicked are still counted as listening")
	assert.Zero(t, bells, "Waits that panicked left their bells")
}

// goexitReadOnce is a MemStore whose next GetTask, once armed, ends its
// goroutine with runtime.Goexit, as a test double's require does.
type goexitReadOnce struct {
	*MemStore
	armed atomic.Bool
}

func (s *goexitReadOnce) GetTask(ctx context.Context, id string) (Record, error) {
	if s.armed.CompareAndSwap(true, false) {
		runtime.Goexit()
	}
	return s.MemStore.GetTask(ctx, id)
}

// So must a Wait whose store read ends its goroutine (a test's fake
// store that calls FailNow, say): no panic to recover is raised then.
func TestAStoreGoexitInAWaitLeavesNoBell(t *testing.T) {
	s := &goexitReadOnce{MemStore: NewMemStore()}
	rt := newRuntime(t, s, Config{})
	for i := range 3 {
		s.armed.Store(true)
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			_, _ = rt.Wait(ctx, "alice::other"+string(rune('a'+i)), alice)
		}()
		<-ended
	}
	rt.bells.mu.Lock()
	bells := len(rt.bells.m)
	rt.bells.mu.Unlock()
	assert.Zero(t, rt.bells.listeners.Load(), "Waits whose goroutine ended are still counted as listening")
	assert.Zero(t, bells, "Waits whose goroutine ended left their bells")
}
