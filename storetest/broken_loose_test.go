package storetest_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/storetest"
)

// Stores that match user ids or task ids loosely (a case-insensitive
// collation, a substring search), or whose notices miss a kind of write:
// each passed an older suite, and made a runtime misbehave (one user
// read another's tasks, or a cancel made elsewhere reached its run only
// at the sync loop).
func init() {
	for name, b := range map[string]brokenStore{
		"CaseFoldVisible": {
			func() workers.Store { return &foldVisible{workers.NewMemStore()} }, nil,
			storetest.Run, "List/VisibleToIsExact"},
		"SubstringVisible": {
			func() workers.Store { return &substringVisible{workers.NewMemStore()} }, nil,
			storetest.Run, "List/VisibleToIsExact"},
		"FoldIDs": {
			newFoldIDs, nil,
			storetest.Run, "Insert/IDsAreExact"},
		"QuietTransitions": {
			func() workers.Store { return newQuietNotifier(true, false, false) }, []storetest.Option{storetest.Timeout(time.Second)},
			storetest.Run, "Notify/EveryWriteReachesEveryListener"},
		"QuietAddWatcher": {
			func() workers.Store { return newQuietNotifier(false, true, false) }, []storetest.Option{storetest.Timeout(time.Second)},
			storetest.Run, "Notify/EveryWriteReachesEveryListener"},
		"OldStatusNotice": {
			func() workers.Store { return newQuietNotifier(false, false, true) }, []storetest.Option{storetest.Timeout(time.Second)},
			storetest.Run, "Notify/EveryWriteReachesEveryListener"},
	} {
		brokenStores[name] = b
	}
}

// looseList lists through MemStore without VisibleTo and keeps what
// seen says the user may see, then applies Limit.
func looseList(ctx context.Context, m *workers.MemStore, f workers.Filter, seen func(r *workers.Record, user string) bool) ([]workers.Record, error) {
	if f.VisibleTo == "" {
		return m.ListTasks(ctx, f)
	}
	user, limit := f.VisibleTo, f.Limit
	f.VisibleTo, f.Limit = "", 0
	all, err := m.ListTasks(ctx, f)
	if err != nil {
		return nil, err
	}
	out := all[:0]
	for i := range all {
		if seen(&all[i], user) {
			out = append(out, all[i])
		}
	}
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

func ownerPart(id string) (string, bool) {
	o, ok := workers.OwnerOf(id)
	if !ok {
		return "", false
	}
	return o.ID(), true
}

// foldVisible compares user ids case-insensitively, as a SQL store on a
// case-insensitive collation (MySQL's default, SQL Server's) does.
type foldVisible struct{ *workers.MemStore }

func (s *foldVisible) ListTasks(ctx context.Context, f workers.Filter) ([]workers.Record, error) {
	return looseList(ctx, s.MemStore, f, func(r *workers.Record, user string) bool {
		if slices.ContainsFunc(r.Watchers, func(w string) bool { return strings.EqualFold(w, user) }) {
			return true
		}
		o, ok := ownerPart(r.ID)
		return ok && strings.EqualFold(o, user)
	})
}

// substringVisible keeps watchers as one comma-joined text column and
// matches a user with instr(), as a simple SQLite store might.
type substringVisible struct{ *workers.MemStore }

func (s *substringVisible) ListTasks(ctx context.Context, f workers.Filter) ([]workers.Record, error) {
	return looseList(ctx, s.MemStore, f, func(r *workers.Record, user string) bool {
		if strings.Contains(strings.Join(r.Watchers, ","), user) {
			return true
		}
		o, ok := ownerPart(r.ID)
		return ok && o == user
	})
}

// ---- a Notifier that misses some writes ------------------------------------

// quietNotifier is a MemStore with a Notifier of its own (a trigger on
// the table, say) that, with quietTransition, does not fire on the
// status updates TransitionTask makes, or with quietWatcher, on
// AddWatcher. It delivers each notice before the write returns, so that
// what a listener heard is settled when the write is.
type quietNotifier struct {
	*workers.MemStore
	quietTransition, quietWatcher bool
	oldStatus                     bool // TransitionTask's notice names the status before it (a trigger reading OLD)

	mu        sync.Mutex
	listeners map[*quietListener]struct{}
}

type quietListener struct {
	ch   chan quietNotice
	done chan struct{}
}

type quietNotice struct {
	c   workers.Change
	ack chan struct{}
}

func newQuietNotifier(transitions, watchers, oldStatus bool) *quietNotifier {
	return &quietNotifier{MemStore: workers.NewMemStore(), quietTransition: transitions, quietWatcher: watchers, oldStatus: oldStatus,
		listeners: make(map[*quietListener]struct{})}
}

func (s *quietNotifier) notify(c workers.Change) {
	s.mu.Lock()
	ls := make([]*quietListener, 0, len(s.listeners))
	for l := range s.listeners {
		ls = append(ls, l)
	}
	s.mu.Unlock()
	for _, l := range ls {
		n := quietNotice{c, make(chan struct{})}
		select {
		case l.ch <- n:
			select {
			case <-n.ack:
			case <-l.done:
			}
		case <-l.done:
		}
	}
}

func (s *quietNotifier) Listen(ctx context.Context, changed func(workers.Change)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l := &quietListener{ch: make(chan quietNotice), done: make(chan struct{})}
	defer close(l.done)
	changed(workers.Change{Resync: true})
	s.mu.Lock()
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case n := <-l.ch:
			changed(n.c)
			close(n.ack)
		}
	}
}

func (s *quietNotifier) InsertTask(ctx context.Context, rec workers.Record) error {
	err := s.MemStore.InsertTask(ctx, rec)
	if err == nil {
		s.notify(workers.Change{ID: rec.ID, RunID: rec.RunID, Status: rec.Status})
	}
	return err
}

func (s *quietNotifier) ReplaceTask(ctx context.Context, rec workers.Record, prev string) error {
	err := s.MemStore.ReplaceTask(ctx, rec, prev)
	if err == nil {
		s.notify(workers.Change{ID: rec.ID, RunID: rec.RunID, Status: rec.Status})
	}
	return err
}

func (s *quietNotifier) SetTask(ctx context.Context, rec workers.Record) error {
	err := s.MemStore.SetTask(ctx, rec)
	if err == nil {
		s.notify(workers.Change{ID: rec.ID, Status: rec.Status})
	}
	return err
}

func (s *quietNotifier) TransitionTask(ctx context.Context, id, runID string, from []workers.Status, next workers.State) (bool, error) {
	before, _ := s.MemStore.GetTask(ctx, id)
	ok, err := s.MemStore.TransitionTask(ctx, id, runID, from, next)
	if ok && !s.quietTransition {
		st := next.Status
		if s.oldStatus {
			st = before.Status
		}
		s.notify(workers.Change{ID: id, RunID: runID, Status: st})
	}
	return ok, err
}

func (s *quietNotifier) AddWatcher(ctx context.Context, id, runID, w string) (bool, error) {
	ok, err := s.MemStore.AddWatcher(ctx, id, runID, w)
	if ok && !s.quietWatcher {
		s.notify(workers.Change{ID: id, RunID: runID})
	}
	return ok, err
}

// foldIDs keys records by their id folded to lower case, as a table
// whose id column has a case-insensitive collation (MySQL's default)
// does: an id differing from a stored one only in case reaches the
// stored record, which keeps its own spelling.
type foldIDs struct {
	*workers.MemStore
	mu     sync.Mutex
	stored map[string]string // folded id -> the id stored
}

func newFoldIDs() workers.Store {
	return &foldIDs{MemStore: workers.NewMemStore(), stored: make(map[string]string)}
}

func (s *foldIDs) actual(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a, ok := s.stored[strings.ToLower(id)]; ok {
		return a
	}
	return id
}

func (s *foldIDs) GetTask(ctx context.Context, id string) (workers.Record, error) {
	return s.MemStore.GetTask(ctx, s.actual(id))
}

func (s *foldIDs) InsertTask(ctx context.Context, rec workers.Record) error {
	if a := s.actual(rec.ID); a != rec.ID {
		if _, err := s.MemStore.GetTask(ctx, a); err == nil {
			return workers.ErrConflict
		}
	}
	err := s.MemStore.InsertTask(ctx, rec)
	if err == nil {
		s.mu.Lock()
		s.stored[strings.ToLower(rec.ID)] = rec.ID
		s.mu.Unlock()
	}
	return err
}

func (s *foldIDs) SetTask(ctx context.Context, rec workers.Record) error {
	rec.ID = s.actual(rec.ID)
	return s.MemStore.SetTask(ctx, rec)
}

func (s *foldIDs) ReplaceTask(ctx context.Context, rec workers.Record, prev string) error {
	rec.ID = s.actual(rec.ID)
	return s.MemStore.ReplaceTask(ctx, rec, prev)
}

func (s *foldIDs) TransitionTask(ctx context.Context, id, runID string, from []workers.Status, next workers.State) (bool, error) {
	return s.MemStore.TransitionTask(ctx, s.actual(id), runID, from, next)
}

func (s *foldIDs) AddWatcher(ctx context.Context, id, runID, w string) (bool, error) {
	return s.MemStore.AddWatcher(ctx, s.actual(id), runID, w)
}
