package workers

import (
	"context"
	"slices"
	"sync"
	"time"
)

// MemStore is the volatile, in-memory Store, and the default. It is safe
// for concurrent use. Records are copied in and out, so nothing a caller
// holds aliases stored state; times are kept at full precision. Like a SQL
// store, it fails a call whose context is already done. Its records
// live as long as the process, so it implements RecordClearer.
//
// The zero value is not usable; call NewMemStore.
type MemStore struct {
	Authorizers

	mu     sync.RWMutex
	recs   map[string]*Record  // guarded by mu
	all    ordered             // guarded by mu: every record, in listing order
	byUser map[string]*ordered // guarded by mu: user id -> the records visible to it, in listing order
}

var (
	_ Store         = (*MemStore)(nil)
	_ RecordClearer = (*MemStore)(nil)
)

// NewMemStore returns an empty MemStore with no authorizers set.
func NewMemStore() *MemStore {
	return &MemStore{
		recs:   make(map[string]*Record),
		byUser: make(map[string]*ordered),
	}
}

// GetTask implements Store.
func (s *MemStore) GetTask(ctx context.Context, id string) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	r, ok := s.recs[id]
	if !ok {
		return Record{}, ErrNotFound
	}
	return r.Clone(), nil
}

// InsertTask implements Store.
func (s *MemStore) InsertTask(ctx context.Context, rec Record) error {
	r, err := prepare(ctx, rec)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.recs[r.ID]; ok {
		return ErrConflict
	}
	s.recs[r.ID] = r
	s.index(r)
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
	st := rec.Clone().State
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.recs[rec.ID]
	if !ok {
		return ErrNotFound
	}
	r.State = st
	return nil
}

// ReplaceTask implements Store.
func (s *MemStore) ReplaceTask(ctx context.Context, rec Record, prevRunID string) error {
	nr, err := prepare(ctx, rec)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.recs[rec.ID]
	if !ok {
		return ErrNotFound
	}
	if r.RunID != prevRunID {
		return ErrConflict
	}
	s.unindex(r)
	s.recs[nr.ID] = nr
	s.index(nr)
	return nil
}

// TransitionTask implements Store.
func (s *MemStore) TransitionTask(ctx context.Context, id, runID string, from []Status, next State) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if runID == "" {
		return false, ErrInvalidRunID
	}
	if err := checkState(&next); err != nil {
		return false, err
	}
	if next.Result != nil {
		next.Result = slices.Clone(next.Result)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.recs[id]
	if !ok {
		return false, ErrNotFound
	}
	if r.RunID != runID || !slices.Contains(from, r.Status) {
		return false, nil
	}
	r.State = next
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
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.recs[id]
	if !ok {
		return false, ErrNotFound
	}
	if r.RunID != runID {
		return false, ErrConflict
	}
	if slices.Contains(r.Watchers, watcher) {
		return false, nil
	}
	// A fresh slice, so a clone handed out earlier never sees the append.
	r.Watchers = append(slices.Clip(r.Watchers), watcher)
	s.indexUser(watcher, r)
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
	s.mu.RLock()
	defer s.mu.RUnlock()
	idx := &s.all
	if f.VisibleTo != "" {
		idx = s.byUser[f.VisibleTo]
		if idx == nil {
			return nil, nil
		}
	}
	var out []Record
	idx.walk(f, func(r *Record) bool {
		if f.Match(r) {
			out = append(out, r.Clone())
		}
		return f.Limit <= 0 || len(out) < f.Limit
	})
	return out, nil
}

// DeleteFinished implements Store.
func (s *MemStore) DeleteFinished(ctx context.Context, cutoff time.Time) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for id, r := range s.recs {
		if r.Status.Terminal() && r.CompletedAt.Before(cutoff) {
			delete(s.recs, id)
			n++
		}
	}
	if n > 0 {
		// One pass per index rather than a removal per record.
		gone := func(r *Record) bool { return s.recs[r.ID] != r }
		s.all.recs = slices.DeleteFunc(s.all.recs, gone)
		for u, idx := range s.byUser {
			if idx.recs = slices.DeleteFunc(idx.recs, gone); len(idx.recs) == 0 {
				delete(s.byUser, u)
			}
		}
	}
	return n, nil
}

// ClearRecords implements RecordClearer: it deletes every record.
func (s *MemStore) ClearRecords(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.recs)
	clear(s.byUser)
	s.all.recs = nil
	return nil
}

// prepare checks a whole record about to be written and returns the copy
// to store: one allocation that holds the record and, for the common
// short lists, its watchers.
func prepare(ctx context.Context, rec Record) (*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := checkRecord(&rec); err != nil {
		return nil, err
	}
	m := &memRecord{Record: rec}
	if len(rec.Watchers) > 0 {
		m.Watchers = append(m.watchers[:0:len(m.watchers)], rec.Watchers...)
	}
	if rec.Result != nil {
		m.Result = slices.Clone(rec.Result)
	}
	return &m.Record, nil
}

// memRecord is a stored record with room for its watchers inline. The
// watcher slice is never appended to in place (AddWatcher makes a new
// one), so a clone handed out never sees a later change.
type memRecord struct {
	Record
	watchers [2]string
}

// index adds r to the listing indexes; mu must be held.
func (s *MemStore) index(r *Record) {
	s.all.add(r)
	for _, w := range r.Watchers {
		s.indexUser(w, r)
	}
	if o, ok := OwnerOf(r.ID); ok {
		s.indexUser(o.id, r)
	}
}

func (s *MemStore) indexUser(user string, r *Record) {
	idx := s.byUser[user]
	if idx == nil {
		idx = &ordered{}
		s.byUser[user] = idx
	}
	idx.add(r)
}

// unindex removes r from the listing indexes; mu must be held.
func (s *MemStore) unindex(r *Record) {
	s.all.remove(r)
	drop := func(user string) {
		if idx := s.byUser[user]; idx != nil {
			if idx.remove(r); len(idx.recs) == 0 {
				delete(s.byUser, user)
			}
		}
	}
	for _, w := range r.Watchers {
		drop(w)
	}
	if o, ok := OwnerOf(r.ID); ok {
		drop(o.id)
	}
}

// ordered keeps records sorted as CompareRecords sorts them. It holds the
// stored records themselves, whose ID and CreatedAt never change while
// they are stored (ReplaceTask stores a new record, unindexing the old);
// new records are the newest, so an insert is nearly always an append.
type ordered struct {
	recs []*Record
}

// add inserts r once.
func (o *ordered) add(r *Record) {
	if n := len(o.recs); n == 0 || CompareRecords(o.recs[n-1], r) < 0 {
		o.recs = append(o.recs, r)
		return
	}
	i, found := slices.BinarySearchFunc(o.recs, r, CompareRecords)
	if !found {
		o.recs = slices.Insert(o.recs, i, r)
	}
}

// remove deletes r if present.
func (o *ordered) remove(r *Record) {
	if i, found := slices.BinarySearchFunc(o.recs, r, CompareRecords); found {
		o.recs = slices.Delete(o.recs, i, i+1)
	}
}

// walk calls yield with the records f's order visits, starting after
// f.After, until yield returns false.
func (o *ordered) walk(f Filter, yield func(*Record) bool) {
	var at *Record
	if f.After != nil {
		at = &Record{ID: f.After.ID, CreatedAt: f.After.CreatedAt}
	}
	if f.Order == NewestFirst {
		end := len(o.recs)
		if at != nil {
			end, _ = slices.BinarySearchFunc(o.recs, at, CompareRecords)
		}
		for i := end - 1; i >= 0; i-- {
			if !yield(o.recs[i]) {
				return
			}
		}
		return
	}
	start := 0
	if at != nil {
		var found bool
		if start, found = slices.BinarySearchFunc(o.recs, at, CompareRecords); found {
			start++
		}
	}
	for _, r := range o.recs[start:] {
		if !yield(r) {
			return
		}
	}
}
