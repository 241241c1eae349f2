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
// Entries exist only while someone holds or waits for them; the map is
// split into shards so that ids hashing apart do not share a map lock.
type keyLocks struct {
	seed   maphash.Seed
	shards [keyLockShards]keyShard
}

const keyLockShards = 64

type keyShard struct {
	mu sync.Mutex
	m  map[string]*keyLock // guarded by mu
}

type keyLock struct {
	mu   sync.Mutex
	refs int // guarded by the shard's mu: holders and waiters
}

var keyLockPool = sync.Pool{New: func() any { return new(keyLock) }}

func newKeyLocks() *keyLocks {
	k := &keyLocks{seed: maphash.MakeSeed()}
	for i := range k.shards {
		k.shards[i].m = make(map[string]*keyLock)
	}
	return k
}

// lock takes id's lock and returns what unlock needs.
func (k *keyLocks) lock(id string) *keyLock {
	sh := &k.shards[maphash.String(k.seed, id)%keyLockShards]
	sh.mu.Lock()
	l := sh.m[id]
	if l == nil {
		l = keyLockPool.Get().(*keyLock)
		sh.m[id] = l
	}
	l.refs++
	sh.mu.Unlock()
	l.mu.Lock()
	return l
}

// unlock releases id's lock l, taken by lock.
func (k *keyLocks) unlock(id string, l *keyLock) {
	l.mu.Unlock()
	sh := &k.shards[maphash.String(k.seed, id)%keyLockShards]
	sh.mu.Lock()
	if l.refs--; l.refs == 0 {
		delete(sh.m, id)
		keyLockPool.Put(l)
	}
	sh.mu.Unlock()
}
