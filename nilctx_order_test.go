package workers

import (
	"errors"
	"testing"
)

// SubmitSequential checks its arguments in the order every other call
// does, its queue's name with its key, after them: a nil ctx is
// ErrInvalidOption and a nil authority ErrNoAuthority whatever the queue
// name, as they are for Submit whatever the key and for QueueStatus
// whatever the name.
func TestSubmitSequentialChecksCtxAndAuthorityBeforeTheQueue(t *testing.T) {
	rt := newRuntime(t, NewMemStore(), Config{})
	for _, queue := range []string{"", "bad\x00queue"} {
		//nolint:staticcheck // SA1012: the nil context is the point
		_, err := rt.SubmitSequential(nil, queue, "k", nopFn, alice)
		if !errors.Is(err, ErrInvalidOption) {
			t.Errorf("SubmitSequential(nil ctx, queue %q) = %v, want ErrInvalidOption", queue, err)
		}
		//nolint:staticcheck // SA1012: the nil context is the point
		_, err = rt.Submit(nil, queue, nopFn, alice)
		if !errors.Is(err, ErrInvalidOption) {
			t.Errorf("Submit(nil ctx, key %q) = %v, want ErrInvalidOption", queue, err)
		}
		_, err = rt.SubmitSequential(ctx, queue, "k", nopFn, nil)
		if !errors.Is(err, ErrNoAuthority) {
			t.Errorf("SubmitSequential(nil authority, queue %q) = %v, want ErrNoAuthority", queue, err)
		}
		_, err = rt.QueueStatus(ctx, queue, nil)
		if !errors.Is(err, ErrNoAuthority) {
			t.Errorf("QueueStatus(nil authority, queue %q) = %v, want ErrNoAuthority", queue, err)
		}
		_, err = rt.SubmitSequential(ctx, queue, "k", nopFn, alice)
		if !errors.Is(err, ErrInvalidKey) {
			t.Errorf("SubmitSequential(queue %q) = %v, want ErrInvalidKey", queue, err)
		}
	}
}
