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
	recs   map[string]*Record             // guarded by mu
	byUser map[string]map[string]struct{} // guarded by mu: user id -> ids visible to it
}

var (
	_ Store         = (*MemStore)(nil)
	_ RecordClearer = (*MemStore)(nil)
)

// NewMemStore returns an empty MemStore with no authorizers set.
func NewMemStore() *MemStore {
	return &MemStore{
		recs:   make(map[string]*Record),
		byUser: make(map[string]map[string]struct{}),
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
	s.indexUser(watcher, id)
	return true, nil
}

// ListTasks implements Store. With Filter.VisibleTo set it costs in
// proportion to that user's tasks, not to the store.
func (s *MemStore) ListTasks(ctx context.Context, f Filter) ([]Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.RLock()
	var out []Record
	add := func(r *Record) {
		if f.Match(r) {
			out = append(out, r.Clone())
		}
	}
	if f.VisibleTo != "" {
		for id := range s.byUser[f.VisibleTo] {
			add(s.recs[id])
		}
	} else {
		for _, r := range s.recs {
			add(r)
		}
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b Record) int { return CompareRecords(&a, &b) })
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit:f.Limit]
	}
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
			s.unindex(r)
			delete(s.recs, id)
			n++
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

// index adds r to the per-user index; mu must be held.
func (s *MemStore) index(r *Record) {
	for _, w := range r.Watchers {
		s.indexUser(w, r.ID)
	}
	// The owner is usually the first watcher already: one map write less.
	if o, ok := OwnerOf(r.ID); ok && !slices.Contains(r.Watchers, o.id) {
		s.indexUser(o.id, r.ID)
	}
}

func (s *MemStore) indexUser(user, id string) {
	ids := s.byUser[user]
	if ids == nil {
		ids = make(map[string]struct{})
		s.byUser[user] = ids
	}
	ids[id] = struct{}{}
}

// unindex removes r from the per-user index; mu must be held.
func (s *MemStore) unindex(r *Record) {
	drop := func(user string) {
		if ids := s.byUser[user]; ids != nil {
			delete(ids, r.ID)
			if len(ids) == 0 {
				delete(s.byUser, user)
			}
		}
	}
	for _, w := range r.Watchers {
		drop(w)
	}
	if o, ok := OwnerOf(r.ID); ok && !slices.Contains(r.Watchers, o.id) {
		drop(o.id)
	}
}
