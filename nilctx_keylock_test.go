package workers

import (
	"context"
	"sync"
	"testing"
	"time"
)

// blockFirstInsert is a MemStore whose first InsertTask waits for
// release: the submission making it holds its task's lock meanwhile.
type blockFirstInsert struct {
	*MemStore
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (s *blockFirstInsert) InsertTask(ctx context.Context, rec Record) error {
	first := false
	s.once.Do(func() { first = true })
	if first {
		close(s.entered)
		<-s.release
	}
	return s.MemStore.InsertTask(ctx, rec)
}

// A submission made with a nil context (a programmer's error, which
// panics or is refused) must leave nothing behind: in particular not the
// task's lock, which every later submission of the key waits for. Here
// the nil-context submission arrives while another submission of the
// same key holds the lock; once that one is done, a third submission of
// the key must go through.
func TestNilContextSubmitLeavesTaskLockFree(t *testing.T) {
	store := &blockFirstInsert{MemStore: NewMemStore(), entered: make(chan struct{}), release: make(chan struct{})}
	rt := NewRuntime(store, Config{})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := rt.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	nop := func(context.Context, *Task) (any, error) { return nil, nil }
	ctx := t.Context()

	firstDone := make(chan error, 1)
	go func() {
		_, err := rt.Submit(ctx, "k", nop, alice)
		firstDone <- err
	}()
	<-store.entered // the first submission holds k's lock

	func() {
		defer func() { _ = recover() }() // a panic is an acceptable answer to a nil context
		var nilCtx context.Context
		_, err := rt.Submit(nilCtx, "k", nop, alice) //nolint:staticcheck // SA1012: the nil context is the point
		t.Logf("Submit with a nil context returned %v", err)
	}()

	close(store.release)
	if err := <-firstDone; err != nil {
		t.Fatalf("first Submit: %v", err)
	}
	id, _ := ScopedTaskKey("k", alice)
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := rt.Wait(wctx, id, alice); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	// The key is finished: submitting it again re-runs it, at once.
	sctx, cancel2 := context.WithTimeout(ctx, 5*time.Second)
	defer cancel2()
	if _, err := rt.Submit(sctx, "k", nop, alice); err != nil {
		t.Fatalf("Submit of k after the nil-context submission: %v (k's task lock was left held)", err)
	}
}
