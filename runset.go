package workers

import (
	"hash/maphash"
	"slices"
	"sync"
)

// runSet is every registered run of a runtime that has not settled: for
// each id, the run holding its handle, and the others (a predecessor
// still executing after a re-run replaced its record, a run whose
// registering write failed, a run let go by Reset).
//
// Where the handles are kept depends on the store. Over a MemStore, the
// record a run registered keeps its handle (memRecord.run), and the runs
// holding handles are kept in a ring per shard, for the walks (see
// runRing): a run's publishing and settling then touch its own record
// and its slot in the ring, never a table of every run, which at a
// million queued runs cost a cache miss or two each way; a lookup by id
// finds the handle in the record it finds anyway. A record that leaves
// the store (replaced by another run, pruned, cleared) takes the handle
// with it: the store moves the run among the others (displace) under the
// record's shard lock, and the next run of the id published here
// supersedes it, as it supersedes the holder of a handle kept by id. A
// record rewritten for the same run hands the handle to its replacement.
// A MemStore's shard lock may be held while a runSet's is taken, never
// the other way round. Over any other store, a map per shard keeps the
// handles by id.
//
// The set is split by id into shards, each under a lock of its own, so
// that publishing a new run and settling another rarely wait for each
// other: when they shared one lock, a sequential queue's processor and
// its submitter took turns on one core, each handing the other the lock.
// All runs of one id share a shard, so a run moves between handle and
// others in one critical section. A walk over every shard is not one
// snapshot, which its callers tolerate: Shutdown walks once no
// submission is left inside its gate, so nothing is published during
// the walk; a lease loss bumps its epoch before the walk, so a run
// published behind the walk is cancelled at its dispatch; the sync loop
// meets a run it missed on its next pass; and Reset is for tests.
type runSet struct {
	seed   maphash.Seed
	shards *[runShards]runShard // an array of its own, so that each shard sits on one cache line
	mem    *MemStore            // the store whose records keep the handles, or nil
}

const runShards = 16

type runShard struct {
	mu      sync.Mutex
	handles *idMap[*Task]      // guarded by mu: task id -> the run holding its handle; nil when records keep them
	held    runRing            // guarded by mu: the runs whose records keep their handles
	others  map[*Task]struct{} // guarded by mu
}

// newRunSet returns an empty set whose handles mem's records keep, or,
// when mem is nil, the set itself.
func newRunSet(mem *MemStore) *runSet {
	s := &runSet{seed: maphash.MakeSeed(), shards: new([runShards]runShard), mem: mem}
	for i := range s.shards {
		if mem == nil {
			s.shards[i].handles = newIDMap[*Task]()
		}
		s.shards[i].others = make(map[*Task]struct{})
	}
	return s
}

func (s *runSet) shard(id string) *runShard {
	return &s.shards[s.shardIndex(id)]
}

// shardIndex returns the index of id's shard.
func (s *runSet) shardIndex(id string) uint8 {
	return uint8(maphash.String(s.seed, id) % runShards)
}

// shardOf returns t's shard, which t keeps when s is its home
// (Task.shard): the id's bytes, which a run that waited long has out of
// cache, are not hashed again.
func (s *runSet) shardOf(t *Task) *runShard {
	if t.home == s {
		return &s.shards[t.shard]
	}
	return s.shard(t.ID())
}

// publish makes t the holder of its id's handle and returns the runs it
// supersedes, which are kept among the others until they settle. Over a
// map of handles, that is the run that held the handle. Where the records
// keep the handles, a predecessor lost its handle when its record left
// the store (see displace), so it is every other run of the id: those a
// re-run here superseded before are among them, already cancelled.
func (s *runSet) publish(t *Task) (superseded []*Task) {
	if s.mem != nil {
		return s.mem.hold(t)
	}
	sh := s.shardOf(t)
	sh.mu.Lock()
	old, _ := sh.handles.set(t)
	if old != nil {
		sh.others[old] = struct{}{}
		superseded = []*Task{old}
	}
	sh.mu.Unlock()
	return superseded
}

// place puts t in the ring if its record keeps its handle (held), else
// keeps it among the others, and returns the others of its id: one
// critical section for publish's two needs.
func (s *runSet) place(t *Task, held bool) (others []*Task) {
	sh := s.shardOf(t)
	sh.mu.Lock()
	others = sh.appendOthersOf(nil, t.ID())
	if held {
		sh.held.push(t)
	} else {
		sh.others[t] = struct{}{}
	}
	sh.mu.Unlock()
	return others
}

// displace moves t among the others: the record that kept its handle has
// left the store. The store calls it with that record's shard locked.
func (s *runSet) displace(t *Task) {
	sh := s.shardOf(t)
	sh.mu.Lock()
	if sh.held.holds(t) {
		sh.held.remove(t)
		sh.others[t] = struct{}{}
	}
	sh.mu.Unlock()
}

// get returns the run holding id's handle, or nil.
func (s *runSet) get(id string) *Task {
	if s.mem != nil {
		return s.mem.handle(id, s)
	}
	sh := s.shard(id)
	sh.mu.Lock()
	t, _ := sh.handles.get(id)
	sh.mu.Unlock()
	return t
}

// ofID returns the runs of id: its handle's, if any, then the others.
func (s *runSet) ofID(id string) []*Task {
	var runs []*Task
	if t := s.get(id); t != nil {
		runs = append(runs, t)
	}
	for _, t := range s.othersOf(id) {
		if !slices.Contains(runs, t) {
			runs = append(runs, t)
		}
	}
	return runs
}

// othersOf returns the others of id: in proportion to its shard's others,
// which are few, not to the handles.
func (s *runSet) othersOf(id string) []*Task {
	sh := s.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.appendOthersOf(nil, id)
}

// appendOthersOf appends the others of id to runs; mu is held.
func (sh *runShard) appendOthersOf(runs []*Task, id string) []*Task {
	if len(sh.others) == 0 {
		return runs // the common case, without starting a walk of the map
	}
	for t := range sh.others {
		if t.ID() == id {
			runs = append(runs, t)
		}
	}
	return runs
}

// addOther keeps t, which holds no handle, until it settles.
func (s *runSet) addOther(t *Task) {
	sh := s.shardOf(t)
	sh.mu.Lock()
	sh.others[t] = struct{}{}
	sh.mu.Unlock()
}

// settle removes t: its handle if it holds one, else its place among the
// others. A successor's handle is never touched.
func (s *runSet) settle(t *Task) {
	if s.mem != nil {
		s.mem.release(t)
	}
	sh := s.shardOf(t)
	sh.mu.Lock()
	switch {
	case sh.held.holds(t):
		sh.held.remove(t)
	case sh.handles != nil && sh.handles.deleteValue(t):
	default:
		delete(sh.others, t)
	}
	sh.mu.Unlock()
}

// all returns every run, a shard at a time: a run published while the
// walk goes on may be missed, and one settled meanwhile may be listed.
func (s *runSet) all() []*Task {
	var runs []*Task
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		runs = sh.appendRuns(runs)
		sh.mu.Unlock()
	}
	return runs
}

// appendRuns appends the shard's runs to runs; mu is held.
func (sh *runShard) appendRuns(runs []*Task) []*Task {
	runs = sh.appendHandles(runs)
	for t := range sh.others {
		runs = append(runs, t)
	}
	return runs
}

// appendHandles appends the runs holding handles to runs; mu is held.
func (sh *runShard) appendHandles(runs []*Task) []*Task {
	runs = sh.held.appendTo(runs)
	if sh.handles != nil {
		for t := range sh.handles.all() {
			runs = append(runs, t)
		}
	}
	return runs
}

// matching returns the runs whose ids are in ids: in proportion to ids
// and to the others, not to the handles.
func (s *runSet) matching(ids map[string]struct{}) []*Task {
	var runs []*Task
	for id := range ids {
		if t := s.get(id); t != nil {
			runs = append(runs, t)
		}
	}
	held := len(runs)
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for t := range sh.others {
			// A run found holding its handle may have been replaced
			// since, and be among the others now: it is listed once.
			if _, ok := ids[t.ID()]; ok && !slices.Contains(runs[:held], t) {
				runs = append(runs, t)
			}
		}
		sh.mu.Unlock()
	}
	return runs
}

// forget moves every handle among the others, so that no id is taken for
// alive here any more while its run is still tracked until it settles,
// and returns every run.
func (s *runSet) forget() []*Task {
	var runs []*Task
	for i := range s.shards {
		sh := &s.shards[i]
		if s.mem != nil {
			// The records let go of the handles first (their lock
			// comes before the shard's), then the ring.
			sh.mu.Lock()
			held := sh.appendHandles(nil)
			sh.mu.Unlock()
			for _, t := range held {
				s.mem.release(t)
			}
		}
		sh.mu.Lock()
		runs = sh.appendRuns(runs)
		for _, t := range sh.held.clear() {
			sh.others[t] = struct{}{}
		}
		if sh.handles != nil {
			for t := range sh.handles.all() {
				sh.others[t] = struct{}{}
			}
			sh.handles.clear()
		}
		sh.mu.Unlock()
	}
	return runs
}

// len returns the number of runs.
func (s *runSet) len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += int(sh.held.n) + len(sh.others)
		if sh.handles != nil {
			n += sh.handles.len()
		}
		sh.mu.Unlock()
	}
	return n
}
