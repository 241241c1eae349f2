package workers

import (
	"cmp"
	"context"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// MemStore is the volatile, in-memory Store, and the default. It is safe
// for concurrent use. Records are copied in and out, so nothing a caller
// holds aliases stored state. Times are kept to the microsecond, as
// PostgreSQL keeps them, and read back in UTC; a time more than about
// 285,000 years after year 1 is refused with ErrInvalidData, as every
// store refuses one before it (see CheckRecord). Like a SQL
// store, it fails a call whose context is already done. Its records
// live as long as the process, so it implements RecordClearer.
//
// It implements Leaser, on the process's clock, which every runtime
// sharing it shares, and Notifier: every runtime over one MemStore hears
// of the others' writes at once. A write with nobody listening costs one
// atomic load more; with listeners, it never waits for them (see Listen).
// A runtime is spared the notices of its own runs' writes, which it knows
// of already.
//
// The zero value is not usable; call NewMemStore.
type MemStore struct {
	Authorizers

	// The records are split by id into shards, each with its lock, and
	// listed by indexes under mu. A write that changes what is listed (an
	// insert, a replacement, a watcher) holds mu and then the record's
	// shard lock; a write of a record's state holds only its shard lock,
	// so that the runs of a runtime writing their starts and ends do not
	// wait for its submissions' inserts (they did when one lock held
	// everything, and a sequential queue's processor and its submitter
	// then took turns on one core). A listing holds mu and every shard's
	// lock for reading, and a batch of DeleteFinished both for writing, so
	// each sees the records at one moment; a listing that walks more than
	// listBatch records, like DeleteFinished, does so in batches, each
	// seeing its own moment (see matches). Locks are taken in that order:
	// mu, then shards by index, then, when a record that leaves the store
	// or a run's publishing moves a run, the lock of a shard of that
	// run's runtime's runSet.
	seed   maphash.Seed
	shards *[memShards]memShard // an array of its own, so that each shard sits on one cache line

	// listeners is the current Listen calls, replaced whole (copy on
	// write) under lmu; a writer loads it while holding the record's
	// shard lock, so that notices of one task are queued in write order.
	listeners atomic.Pointer[[]*memListener]

	// What every insert writes, a cache line away from what every write
	// of a state reads (see cacheLinePad).
	_      cacheLinePad
	mu     sync.RWMutex
	all    ordered             // guarded by mu: every record, in listing order
	byUser map[string]*ordered // guarded by mu: user id -> the records visible to it, in listing order
	// usersPeak is the most entries byUser held since it was last
	// rebuilt (see compact); guarded by mu.
	usersPeak int

	lmu     sync.Mutex
	leaseMu sync.Mutex
	leases  map[string]time.Time // guarded by leaseMu: instance -> expiry
}

// memShards is the number of shards of a MemStore's records.
const memShards = 16

// memShard is a part of a MemStore's records. Its lock guards its map
// and the state of its records; their ids, run ids and creation times
// never change, and their watchers change under the store's mu as well.
type memShard struct {
	mu   sync.RWMutex
	recs *idMap[*memRecord] // guarded by mu
	live []*memRecord       // guarded by mu: its PENDING and RUNNING records, in no order (see track)
	at   uint8              // its index in the store's shards plus one, which its records keep (memRecord.shard)
	_    [7]byte            // to 64 bytes: a cache line
}

// track keeps r, one of the shard's records whose state may have
// changed, among the shard's live records while its status is PENDING or
// RUNNING, and out of them once it is not; mu is held for writing. A
// listing of live records alone reads these instead of walking every
// record it may see (see MemStore.matches): the records a user may see
// are mostly ended ones, kept for Retention.
func (sh *memShard) track(r *memRecord) {
	switch live := r.live(); {
	case live && r.livePos == 0:
		sh.live = append(sh.live, r)
		r.livePos = int32(len(sh.live))
	case !live && r.livePos != 0:
		sh.untrack(r)
	}
}

// untrack takes r out of the shard's live records; mu is held for
// writing. A list that has shrunk to a quarter of its array moves to a
// smaller one, so that a burst of waiting tasks leaves no large array
// behind.
func (sh *memShard) untrack(r *memRecord) {
	i, last := r.livePos-1, len(sh.live)-1
	moved := sh.live[last]
	sh.live[i], moved.livePos = moved, i+1
	sh.live[last] = nil
	sh.live = sh.live[:last]
	r.livePos = 0
	if cap(sh.live) > 256 && len(sh.live) < cap(sh.live)/4 {
		sh.live = slices.Clone(sh.live)
	}
}

// shard returns the shard of id's record.
func (s *MemStore) shard(id string) *memShard {
	return &s.shards[maphash.String(s.seed, id)%memShards]
}

// shardOf is shard for a write that has r, the record of id that a run
// keeps, in hand: r says where it is stored, which spares hashing the
// id, whose bytes a run that waited long has out of cache.
func (s *MemStore) shardOf(id string, r *memRecord) *memShard {
	if r != nil && r.shard != 0 && r.id() == id {
		return &s.shards[r.shard-1]
	}
	return s.shard(id)
}

// A record leaves its shard only through replace, remove and clear, with
// the shard's lock held for writing: each marks what it takes out
// removed, which a write to a record kept by its run relies on (see
// MemStore.transition).

// replace stores r in place of the record of its id. A record rewritten
// for the same run hands r the handle it kept (see runSet).
func (sh *memShard) replace(r *memRecord) {
	old, ok := sh.recs.set(r)
	r.shard = sh.at
	sh.track(r)
	if !ok {
		return
	}
	if old.runID() == r.runID() {
		r.run, old.run = old.run, nil
	}
	if old.livePos != 0 {
		sh.untrack(old)
	}
	old.leave()
}

// remove takes r out.
func (sh *memShard) remove(r *memRecord) {
	if sh.recs.deleteValue(r) {
		if r.livePos != 0 {
			sh.untrack(r)
		}
		r.leave()
	}
}

// clear takes every record out.
func (sh *memShard) clear() {
	for r := range sh.recs.all() {
		r.livePos = 0
		r.leave()
	}
	sh.recs.clear()
	sh.live = nil
}

// leave marks r, taken out of its shard, removed; the run whose handle
// it kept goes among its runtime's other runs (see runSet).
func (r *memRecord) leave() {
	r.removed = true
	if t := r.run; t != nil {
		r.run = nil
		t.home.displace(t)
	}
}

// hold makes t's record keep t's handle and lists t in its runtime's
// runs, or keeps t among the others if the record has left the store,
// in one critical section, so that no removal comes in between; it
// returns the other runs of t's id in its runtime (see runSet.publish).
func (s *MemStore) hold(t *Task) (others []*Task) {
	sh := s.shardOf(t.ID(), t.rec)
	sh.mu.Lock()
	r := t.rec
	held := r != nil && !r.removed && r.id() == t.ID()
	if held {
		r.run = t
	}
	others = t.home.place(t, held)
	sh.mu.Unlock()
	return others
}

// release makes the record that keeps t's handle, if one does, let go
// of it: t's record, or the record that replaced it for the same run.
func (s *MemStore) release(t *Task) {
	r := t.rec
	if r == nil {
		return
	}
	sh := s.shardOf(t.ID(), r)
	sh.mu.Lock()
	if r.removed {
		r, _ = sh.recs.get(t.ID())
	}
	if r != nil && r.run == t {
		r.run = nil
	}
	sh.mu.Unlock()
}

// handle returns the run of home whose handle id's record keeps, or nil.
func (s *MemStore) handle(id string, home *runSet) *Task {
	sh := s.shard(id)
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	if r, ok := sh.recs.get(id); ok && r.run != nil && r.run.home == home {
		return r.run
	}
	return nil
}

// lockShards takes every shard's lock, for reading unless write;
// unlockShards releases them.
func (s *MemStore) lockShards(write bool) {
	for i := range s.shards {
		if write {
			s.shards[i].mu.Lock()
		} else {
			s.shards[i].mu.RLock()
		}
	}
}

func (s *MemStore) unlockShards(write bool) {
	for i := range s.shards {
		if write {
			s.shards[i].mu.Unlock()
		} else {
			s.shards[i].mu.RUnlock()
		}
	}
}

var (
	_ Store         = (*MemStore)(nil)
	_ RecordClearer = (*MemStore)(nil)
	_ Leaser        = (*MemStore)(nil)
	_ Notifier      = (*MemStore)(nil)
)

// NewMemStore returns an empty MemStore with no authorizers set.
func NewMemStore() *MemStore {
	s := &MemStore{
		byUser: make(map[string]*ordered),
		seed:   maphash.MakeSeed(),
		shards: new([memShards]memShard),
		leases: make(map[string]time.Time),
	}
	for i := range s.shards {
		s.shards[i].recs = newIDMap[*memRecord]()
		s.shards[i].at = uint8(i + 1)
	}
	return s
}

// GetTask implements Store.
func (s *MemStore) GetTask(ctx context.Context, id string) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	sh := s.shard(id)
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	r, ok := sh.recs.get(id)
	if !ok {
		return Record{}, ErrNotFound
	}
	var rec Record
	r.fill(&rec)
	rec.detach()
	return rec, nil
}

// InsertTask implements Store.
func (s *MemStore) InsertTask(ctx context.Context, rec Record) error {
	_, err := s.insert(ctx, rec, "")
	return err
}

// insert is InsertTask, and returns the record it stored. ids is as
// newMemRecord's.
func (s *MemStore) insert(ctx context.Context, rec Record, ids string) (*memRecord, error) {
	r, err := prepare(rec, ids)
	if err != nil {
		return nil, err
	}
	if err := s.add(ctx, r); err != nil {
		return nil, err
	}
	return r, nil
}

// add stores r, a record no other call has, if its id is free. A runtime
// builds its runs' records itself (see Task.memRecord) and keeps each
// for its run's writes (see transition).
func (s *MemStore) add(ctx context.Context, r *memRecord) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	sh := s.shard(r.id())
	s.mu.Lock()
	defer s.mu.Unlock()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if !sh.recs.add(r) {
		return ErrConflict
	}
	r.shard = sh.at
	sh.track(r)
	s.index(r)
	s.notifyMinted(r)
	return nil
}

// SetTask implements Store.
func (s *MemStore) SetTask(ctx context.Context, rec Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkState(&rec.State); err != nil {
		return err
	}
	if err := checkMemTimes(rec.StartedAt, rec.CompletedAt); err != nil {
		return err
	}
	st := rec.State
	st.Result = slices.Clone(st.Result)
	sh := s.shard(rec.ID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	r, ok := sh.recs.get(rec.ID)
	if !ok {
		return ErrNotFound
	}
	r.setState(&st)
	sh.track(r)
	s.notify(ctx, r)
	return nil
}

// ReplaceTask implements Store.
func (s *MemStore) ReplaceTask(ctx context.Context, rec Record, prevRunID string) error {
	_, err := s.replace(ctx, rec, "", prevRunID)
	return err
}

// replace is ReplaceTask, and returns the record it stored (see insert).
func (s *MemStore) replace(ctx context.Context, rec Record, ids, prevRunID string) (*memRecord, error) {
	nr, err := prepare(rec, ids)
	if err != nil {
		return nil, err
	}
	if err := s.swap(ctx, nr, prevRunID); err != nil {
		return nil, err
	}
	return nr, nil
}

// swap stores nr, a record no other call has, in place of the record of
// its id whose run is prevRunID (see add).
func (s *MemStore) swap(ctx context.Context, nr *memRecord, prevRunID string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	sh := s.shard(nr.id())
	s.mu.Lock()
	defer s.mu.Unlock()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	r, ok := sh.recs.get(nr.id())
	if !ok {
		return ErrNotFound
	}
	if r.runID() != prevRunID {
		return ErrConflict
	}
	s.unindex(r)
	sh.replace(nr)
	s.index(nr)
	s.notifyMinted(nr)
	return nil
}

// TransitionTask implements Store.
func (s *MemStore) TransitionTask(ctx context.Context, id, runID string, from []Status, next State) (bool, error) {
	return s.transition(ctx, id, nil, runID, from, next)
}

// transition is TransitionTask. A runtime passes r, the record of id its
// run was registered with (by insert or replace), when it has it: while
// r is still stored, the write goes to it without looking the id up,
// which in a store of many records costs a cache miss or two. Whatever
// takes a record out of the store marks it removed, under the lock of its
// shard held for writing (pruning and clearing take every shard's); a
// write to a removed record goes by id.
func (s *MemStore) transition(ctx context.Context, id string, r *memRecord, runID string, from []Status, next State) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if runID == "" {
		return false, ErrInvalidRunID
	}
	if err := checkState(&next); err != nil {
		return false, err
	}
	if err := checkMemTimes(next.StartedAt, next.CompletedAt); err != nil {
		return false, err
	}
	next.Result = slices.Clone(next.Result)
	sh := s.shardOf(id, r)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if r == nil || r.removed || r.id() != id {
		var ok bool
		if r, ok = sh.recs.get(id); !ok {
			return false, ErrNotFound
		}
	}
	if r.runID() != runID || !slices.Contains(from, r.Status()) {
		return false, nil
	}
	r.setState(&next)
	sh.track(r)
	s.notify(ctx, r)
	return true, nil
}

// AddWatcher implements Store.
func (s *MemStore) AddWatcher(ctx context.Context, id, runID, watcher string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if runID == "" {
		return false, ErrInvalidRunID
	}
	if err := CheckWatcher(watcher); err != nil {
		return false, err
	}
	sh := s.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	r, ok := sh.recs.get(id)
	if !ok {
		return false, ErrNotFound
	}
	if r.runID() != runID {
		return false, ErrConflict
	}
	if slices.Contains(r.watchers(), watcher) {
		return false, nil
	}
	var buf [8]string // setWatchers keeps a copy
	r.setWatchers(append(append(buf[:0], r.watchers()...), watcher))
	s.indexUser(watcher, r)
	if s.listeners.Load() != nil {
		// A join changes neither run nor status: its notice names the
		// task only, so a listener that runs the task reads who
		// watches it now.
		s.notifyChange(ctx, Change{ID: id})
	}
	return true, nil
}

// ListTasks implements Store. Records are kept in listing order, overall
// and per user, so a page costs a binary search and the records it walks:
// with Filter.VisibleTo set, in proportion to the page (and to the
// records its other filters skip), not to the store or the user's history.
func (s *MemStore) ListTasks(ctx context.Context, f Filter) ([]Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []Record
	s.matches(f, func(n int) { out = make([]Record, 0, n) }, func(v *Record) {
		v.detach()
		out = append(out, *v)
	})
	return out, nil
}

// listSnapshots returns the snapshots of the records ListTasks(ctx, f)
// returns, as Runtime.snapshot renders them but for live progress. It
// spares a listing the records' copies: the results are copied into one
// buffer that the snapshots share, each its own capped part of it, and
// nothing else is allocated per record. With peek (and f.Limit set), the
// last record of the f.Limit is only looked for: more reports that it
// exists, and it is not rendered.
func (s *MemStore) listSnapshots(ctx context.Context, f Filter, system, peek bool) (out []Snapshot, more bool, err error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	keep := f.Limit
	if peek {
		keep--
	}
	var results []byte // a full one is left to the parts taken of it
	s.matches(f, func(n int) { out = make([]Snapshot, 0, min(n, keep)) }, func(v *Record) {
		if peek && len(out) == keep {
			more = true
			return
		}
		if len(v.Result) == 0 {
			v.Result = v.Result[:0:0]
		} else {
			if results == nil && cap(out) > len(out) {
				// Room for the rest of the page, if its results are
				// of this one's size, within reason.
				results = make([]byte, 0, max(len(v.Result), min(len(v.Result)*(cap(out)-len(out)), maxResultsGuess)))
			}
			at := len(results)
			results = append(results, v.Result...)
			v.Result = results[at:len(results):len(results)]
		}
		out = append(out, Snapshot{})
		out[len(out)-1].fromRecord(v, system)
	})
	return out, more, nil
}

// maxResultsGuess bounds the buffer listSnapshots makes for a page's
// results before it has seen them all.
const maxResultsGuess = 64 << 10

// matches calls each with the records f selects, in f's order, up to
// f.Limit; first, if f sets a limit, it calls size with the most there
// can be. The record each is given aliases the stored one's watchers and
// result, and is reused for the next. It takes mu and every shard's lock
// for reading, which each is called with.
//
// A walk of an index holds them for listBatch records at a time: one
// that goes on (a filter that passes over a long history, a listing
// without a limit) lets them go and takes them again to walk on from
// the last record it looked at, as a page after a cursor does, so that
// one caller's long walk does not hold up every other caller's writes
// for all of it.
func (s *MemStore) matches(f Filter, size func(int), each func(*Record)) {
	s.mu.RLock()
	s.lockShards(false)
	defer func() {
		s.unlockShards(false)
		s.mu.RUnlock()
	}()
	user := f.VisibleTo
	idx := s.listIndex(user)
	if idx == nil {
		return
	}
	// A user's index holds exactly the records the user may see (see
	// index and AddWatcher), so Match need not check again: the check
	// would read each record's id and watchers, which at a million
	// records are cache misses.
	f.VisibleTo = ""
	live := false
	if liveOnly(f.Statuses) {
		// The live records, fewer than those of the index: a listing
		// of them costs what they are, not what the index holds. They
		// are a copy, walked under one hold.
		if l := s.liveRecords(user, idx.len()); l != nil {
			idx, live = l, true
		}
	}
	if f.Limit > 0 {
		size(min(f.Limit, idx.len()))
	}
	var v Record
	n := 0
	for {
		seen := 0
		var last *memRecord // set when the walk stops at the end of a batch
		idx.walk(f, func(r *memRecord) bool {
			if r.fill(&v); f.Match(&v) {
				each(&v)
				n++
			}
			if f.Limit > 0 && n >= f.Limit {
				return false
			}
			if seen++; seen == listBatch && !live {
				last = r
				return false
			}
			return true
		})
		if last == nil {
			return
		}
		f.After = &Position{CreatedAt: last.created.time(), ID: last.id()}
		s.unlockShards(false)
		s.mu.RUnlock()
		s.mu.RLock()
		s.lockShards(false)
		if idx = s.listIndex(user); idx == nil {
			return // the user's records are gone since
		}
	}
}

// listIndex returns the index a listing for user reads: every record
// for "", and otherwise the user's, or nil when there is none; mu is
// held.
func (s *MemStore) listIndex(user string) *ordered {
	if user == "" {
		return &s.all
	}
	return s.byUser[user]
}

// listBatch is how many records a listing looks at under one hold of
// the store's locks (see matches).
const listBatch = 4096

// liveOnly reports whether statuses, a filter's, keeps live records alone:
// PENDING, RUNNING or both.
func liveOnly(statuses []Status) bool {
	if len(statuses) == 0 {
		return false
	}
	for _, st := range statuses {
		if st != StatusPending && st != StatusRunning {
			return false
		}
	}
	return true
}

// liveRecords returns, sorted in an index of their own, the live records
// user may see (every live record for ""), or nil when the store holds
// more than an eighth of than live records, than being the size of the
// index they would otherwise be read from, which is sorted already: a
// walk of that then costs less than the sort.
// mu and every shard's lock are held.
func (s *MemStore) liveRecords(user string, than int) *ordered {
	n := 0
	for i := range s.shards {
		n += len(s.shards[i].live)
	}
	if n > than/8 {
		return nil
	}
	recs := make([]*memRecord, 0, n)
	for i := range s.shards {
		for _, r := range s.shards[i].live {
			if user == "" || r.seenBy(user) {
				recs = append(recs, r)
			}
		}
	}
	if len(recs) == 0 {
		return &ordered{}
	}
	slices.SortFunc(recs, compareMem)
	return &ordered{chunks: [][]*memRecord{recs}, n: len(recs)}
}

// DeleteFinished implements Store. It walks the records in listing order
// pruneBatchSize at a time, and releases the store's lock between
// batches, so that a store of millions of records does not stall every
// other call for the whole walk. The walk ends at the record that was
// the newest when it began. A record written between two batches is
// judged as it is when its batch comes if it sorts after the walk's
// position, and left to the next call if before. ctx is checked between
// batches, and on its end the count deleted so far comes back with its
// error.
func (s *MemStore) DeleteFinished(ctx context.Context, cutoff time.Time) (int, error) {
	n := 0
	var after *Position
	var end *memRecord
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		deleted, last := s.pruneBatch(cutoff, after, &end)
		n += deleted
		if last == nil {
			return n, nil
		}
		after = &Position{CreatedAt: last.created.time(), ID: last.id()}
	}
}

// pruneBatch is one batch of DeleteFinished: it deletes the terminal
// records completed before cutoff among the next pruneBatchSize after
// after (in listing order), up to *end, the newest record when the walk
// began, which the first batch sets. It returns how many it deleted, and
// the last record it looked at, or nil once the walk is over.
func (s *MemStore) pruneBatch(cutoff time.Time, after *Position, end **memRecord) (int, *memRecord) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lockShards(true)
	defer s.unlockShards(true)
	if *end == nil {
		if *end = s.all.newest(); *end == nil {
			return 0, nil
		}
	}
	var gone []*memRecord
	var last *memRecord
	more := false // records are left for another batch
	seen := 0
	s.all.walk(Filter{After: after}, func(r *memRecord) bool {
		if compareMem(r, *end) > 0 {
			return false // newer than the walk
		}
		if r.Status().Terminal() && r.completedAt().Before(cutoff) {
			gone = append(gone, r)
		}
		if r == *end {
			return false
		}
		last = r
		if seen++; seen == pruneBatchSize {
			more = true
			return false
		}
		return true
	})
	for _, r := range gone {
		s.shard(r.id()).remove(r)
		s.unindex(r)
	}
	if !more {
		s.compact()
		last = nil
	}
	return len(gone), last
}

// compact gives back the memory of the index that deleted records left:
// a shard's table holding under an eighth of its slots is rebuilt to fit
// what it holds, and the per-user map once it holds under a quarter of
// the most users it held, so that a burst of records that Cleanup deleted
// does not keep its index for the process's life. Each rebuild costs what
// is left, after deletions that cost more. mu and every shard's lock are
// held for writing.
func (s *MemStore) compact() {
	for i := range s.shards {
		sh := &s.shards[i]
		if slots := len(sh.recs.byHash.slots); slots > 8*minTable && 8*sh.recs.len() < slots {
			sh.recs = sh.recs.rebuilt()
		}
	}
	if len(s.byUser) < s.usersPeak/4 {
		m := make(map[string]*ordered, len(s.byUser))
		for user, idx := range s.byUser {
			m[user] = idx
		}
		s.byUser, s.usersPeak = m, len(m)
	}
}

// pruneBatchSize is how many records DeleteFinished looks at under one
// hold of the store's lock.
const pruneBatchSize = 4096

// ClearRecords implements RecordClearer: it deletes every record. Every
// listener (see Listen) then gets a Change whose Resync is set, in place
// of a notice per record deleted: a runtime sharing the store re-reads
// its runs waiting for their turn, finds their records gone, and ends
// them at once (ErrDeleted) rather than when their turn comes.
func (s *MemStore) ClearRecords(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lockShards(true)
	defer s.unlockShards(true)
	for i := range s.shards {
		s.shards[i].clear()
	}
	clear(s.byUser)
	s.all = ordered{}
	if p := s.listeners.Load(); p != nil {
		for _, l := range *p {
			l.pushResync()
		}
	}
	return nil
}

// prepare checks a whole record about to be written and returns the copy
// to store (see newMemRecord).
func prepare(rec Record, ids string) (*memRecord, error) {
	if err := checkRecord(&rec); err != nil {
		return nil, err
	}
	if err := checkMemTimes(rec.CreatedAt, rec.StartedAt, rec.CompletedAt); err != nil {
		return nil, err
	}
	rec.Result = slices.Clone(rec.Result)
	return newMemRecord(&rec, ids), nil
}

// index adds r to the listing indexes; mu must be held.
func (s *MemStore) index(r *memRecord) {
	s.all.add(r)
	r.eachUser(func(user string) { s.indexUser(user, r) })
}

// indexUser adds r to user's index, which it makes if needed; mu must be
// held.
func (s *MemStore) indexUser(user string, r *memRecord) {
	idx := s.byUser[user]
	if idx == nil {
		idx = &ordered{}
		s.byUser[user] = idx
		s.usersPeak = max(s.usersPeak, len(s.byUser))
	}
	idx.add(r)
}

// unindex removes r from the listing indexes; mu must be held.
func (s *MemStore) unindex(r *memRecord) {
	s.all.remove(r)
	r.eachUser(func(user string) {
		if idx := s.byUser[user]; idx != nil {
			if idx.remove(r); idx.len() == 0 {
				delete(s.byUser, user)
			}
		}
	})
}

// seenBy reports whether user's index holds r (see eachUser).
func (r *memRecord) seenBy(user string) bool {
	if slices.Contains(r.watchers(), user) {
		return true
	}
	o, ok := ownerOfStored(r.id())
	return ok && o == user
}

// eachUser calls f with every user whose index holds r, once each: its
// watchers, and its owner unless the owner watches it, as it usually
// does.
func (r *memRecord) eachUser(f func(user string)) {
	ws := r.watchers()
	for _, w := range ws {
		f(w)
	}
	if o, ok := ownerOfStored(r.id()); ok && !slices.Contains(ws, o) {
		f(o)
	}
}

// ordered keeps records sorted as CompareRecords sorts them. It holds the
// stored records themselves, whose ID and CreatedAt never change while
// they are stored (ReplaceTask stores a new record, unindexing the old);
// new records are the newest, so an insert is nearly always an append.
//
// The records sit in chunks of at most orderedChunk, each sorted and
// each before the next, so that a record inserted or removed anywhere
// (a re-run leaves its old record's place for the newest) moves at most
// one chunk's worth, not every record after it; and a long index grows a
// whole chunk at a time instead of copying itself into a bigger array.
// A chunk is never empty, and each has an array of its own: a chunk that
// moves to a bigger one, or joins a neighbour, leaves nothing behind that
// another chunk keeps alive.
type ordered struct {
	chunks [][]*memRecord
	n      int // records held
	max    int // chunk size; orderedChunk when 0 (tests set less)
}

// orderedChunk is the most records a chunk of an ordered holds.
const orderedChunk = 512

func (o *ordered) len() int { return o.n }

// newest returns the last record, or nil when there is none.
func (o *ordered) newest() *memRecord {
	if len(o.chunks) == 0 {
		return nil
	}
	c := o.chunks[len(o.chunks)-1]
	return c[len(c)-1]
}

func (o *ordered) chunkMax() int { return cmp.Or(o.max, orderedChunk) }

// find returns the chunk that holds r or would: the first whose last
// record does not sort before r, or the last chunk. There is at least
// one chunk.
func (o *ordered) find(r *memRecord) int {
	i, _ := slices.BinarySearchFunc(o.chunks, r, func(c []*memRecord, r *memRecord) int {
		return compareMem(c[len(c)-1], r)
	})
	return min(i, len(o.chunks)-1)
}

// add inserts r unless it is there already (a watcher added who is the
// record's owner is indexed again); the newest record, the common case,
// is appended without a search.
func (o *ordered) add(r *memRecord) {
	if len(o.chunks) == 0 {
		o.chunks = append(o.chunks, []*memRecord{r})
		o.n++
		return
	}
	last := &o.chunks[len(o.chunks)-1]
	tail := (*last)[len(*last)-1]
	if tail == r {
		return
	}
	if compareMem(tail, r) < 0 {
		if len(*last) < o.chunkMax() {
			*last = append(*last, r)
		} else {
			// A whole chunk at once: an index this long keeps growing.
			c := make([]*memRecord, 1, o.chunkMax())
			c[0] = r
			o.chunks = append(o.chunks, c)
		}
		o.n++
		return
	}
	ci := o.find(r)
	c := o.chunks[ci]
	i, found := slices.BinarySearchFunc(c, r, compareMem)
	if found {
		return
	}
	c = slices.Insert(c, i, r)
	o.n++
	if len(c) <= o.chunkMax() {
		o.chunks[ci] = c
		return
	}
	// Full: split in two halves, the second in a slice of its own.
	half := len(c) / 2
	second := slices.Clone(c[half:])
	clear(c[half:]) // the first half's spare room holds no record
	o.chunks[ci] = c[:half]
	o.chunks = slices.Insert(o.chunks, ci+1, second)
}

// remove deletes the record that sorts where r does, if there is one;
// a chunk it leaves under a quarter full may join a neighbour.
func (o *ordered) remove(r *memRecord) {
	if len(o.chunks) == 0 {
		return
	}
	ci := o.find(r)
	c := o.chunks[ci]
	i, found := slices.BinarySearchFunc(c, r, compareMem)
	if !found {
		return
	}
	o.n--
	if c = slices.Delete(c, i, i+1); len(c) == 0 {
		o.chunks = slices.Delete(o.chunks, ci, ci+1)
		return
	}
	o.chunks[ci] = c
	// A chunk under a quarter full joins a neighbour when the two fit in
	// half a chunk, so that an index most of whose records left (a
	// pruned history) does not keep a chunk for every few.
	max := o.chunkMax()
	if 4*len(c) >= max {
		return
	}
	switch {
	case ci+1 < len(o.chunks) && 2*(len(c)+len(o.chunks[ci+1])) <= max:
		o.chunks[ci] = append(c, o.chunks[ci+1]...)
		o.chunks = slices.Delete(o.chunks, ci+1, ci+2)
	case ci > 0 && 2*(len(c)+len(o.chunks[ci-1])) <= max:
		o.chunks[ci-1] = append(o.chunks[ci-1], c...)
		o.chunks = slices.Delete(o.chunks, ci, ci+1)
	}
}

// walk calls yield with the records f's order visits, starting after
// f.After in that order (for NewestFirst, with the newest record before
// it), until yield returns false.
func (o *ordered) walk(f Filter, yield func(*memRecord) bool) {
	if len(o.chunks) == 0 {
		return
	}
	// (ci, at) is where f.After falls: the first record not before it,
	// compared at the cursor's full precision; found says it is that
	// record. With no cursor, the first record.
	ci, at := 0, 0
	var found bool
	if f.After != nil {
		after := func(r *memRecord, p *Position) int {
			return compareKeys(r.created.time(), r.id(), p.CreatedAt, p.ID)
		}
		ci, _ = slices.BinarySearchFunc(o.chunks, f.After, func(c []*memRecord, p *Position) int {
			return after(c[len(c)-1], p)
		})
		if ci == len(o.chunks) {
			ci, at = ci-1, len(o.chunks[ci-1]) // past the last record
		} else {
			at, found = slices.BinarySearchFunc(o.chunks[ci], f.After, after)
		}
	}
	if f.Order == NewestFirst {
		if f.After == nil {
			ci, at = len(o.chunks)-1, len(o.chunks[len(o.chunks)-1])
		}
		for ; ci >= 0; ci-- {
			c := o.chunks[ci]
			for i := at - 1; i >= 0; i-- {
				if !yield(c[i]) {
					return
				}
			}
			if ci > 0 {
				at = len(o.chunks[ci-1]) // every record of the chunk before
			}
		}
		return
	}
	if found {
		at++
	}
	for ; ci < len(o.chunks); ci++ {
		for _, r := range o.chunks[ci][at:] {
			if !yield(r) {
				return
			}
		}
		at = 0
	}
}

// RenewLease implements Leaser, on the process's clock.
func (s *MemStore) RenewLease(ctx context.Context, instance string, ttl time.Duration) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if ttl <= 0 {
		return false, fmt.Errorf("%w: lease ttl %v is not positive", ErrInvalidOption, ttl)
	}
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	now := time.Now()
	exp, ok := s.leases[instance]
	s.leases[instance] = now.Add(ttl)
	return ok && now.Before(exp), nil
}

// ReleaseLease implements Leaser.
func (s *MemStore) ReleaseLease(ctx context.Context, instance string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	delete(s.leases, instance)
	return nil
}

// LiveInstances implements Leaser. It forgets the leases it finds
// expired.
func (s *MemStore) LiveInstances(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	now := time.Now()
	ids := make([]string, 0, len(s.leases))
	for id, exp := range s.leases {
		if now.Before(exp) {
			ids = append(ids, id)
		} else {
			delete(s.leases, id)
		}
	}
	return ids, nil
}

// maxPendingNotices bounds the notices a MemStore queues for one
// listener. Past it the listener's queue is dropped for one Change with
// Resync set, so a listener that falls behind costs bounded memory and
// never slows a writer.
const maxPendingNotices = 4096

// Listen implements Notifier. It calls changed with a Change whose
// Resync is set as soon as it listens, and then once per write that
// changed a record (InsertTask, ReplaceTask, SetTask, and a
// TransitionTask or AddWatcher that reported true), naming the task, its
// run and its status after the write, and with one Resync for a
// ClearRecords; a join's, which changes neither,
// names the task only, as a PostgreSQL store's does. Notices of one task come in write
// order; those of a task written again before changed saw the first are
// coalesced into the latest. A writer never waits for a listener: a
// listener that falls more than a few thousand tasks behind gets one
// Resync for what it missed. changed runs on Listen's goroutine.
func (s *MemStore) Listen(ctx context.Context, changed func(Change)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l := &memListener{pending: make(map[string]Change), wake: make(chan struct{}, 1)}
	l.origin, _ = ctx.Value(originKey{}).(string)
	s.addListener(l)
	defer s.removeListener(l)
	changed(Change{Resync: true})
	var batch []Change
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-l.wake:
		}
		batch = l.take(batch[:0])
		for _, c := range batch {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			changed(c)
		}
	}
}

func (s *MemStore) addListener(l *memListener) {
	s.lmu.Lock()
	defer s.lmu.Unlock()
	var ls []*memListener
	if p := s.listeners.Load(); p != nil {
		ls = slices.Clone(*p)
	}
	ls = append(ls, l)
	s.listeners.Store(&ls)
}

func (s *MemStore) removeListener(l *memListener) {
	s.lmu.Lock()
	defer s.lmu.Unlock()
	p := s.listeners.Load()
	if p == nil {
		return
	}
	ls := slices.DeleteFunc(slices.Clone(*p), func(x *memListener) bool { return x == l })
	if len(ls) == 0 {
		s.listeners.Store(nil)
		return
	}
	s.listeners.Store(&ls)
}

// othersListen reports whether a runtime other than instance listens to
// the store: one that may read what instance's runs write.
func (s *MemStore) othersListen(instance string) bool {
	if p := s.listeners.Load(); p != nil {
		for _, l := range *p {
			if l.origin != instance {
				return true
			}
		}
	}
	return false
}

// notify queues the notice of a write to r for every listener but the
// write's origin: the instance in ctx, which a runtime sets on its run
// writes (its life context), so they never wake its own listener. The
// record's shard lock is held for writing, so notices of one task are
// queued in write order. With nobody listening it costs one atomic load.
func (s *MemStore) notify(ctx context.Context, r *memRecord) {
	if s.listeners.Load() == nil {
		return
	}
	s.notifyChange(ctx, r.change())
}

// notifyChange is notify for the notice c.
func (s *MemStore) notifyChange(ctx context.Context, c Change) {
	origin, _ := ctx.Value(originKey{}).(string)
	s.notifyFrom(origin, c)
}

// notifyMinted is notify for a write of a whole record (an insert or a
// replacement), whose origin is known without asking ctx: only the
// instance that minted a run id writes a whole record under it. With
// nobody listening it costs one atomic load, as notify does.
func (s *MemStore) notifyMinted(r *memRecord) {
	if s.listeners.Load() != nil {
		s.notifyFrom(InstanceOf(r.runID()), r.change())
	}
}

// change is the notice of a write that left r: its task, run and status.
func (r *memRecord) change() Change {
	return Change{ID: r.id(), RunID: r.runID(), Status: r.Status()}
}

// notifyFrom is notify for a write known to come from the instance
// origin ("" if unknown).
func (s *MemStore) notifyFrom(origin string, c Change) {
	p := s.listeners.Load()
	if p == nil {
		return
	}
	for _, l := range *p {
		if origin == "" || l.origin != origin {
			l.push(c)
		}
	}
}

// originKey is the context key of the instance a store call is made for;
// the runtime sets it on its run writes and on its Listen call.
type originKey struct{}

// memListener is one Listen call's queue of notices.
type memListener struct {
	origin  string // the runtime listening, if one is; its own run writes are not queued
	mu      sync.Mutex
	pending map[string]Change // guarded by mu: the latest notice per task
	order   []string          // guarded by mu: the tasks of pending, by first notice
	resync  bool              // guarded by mu: notices were dropped
	wake    chan struct{}     // one token: something is queued
}

func (l *memListener) push(c Change) {
	l.mu.Lock()
	if _, ok := l.pending[c.ID]; !ok {
		if len(l.order) >= maxPendingNotices {
			clear(l.pending)
			l.order = l.order[:0]
			l.resync = true
		}
		if !l.resync {
			l.order = append(l.order, c.ID)
		}
	}
	if !l.resync {
		if p, ok := l.pending[c.ID]; ok && p.RunID == "" {
			c = Change{ID: c.ID} // a notice naming the task only stays so
		}
		l.pending[c.ID] = c
	}
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// pushResync queues a Resync in place of the notices queued: every
// record may have changed.
func (l *memListener) pushResync() {
	l.mu.Lock()
	clear(l.pending)
	l.order = l.order[:0]
	l.resync = true
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// take appends the queued notices to batch, in order, and empties the
// queue.
func (l *memListener) take(batch []Change) []Change {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.resync {
		l.resync = false
		return append(batch, Change{Resync: true})
	}
	for _, id := range l.order {
		batch = append(batch, l.pending[id])
	}
	clear(l.pending)
	l.order = l.order[:0]
	return batch
}
