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
// It is split by id into shards, each under a lock of its own, so that
// publishing a new run and settling another rarely wait for each other:
// when they shared one lock, a sequential queue's processor and its
// submitter took turns on one core, each handing the other the lock. All
// runs of one id share a shard, so a run moves between handle and
// others in one critical section. A walk over every shard is not one
// snapshot, which its callers tolerate: Shutdown walks once no
// submission is left inside its gate, so nothing is published during
// the walk; a lease loss bumps its epoch before the walk, so a run
// published behind the walk is cancelled at its dispatch; the sync loop
// meets a run it missed on its next pass; and Reset is for tests.
type runSet struct {
	seed   maphash.Seed
	shards *[runShards]runShard // an array of its own, so that each shard sits on one cache line
}

const runShards = 16

type runShard struct {
	mu      sync.RWMutex
	handles *idMap[*Task]      // guarded by mu: task id -> the run holding its handle
	others  map[*Task]struct{} // guarded by mu
	_       [24]byte           // to 64 bytes: a cache line
}

func newRunSet() *runSet {
	s := &runSet{seed: maphash.MakeSeed(), shards: new([runShards]runShard)}
	for i := range s.shards {
		s.shards[i].handles = newIDMap[*Task]()
		s.shards[i].others = make(map[*Task]struct{})
	}
	return s
}

func (s *runSet) shard(id string) *runShard {
	return &s.shards[maphash.String(s.seed, id)%runShards]
}

// publish makes t the holder of its id's handle and returns the run that
// held it, which is kept among the others until it settles.
func (s *runSet) publish(t *Task) (old *Task) {
	sh := s.shard(t.ID())
	sh.mu.Lock()
	old, _ = sh.handles.set(t)
	if old != nil {
		sh.others[old] = struct{}{}
	}
	sh.mu.Unlock()
	return old
}

// get returns the run holding id's handle, or nil.
func (s *runSet) get(id string) *Task {
	sh := s.shard(id)
	sh.mu.RLock()
	t, _ := sh.handles.get(id)
	sh.mu.RUnlock()
	return t
}

// addOther keeps t, which holds no handle, until it settles.
func (s *runSet) addOther(t *Task) {
	sh := s.shard(t.ID())
	sh.mu.Lock()
	sh.others[t] = struct{}{}
	sh.mu.Unlock()
}

// settle removes t: its handle if it holds one, else its place among the
// others. A successor's handle is never touched.
func (s *runSet) settle(t *Task) {
	sh := s.shard(t.ID())
	sh.mu.Lock()
	if !sh.handles.deleteValue(t) {
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
		sh.mu.RLock()
		runs = sh.appendRuns(runs)
		sh.mu.RUnlock()
	}
	return runs
}

// appendRuns appends the shard's runs to runs; mu is held.
func (sh *runShard) appendRuns(runs []*Task) []*Task {
	for t := range sh.handles.all() {
		runs = append(runs, t)
	}
	for t := range sh.others {
		runs = append(runs, t)
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
		sh.mu.RLock()
		for t := range sh.others {
			// A run found holding its handle may have been replaced
			// since, and be among the others now: it is listed once.
			if _, ok := ids[t.ID()]; ok && !slices.Contains(runs[:held], t) {
				runs = append(runs, t)
			}
		}
		sh.mu.RUnlock()
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
		sh.mu.Lock()
		runs = sh.appendRuns(runs)
		for t := range sh.handles.all() {
			sh.others[t] = struct{}{}
		}
		sh.handles.clear()
		sh.mu.Unlock()
	}
	return runs
}

// len returns the number of runs.
func (s *runSet) len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.RLock()
		n += sh.handles.len() + len(sh.others)
		sh.mu.RUnlock()
	}
	return n
}
