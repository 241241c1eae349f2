package workers

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
)

// keyLocks is the runtime's task lock: one lock per task id, so that
// registrations of one id are serialized while those of different ids
// never wait for each other. It is process-local: it orders this
// process's decisions about an id and never stands in for an atomic
// store write, which is what excludes other processes.
//
// A wait for an id's lock ends with the waiter's context: the holder may
// be a registration whose store calls hang, bounded only by its own
// caller's context, and no other caller's wait may be longer than its
// own context allows.
//
// Ids hash to stripes. A stripe lists the locks of its ids that are held,
// usually none or one, and keeps one lock of its own to lend, so that
// taking an id's lock when no other id of its stripe is held allocates
// nothing and touches one cache line: the stripe's. Everything about a
// lock is guarded by its stripe's mutex; a lock released while others
// wait passes to the first of them, still held.
type keyLocks struct {
	seed    maphash.Seed
	stripes *[keyStripes]keyStripe // an array of its own, so that each stripe sits on one cache line
}

const keyStripes = 64

// keyStripe is 64 bytes: one cache line.
type keyStripe struct {
	mu    sync.Mutex
	held  *keyLock // guarded by mu: the stripe's locks held, linked by next
	spare keyLock  // lent to the first id of the stripe while it is free
}

// keyLock is one id's lock while it is held. Every field is guarded by
// the stripe's mu.
//
// Its waiters are a list linked both ways, with its last at hand, so
// that a waiter joins the queue, and leaves it when its context ends,
// without a walk of the others: n callers waiting for one id (a key
// submitted by many callers at once, whose holder's store calls are
// slow) cost O(n) in all, not O(n²).
type keyLock struct {
	id   string
	next *keyLock   // the stripe's next held lock
	wait *keyWaiter // the callers waiting for it, first to come first
	last *keyWaiter // the last of wait, or nil
	held bool       // false only while free, when it is in no stripe's list
}

// keyWaiter is a caller waiting for a held lock. Fields other than ready
// are guarded by the stripe's mu.
type keyWaiter struct {
	ready      chan struct{} // closed when the lock passes to this waiter
	prev, next *keyWaiter    // its neighbours in the queue while it waits
	passed     bool          // the lock passed to this waiter: it holds it
}

// keyHold is a lock taken by keyLocks.lock, to release with unlock.
type keyHold struct {
	s *keyStripe
	l *keyLock
}

func newKeyLocks() keyLocks {
	return keyLocks{seed: maphash.MakeSeed(), stripes: new([keyStripes]keyStripe)}
}

// stripe returns id's stripe.
func (k *keyLocks) stripe(id string) *keyStripe {
	return &k.stripes[maphash.String(k.seed, id)%keyStripes]
}

// lock takes id's lock, or returns ctx's error (see ctxErr) if ctx ends
// first.
func (k *keyLocks) lock(ctx context.Context, id string) (keyHold, error) {
	// Read before the wait is queued: a nil ctx panics here, with
	// nothing queued, not after, which would leave a waiter that the lock
	// passes to and nobody releases.
	done := ctx.Done()
	s := k.stripe(id)
	s.mu.Lock()
	l := s.held
	for l != nil && l.id != id {
		l = l.next
	}
	if l == nil {
		if l = &s.spare; l.held {
			l = new(keyLock) // another id of the stripe holds the spare
		}
		l.id, l.next, l.held, s.held = id, s.held, true, l
		s.mu.Unlock()
		return keyHold{s, l}, nil
	}
	w := &keyWaiter{ready: make(chan struct{}), prev: l.last}
	if l.last != nil {
		l.last.next = w
	} else {
		l.wait = w
	}
	l.last = w
	s.mu.Unlock()
	select {
	case <-w.ready:
		return keyHold{s, l}, nil
	case <-done:
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.passed {
		// The lock passed to w as ctx ended: on to the next.
		s.release(l)
	} else {
		l.leave(w)
	}
	return keyHold{}, ctxErr(ctx)
}

// ctxErr is the error of a wait that ctx ended: ctx.Err(), which
// errors.Is finds as context.Canceled or context.DeadlineExceeded (an
// HTTP layer answers each its own way), wrapping ctx's cause too when it
// was given one of its own.
func ctxErr(ctx context.Context) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause == err || cause == nil {
		return err
	}
	return fmt.Errorf("%w: %w", err, cause)
}

// unlock releases the lock.
func (h keyHold) unlock() {
	h.s.mu.Lock()
	h.s.release(h.l)
	h.s.mu.Unlock()
}

// release passes l to its first waiter, or frees it; mu is held.
func (s *keyStripe) release(l *keyLock) {
	if w := l.wait; w != nil {
		l.leave(w)
		w.passed = true
		close(w.ready)
		return
	}
	p := &s.held
	for *p != l {
		p = &(*p).next
	}
	*p, l.next, l.id, l.held = l.next, nil, "", false
}

// leave takes waiter w out of l's queue; the stripe's mu is held.
func (l *keyLock) leave(w *keyWaiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		l.wait = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		l.last = w.prev
	}
	w.prev, w.next = nil, nil
}
