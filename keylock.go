package workers

import (
	"hash/maphash"
	"sync"
)

// keyLocks is the runtime's task lock: one mutex per task id, so that
// registrations of one id are serialized while those of different ids
// never wait for each other. It is process-local: it orders this
// process's decisions about an id and never stands in for an atomic
// store write, which is what excludes other processes.
//
// Ids hash to stripes. A stripe lists the locks of its ids that are held
// or awaited, usually none or one, and keeps one lock of its own to lend,
// so that taking an id's lock when no other id of its stripe is held
// allocates nothing and touches one cache line: the stripe's.
type keyLocks struct {
	seed    maphash.Seed
	stripes *[keyStripes]keyStripe // an array of its own, so that each stripe sits on one cache line
}

const keyStripes = 64

// keyStripe is 64 bytes: one cache line.
type keyStripe struct {
	mu    sync.Mutex
	held  *keyLock // guarded by mu: the stripe's locks held or awaited, linked by next
	spare keyLock  // lent to the first id of the stripe while it is free
	_     [8]byte
}

// keyLock is one id's lock while it is held or awaited.
type keyLock struct {
	mu   sync.Mutex
	refs int32    // guarded by the stripe's mu: holders, waiters, and a releaser until its l.mu.Unlock returned (so unlock drops it only after); 0 when free, and only then lent again
	id   string   // guarded by the stripe's mu
	next *keyLock // guarded by the stripe's mu
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

// lock takes id's lock.
func (k *keyLocks) lock(id string) keyHold {
	s := k.stripe(id)
	s.mu.Lock()
	l := s.held
	for l != nil && l.id != id {
		l = l.next
	}
	if l == nil {
		if l = &s.spare; l.refs != 0 {
			l = new(keyLock) // another id of the stripe holds the spare
		}
		l.id, l.next, s.held = id, s.held, l
	}
	l.refs++
	s.mu.Unlock()
	l.mu.Lock()
	return keyHold{s, l}
}

// unlock releases the lock.
func (h keyHold) unlock() {
	s, l := h.s, h.l
	l.mu.Unlock()
	s.mu.Lock()
	if l.refs--; l.refs == 0 {
		p := &s.held
		for *p != l {
			p = &(*p).next
		}
		*p, l.next, l.id = l.next, nil, ""
	}
	s.mu.Unlock()
}
