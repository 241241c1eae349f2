package storetest_test

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/storetest"
)

// Each store below wraps a MemStore and breaks one rule of the Store
// contract, the way a real implementation might. TestSuiteBites runs the
// suite against each and expects the named case to fail.

// brokenStores maps a name to a broken store, the suite to run against
// it, and the case of that suite that must catch it.
// brokenStore is a broken store, the suite to run against it, and the
// case of that suite that must catch it.
type brokenStore struct {
	newStore func() workers.Store
	opts     []storetest.Option
	suite    func(*testing.T, func(*testing.T) workers.Store, ...storetest.Option)
	fails    string
}

var brokenStores = map[string]brokenStore{
	"NoFence": {
		func() workers.Store { return noFence{workers.NewMemStore()} }, nil,
		storetest.Run, "Fencing/StaleRunRejected"},
	"LossyWatchers": {
		func() workers.Store { return lossyWatchers{workers.NewMemStore()} }, nil,
		storetest.Run, "Watchers/ConcurrentAppendsSurvive"},
	"SetClobbersIdentity": {
		func() workers.Store { return setClobbers{workers.NewMemStore()} }, nil,
		storetest.Run, "Set/WritesStateOnly"},
	"ReplaceNoFence": {
		func() workers.Store { return replaceNoFence{workers.NewMemStore()} }, nil,
		storetest.Run, "Replace/StaleRunIsConflict"},
	"AliasingCache": {
		func() workers.Store { return &aliasingCache{MemStore: workers.NewMemStore()} }, nil,
		storetest.Run, "Aliasing/GetResultNotShared"},
	"PagesIgnoreCursor": {
		func() workers.Store { return pagesIgnoreCursor{workers.NewMemStore()} }, nil,
		storetest.Run, "List/PagesWalkTheWholeListing"},
	"CursorByID": {
		func() workers.Store { return cursorByID{workers.NewMemStore()} }, nil,
		storetest.Run, "List/PagesAfterAMovedRecord"},
	"OldestFirstAlways": {
		func() workers.Store { return oldestFirstAlways{workers.NewMemStore()} }, nil,
		storetest.Run, "List/NewestFirst"},
	"PositionToTheMicrosecond": {
		func() workers.Store { return microBounds{workers.NewMemStore()} }, nil,
		storetest.Run, "List/AfterAPositionBetweenMicroseconds"},
	"CutoffToTheMicrosecond": {
		func() workers.Store { return microBounds{workers.NewMemStore()} }, nil,
		storetest.Run, "Delete/CutoffBetweenMicroseconds"},
	"DurableClearer": {
		func() workers.Store { return workers.NewMemStore() }, []storetest.Option{storetest.Durable()},
		storetest.Run, "Clear/DurableHasNoClearer"},

	"WritesWithADoneContext": {
		func() workers.Store { return ignoresDone{workers.NewMemStore()} }, nil,
		storetest.Run, "Context/DoneRefused"},

	"CleanupWithADoneContext": {
		func() workers.Store { return cleanupIgnoresDone{workers.NewMemStore()} }, nil,
		storetest.Run, "Context/DoneRefused"},

	"LeaseLastsTooLong": {
		func() workers.Store { return longLease{workers.NewMemStore()} }, nil,
		storetest.Run, "Lease/ExpiresByTheStoresClock"},
	"LeaseNeverExpires": {
		func() workers.Store { return eternalLease{workers.NewMemStore()} }, []storetest.Option{storetest.Timeout(2 * time.Second)},
		storetest.Run, "Lease/ExpiresByTheStoresClock"},
	// The notice case waits for notices that never come.
	"SilentNotifier": {
		func() workers.Store { return silentNotifier{workers.NewMemStore()} }, []storetest.Option{storetest.Timeout(500 * time.Millisecond)},
		storetest.Run, "Notify/EveryWriteReachesEveryListener"},
	"InsertOverwrites": {
		func() workers.Store { return insertOverwrites{workers.NewMemStore()} }, nil,
		storetest.Run, "Insert/ConcurrentExactlyOneWins"},
	"ReplaceChecksThenWrites": {
		newReplaceChecksThenWrites, nil,
		storetest.Run, "Replace/ConcurrentExactlyOneWins"},
	"WatchersOutliveDelete": {
		func() workers.Store { return &watchersOutliveDelete{MemStore: workers.NewMemStore()} }, nil,
		storetest.Run, "Delete/LeavesNothingBehind"},
	"FromSplitOnCommas": {
		func() workers.Store { return splitsFrom{workers.NewMemStore()} }, nil,
		storetest.Run, "Transition/UnknownFromStatusMatchesNothing"},
	"CleansRecordText": {
		func() workers.Store { return cleansText{workers.NewMemStore()} }, nil,
		storetest.Run, "Insert/InvalidRecordRefused"},
	"CleansWatcher": {
		func() workers.Store { return cleansText{workers.NewMemStore()} }, nil,
		storetest.Run, "Watchers/UnstorableRefused"},
	"EmptyFromUnchecked": {
		func() workers.Store { return emptyFromUnchecked{workers.NewMemStore()} }, nil,
		storetest.Run, "State/InvalidRefused"},
	"RefusesIDArguments": {
		func() workers.Store { return refusesIDs{workers.NewMemStore()} }, nil,
		storetest.Run, "Get/UnstorableIDIsNotFound"},
	"RefusesRunIDArguments": {
		func() workers.Store { return refusesRunIDs{workers.NewMemStore()} }, nil,
		storetest.Run, "Fencing/UnstorableRunIDMatchesNothing"},
	"WatchersListedVerbatim": {
		func() workers.Store {
			return &verbatimListedWatchers{verbatimWatchers{MemStore: workers.NewMemStore()}}
		}, nil,
		storetest.Run, "Watchers/DuplicatesStoredOnce"},
	"EmptyFromUncheckedText": {
		func() workers.Store { return emptyFromUnchecked{workers.NewMemStore()} }, nil,
		storetest.Run, "State/UnstorableRefused"},
	"RecordsEarlyTimesAsUndated": {
		func() workers.Store { return undatesEarlyTimes{workers.NewMemStore()} }, nil,
		storetest.Run, "Insert/InvalidRecordRefused"},
	"StatesEarlyTimesAsUndated": {
		func() workers.Store { return undatesEarlyTimes{workers.NewMemStore()} }, nil,
		storetest.Run, "State/InvalidRefused"},
	"WatchersKeptVerbatim": {
		func() workers.Store { return &verbatimWatchers{MemStore: workers.NewMemStore()} }, nil,
		storetest.Run, "Watchers/DuplicatesStoredOnce"},
	"DropsStack": {
		func() workers.Store { return dropsStack{workers.NewMemStore()} }, nil,
		storetest.Run, "RoundTrip/EndingFields"},

	// The same breakage seen through a runtime: a superseded run's late
	// write lands on its successor's record.
	"RuntimeNoFence": {
		func() workers.Store { return noFence{workers.NewMemStore()} }, nil,
		storetest.RunRuntime, "Rerun/SupersedesExecutingPredecessor"},
	// A cancel is checked against a stale record. The other runtime cases
	// wait for records that never change, so the watchdog is kept short.
	"RuntimeStaleReads": {
		func() workers.Store { return &staleReads{MemStore: workers.NewMemStore()} }, []storetest.Option{storetest.Timeout(500 * time.Millisecond)},
		storetest.RunRuntime, "Cancel/WhilePending"},
	// Reset through a runtime deletes the records of a store declared
	// durable.
	"RuntimeDurableClearer": {
		func() workers.Store { return workers.NewMemStore() }, []storetest.Option{storetest.Durable()},
		storetest.RunRuntime, "Reset/KeepsDurableRecords"},
}

// noFence transitions whatever run owns the record: it drops the run-id
// fence.
type noFence struct{ *workers.MemStore }

func (s noFence) TransitionTask(ctx context.Context, id, _ string, from []workers.Status, next workers.State) (bool, error) {
	r, err := s.GetTask(ctx, id)
	if err != nil {
		return false, err
	}
	return s.MemStore.TransitionTask(ctx, id, r.RunID, from, next)
}

// lossyWatchers appends by read-modify-write, so concurrent appends
// overwrite each other.
type lossyWatchers struct{ *workers.MemStore }

func (s lossyWatchers) AddWatcher(ctx context.Context, id, runID, watcher string) (bool, error) {
	if runID == "" {
		return false, workers.ErrInvalidRunID
	}
	r, err := s.GetTask(ctx, id)
	switch {
	case err != nil:
		return false, err
	case r.RunID != runID:
		return false, workers.ErrConflict
	case slices.Contains(r.Watchers, watcher):
		return false, nil
	}
	runtime.Gosched() // widen the window between the read and the write
	r.Watchers = append(r.Watchers, watcher)
	return true, s.ReplaceTask(ctx, r, runID)
}

// setClobbers writes the whole record on SetTask, identity included.
type setClobbers struct{ *workers.MemStore }

func (s setClobbers) SetTask(ctx context.Context, rec workers.Record) error {
	cur, err := s.GetTask(ctx, rec.ID)
	if err != nil {
		return err
	}
	return s.ReplaceTask(ctx, rec, cur.RunID)
}

// replaceNoFence replaces whatever run owns the record.
type replaceNoFence struct{ *workers.MemStore }

func (s replaceNoFence) ReplaceTask(ctx context.Context, rec workers.Record, _ string) error {
	cur, err := s.GetTask(ctx, rec.ID)
	if err != nil {
		return err
	}
	return s.MemStore.ReplaceTask(ctx, rec, cur.RunID)
}

// aliasingCache is a read-through cache that hands out its cached records
// themselves rather than copies, so a caller's edits reach the cache.
type aliasingCache struct {
	*workers.MemStore
	mu    sync.Mutex
	cache map[string]workers.Record // guarded by mu; emptied by every write
}

func (s *aliasingCache) GetTask(ctx context.Context, id string) (workers.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.cache[id]; ok {
		return r, nil
	}
	r, err := s.MemStore.GetTask(ctx, id)
	if err == nil {
		s.remember(r)
	}
	return r, err
}

func (s *aliasingCache) ListTasks(ctx context.Context, f workers.Filter) ([]workers.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	recs, err := s.MemStore.ListTasks(ctx, f)
	for i, r := range recs {
		if c, ok := s.cache[r.ID]; ok {
			recs[i] = c
		} else {
			s.remember(r)
		}
	}
	return recs, err
}

// remember caches r; mu must be held.
func (s *aliasingCache) remember(r workers.Record) {
	if s.cache == nil {
		s.cache = make(map[string]workers.Record)
	}
	s.cache[r.ID] = r
}

// forget empties the cache after a write.
func (s *aliasingCache) forget(err error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.cache)
	return err
}

func (s *aliasingCache) InsertTask(ctx context.Context, rec workers.Record) error {
	return s.forget(s.MemStore.InsertTask(ctx, rec))
}

func (s *aliasingCache) SetTask(ctx context.Context, rec workers.Record) error {
	return s.forget(s.MemStore.SetTask(ctx, rec))
}

func (s *aliasingCache) ReplaceTask(ctx context.Context, rec workers.Record, prevRunID string) error {
	return s.forget(s.MemStore.ReplaceTask(ctx, rec, prevRunID))
}

func (s *aliasingCache) TransitionTask(ctx context.Context, id, runID string, from []workers.Status, next workers.State) (bool, error) {
	ok, err := s.MemStore.TransitionTask(ctx, id, runID, from, next)
	return ok, s.forget(err)
}

func (s *aliasingCache) AddWatcher(ctx context.Context, id, runID, watcher string) (bool, error) {
	ok, err := s.MemStore.AddWatcher(ctx, id, runID, watcher)
	return ok, s.forget(err)
}

func (s *aliasingCache) DeleteFinished(ctx context.Context, cutoff time.Time) (int, error) {
	n, err := s.MemStore.DeleteFinished(ctx, cutoff)
	return n, s.forget(err)
}

func (s *aliasingCache) ClearRecords(ctx context.Context) error {
	return s.forget(s.MemStore.ClearRecords(ctx))
}

// staleReads is a read-through cache that only the writes creating or
// deleting records invalidate: a run's transitions and a cancel leave it
// serving the record as it was first read, so GetTask is no longer a
// durable read.
type staleReads struct {
	*workers.MemStore
	mu    sync.Mutex
	cache map[string]workers.Record // guarded by mu
}

func (s *staleReads) GetTask(ctx context.Context, id string) (workers.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.cache[id]; ok {
		return r.Clone(), nil
	}
	r, err := s.MemStore.GetTask(ctx, id)
	if err == nil {
		if s.cache == nil {
			s.cache = make(map[string]workers.Record)
		}
		s.cache[id] = r.Clone()
	}
	return r, err
}

// forget empties the cache after a write that creates or deletes records.
func (s *staleReads) forget(err error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.cache)
	return err
}

func (s *staleReads) InsertTask(ctx context.Context, rec workers.Record) error {
	return s.forget(s.MemStore.InsertTask(ctx, rec))
}

func (s *staleReads) ReplaceTask(ctx context.Context, rec workers.Record, prevRunID string) error {
	return s.forget(s.MemStore.ReplaceTask(ctx, rec, prevRunID))
}

func (s *staleReads) DeleteFinished(ctx context.Context, cutoff time.Time) (int, error) {
	n, err := s.MemStore.DeleteFinished(ctx, cutoff)
	return n, s.forget(err)
}

func (s *staleReads) ClearRecords(ctx context.Context) error {
	return s.forget(s.MemStore.ClearRecords(ctx))
}

// pagesIgnoreCursor lists from the start whatever Filter.After says.
type pagesIgnoreCursor struct{ *workers.MemStore }

func (s pagesIgnoreCursor) ListTasks(ctx context.Context, f workers.Filter) ([]workers.Record, error) {
	f.After = nil
	return s.MemStore.ListTasks(ctx, f)
}

// cursorByID takes Filter.After as the record it names: it pages after
// that record's place now, and from the start once it is gone.
type cursorByID struct{ *workers.MemStore }

func (s cursorByID) ListTasks(ctx context.Context, f workers.Filter) ([]workers.Record, error) {
	if f.After != nil {
		if r, err := s.GetTask(ctx, f.After.ID); err == nil {
			f.After = workers.PositionOf(&r)
		} else {
			f.After = nil
		}
	}
	return s.MemStore.ListTasks(ctx, f)
}

// microBounds truncates a listing's position and a cleanup's cutoff to
// the microsecond, as it keeps the times it stores: a position or a
// cutoff between two microseconds then compares as the one before.
type microBounds struct{ *workers.MemStore }

func (s microBounds) ListTasks(ctx context.Context, f workers.Filter) ([]workers.Record, error) {
	if f.After != nil {
		f.After = &workers.Position{CreatedAt: f.After.CreatedAt.Truncate(time.Microsecond), ID: f.After.ID}
	}
	return s.MemStore.ListTasks(ctx, f)
}

func (s microBounds) DeleteFinished(ctx context.Context, cutoff time.Time) (int, error) {
	return s.MemStore.DeleteFinished(ctx, cutoff.Truncate(time.Microsecond))
}

// oldestFirstAlways ignores Filter.Order.
type oldestFirstAlways struct{ *workers.MemStore }

func (s oldestFirstAlways) ListTasks(ctx context.Context, f workers.Filter) ([]workers.Record, error) {
	f.Order = workers.OldestFirst
	return s.MemStore.ListTasks(ctx, f)
}

// eternalLease renews every lease for a day, whatever ttl it is given.
type eternalLease struct{ *workers.MemStore }

func (s eternalLease) RenewLease(ctx context.Context, instance string, _ time.Duration) (bool, error) {
	return s.MemStore.RenewLease(ctx, instance, 24*time.Hour)
}

// ignoresDone makes its transitions whatever their context says, as a
// store that never looks at it before writing would.
type ignoresDone struct{ *workers.MemStore }

func (s ignoresDone) TransitionTask(ctx context.Context, id, runID string, from []workers.Status, next workers.State) (bool, error) {
	return s.MemStore.TransitionTask(context.WithoutCancel(ctx), id, runID, from, next)
}

// cleanupIgnoresDone answers a DeleteFinished whose cutoff can delete
// nothing (one not after the zero time) without looking at its context.
type cleanupIgnoresDone struct{ *workers.MemStore }

func (s cleanupIgnoresDone) DeleteFinished(ctx context.Context, cutoff time.Time) (int, error) {
	if !cutoff.After(time.Time{}) {
		return 0, nil
	}
	return s.MemStore.DeleteFinished(ctx, cutoff)
}

// longLease grants every lease twenty times the ttl it is given.
type longLease struct{ *workers.MemStore }

func (s longLease) RenewLease(ctx context.Context, instance string, ttl time.Duration) (bool, error) {
	return s.MemStore.RenewLease(ctx, instance, 20*ttl)
}

// silentNotifier listens, says Resync, and then never says anything.
type silentNotifier struct{ *workers.MemStore }

func (silentNotifier) Listen(ctx context.Context, changed func(workers.Change)) error {
	changed(workers.Change{Resync: true})
	<-ctx.Done()
	return ctx.Err()
}

// dropsStack forgets a transition's stack, as a store missing the column
// would.
type dropsStack struct{ *workers.MemStore }

func (s dropsStack) TransitionTask(ctx context.Context, id, runID string, from []workers.Status, next workers.State) (bool, error) {
	next.Stack = ""
	return s.MemStore.TransitionTask(ctx, id, runID, from, next)
}

// splitsFrom takes each status of a transition's from as a
// comma-separated list of statuses, as a store that joins them with
// commas for its database and splits them again would.
type splitsFrom struct{ *workers.MemStore }

func (s splitsFrom) TransitionTask(ctx context.Context, id, runID string, from []workers.Status, next workers.State) (bool, error) {
	var split []workers.Status
	for _, st := range from {
		for part := range strings.SplitSeq(string(st), ",") {
			split = append(split, workers.Status(part))
		}
	}
	return s.MemStore.TransitionTask(ctx, id, runID, split, next)
}

// cleansText stores a record whose run id, queue or watchers hold a NUL
// byte or invalid UTF-8, and adds such a watcher, with each such byte
// replaced, as a store that encodes them leniently would, instead of
// refusing it.
type cleansText struct{ *workers.MemStore }

func clean(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

func (c cleansText) cleaned(rec workers.Record) workers.Record {
	rec = rec.Clone()
	rec.RunID, rec.Queue = clean(rec.RunID), clean(rec.Queue)
	for i, w := range rec.Watchers {
		rec.Watchers[i] = clean(w)
	}
	return rec
}

func (c cleansText) InsertTask(ctx context.Context, rec workers.Record) error {
	return c.MemStore.InsertTask(ctx, c.cleaned(rec))
}

func (c cleansText) ReplaceTask(ctx context.Context, rec workers.Record, prevRunID string) error {
	return c.MemStore.ReplaceTask(ctx, c.cleaned(rec), prevRunID)
}

func (c cleansText) AddWatcher(ctx context.Context, id, runID, watcher string) (bool, error) {
	return c.MemStore.AddWatcher(ctx, id, runID, clean(watcher))
}

// emptyFromUnchecked answers a transition with an empty from, which can
// write nothing, without checking its next state.
type emptyFromUnchecked struct{ *workers.MemStore }

func (s emptyFromUnchecked) TransitionTask(ctx context.Context, id, runID string, from []workers.Status, next workers.State) (bool, error) {
	if len(from) == 0 && runID != "" {
		_, err := s.GetTask(ctx, id)
		return false, err
	}
	return s.MemStore.TransitionTask(ctx, id, runID, from, next)
}

// refusesRunIDs refuses a run id argument holding a NUL byte or invalid
// UTF-8 with ErrInvalidData, as a database that cannot hold it does when
// it is sent, instead of matching no record with it.
// refusesIDs refuses an id argument that no record can hold with
// ErrInvalidData, as a database whose text type refuses it would, where
// the contract says no record has that id.
type refusesIDs struct{ *workers.MemStore }

func (s refusesIDs) GetTask(ctx context.Context, id string) (workers.Record, error) {
	if clean(id) != id {
		return workers.Record{}, workers.ErrInvalidData
	}
	return s.MemStore.GetTask(ctx, id)
}

type refusesRunIDs struct{ *workers.MemStore }

// check returns the error for the run id argument runID, or nil.
func (refusesRunIDs) check(runID string) error {
	if clean(runID) != runID {
		return workers.ErrInvalidData
	}
	return nil
}

func (s refusesRunIDs) TransitionTask(ctx context.Context, id, runID string, from []workers.Status, next workers.State) (bool, error) {
	if err := s.check(runID); err != nil {
		return false, err
	}
	return s.MemStore.TransitionTask(ctx, id, runID, from, next)
}

func (s refusesRunIDs) ReplaceTask(ctx context.Context, rec workers.Record, prevRunID string) error {
	if err := s.check(prevRunID); err != nil {
		return err
	}
	return s.MemStore.ReplaceTask(ctx, rec, prevRunID)
}

func (s refusesRunIDs) AddWatcher(ctx context.Context, id, runID, watcher string) (bool, error) {
	if err := s.check(runID); err != nil {
		return false, err
	}
	return s.MemStore.AddWatcher(ctx, id, runID, watcher)
}

// verbatimWatchers keeps each record's watcher list as InsertTask or
// ReplaceTask was given it, duplicates included, and GetTask returns
// that list, as a store that keeps the list whole in one column would.
type verbatimWatchers struct {
	*workers.MemStore
	mu   sync.Mutex
	kept map[string][]string // guarded by mu
}

func (s *verbatimWatchers) keep(rec workers.Record, err error) error {
	if err == nil {
		s.mu.Lock()
		if s.kept == nil {
			s.kept = map[string][]string{}
		}
		s.kept[rec.ID] = slices.Clone(rec.Watchers)
		s.mu.Unlock()
	}
	return err
}

func (s *verbatimWatchers) InsertTask(ctx context.Context, rec workers.Record) error {
	return s.keep(rec, s.MemStore.InsertTask(ctx, rec))
}

func (s *verbatimWatchers) ReplaceTask(ctx context.Context, rec workers.Record, prevRunID string) error {
	return s.keep(rec, s.MemStore.ReplaceTask(ctx, rec, prevRunID))
}

func (s *verbatimWatchers) GetTask(ctx context.Context, id string) (workers.Record, error) {
	r, err := s.MemStore.GetTask(ctx, id)
	s.mu.Lock()
	if w, ok := s.kept[id]; ok && err == nil {
		r.Watchers = slices.Clone(w)
	}
	s.mu.Unlock()
	return r, err
}

func (s *verbatimWatchers) ListTasks(ctx context.Context, f workers.Filter) ([]workers.Record, error) {
	recs, err := s.MemStore.ListTasks(ctx, f)
	s.mu.Lock()
	for i := range recs {
		if w, ok := s.kept[recs[i].ID]; ok {
			recs[i].Watchers = slices.Clone(w)
		}
	}
	s.mu.Unlock()
	return recs, err
}

// verbatimListedWatchers keeps a record's watchers as given only in what
// ListTasks returns.
type verbatimListedWatchers struct{ verbatimWatchers }

func (s *verbatimListedWatchers) GetTask(ctx context.Context, id string) (workers.Record, error) {
	return s.MemStore.GetTask(ctx, id)
}

// undatesEarlyTimes stores a time before the zero time as none, instead
// of refusing it, as a store whose columns cannot hold it might.
type undatesEarlyTimes struct{ *workers.MemStore }

func undate(ts ...*time.Time) {
	for _, t := range ts {
		if t.Before(time.Time{}) {
			*t = time.Time{}
		}
	}
}

func (s undatesEarlyTimes) InsertTask(ctx context.Context, rec workers.Record) error {
	undate(&rec.CreatedAt, &rec.StartedAt, &rec.CompletedAt)
	return s.MemStore.InsertTask(ctx, rec)
}

func (s undatesEarlyTimes) ReplaceTask(ctx context.Context, rec workers.Record, prevRunID string) error {
	undate(&rec.CreatedAt, &rec.StartedAt, &rec.CompletedAt)
	return s.MemStore.ReplaceTask(ctx, rec, prevRunID)
}

func (s undatesEarlyTimes) SetTask(ctx context.Context, rec workers.Record) error {
	undate(&rec.StartedAt, &rec.CompletedAt)
	return s.MemStore.SetTask(ctx, rec)
}

func (s undatesEarlyTimes) TransitionTask(ctx context.Context, id, runID string, from []workers.Status, next workers.State) (bool, error) {
	undate(&next.StartedAt, &next.CompletedAt)
	return s.MemStore.TransitionTask(ctx, id, runID, from, next)
}

// insertOverwrites inserts as INSERT OR REPLACE would: a record of an id
// that has one overwrites it.
type insertOverwrites struct{ *workers.MemStore }

func (s insertOverwrites) InsertTask(ctx context.Context, rec workers.Record) error {
	if err := s.MemStore.InsertTask(ctx, rec); !errors.Is(err, workers.ErrConflict) {
		return err
	}
	cur, err := s.GetTask(ctx, rec.ID)
	if err != nil {
		return err
	}
	return s.MemStore.ReplaceTask(ctx, rec, cur.RunID)
}

// replaceChecksThenWrites checks the run it replaces, then writes over
// whatever run is stored by then. Between the two it yields, for up to
// a second, until a second caller has checked too, so that a race finds
// the window open.
type replaceChecksThenWrites struct {
	*workers.MemStore
	checked *atomic.Int32
}

func newReplaceChecksThenWrites() workers.Store {
	return replaceChecksThenWrites{MemStore: workers.NewMemStore(), checked: new(atomic.Int32)}
}

func (s replaceChecksThenWrites) ReplaceTask(ctx context.Context, rec workers.Record, prevRunID string) error {
	cur, err := s.GetTask(ctx, rec.ID)
	if err != nil {
		return err
	}
	if cur.RunID != prevRunID {
		return workers.ErrConflict
	}
	s.checked.Add(1)
	for deadline := time.Now().Add(time.Second); s.checked.Load() < 2 && time.Now().Before(deadline); {
		runtime.Gosched()
	}
	for { // over whatever run is stored now
		cur, err = s.GetTask(ctx, rec.ID)
		if err != nil {
			return err
		}
		if err := s.MemStore.ReplaceTask(ctx, rec, cur.RunID); !errors.Is(err, workers.ErrConflict) {
			return err
		}
	}
}

// watchersOutliveDelete keeps the watchers of the records it deletes and
// gives them to the next record of the same id, as a database whose
// watcher rows are not deleted with their task would.
type watchersOutliveDelete struct {
	*workers.MemStore
	mu   sync.Mutex
	left map[string][]string
}

func (s *watchersOutliveDelete) DeleteFinished(ctx context.Context, cutoff time.Time) (int, error) {
	recs, err := s.ListTasks(ctx, workers.Filter{Statuses: []workers.Status{workers.StatusCompleted, workers.StatusFailed, workers.StatusCancelled}})
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	if s.left == nil {
		s.left = map[string][]string{}
	}
	for _, r := range recs {
		if r.CompletedAt.Before(cutoff) {
			s.left[r.ID] = r.Watchers
		}
	}
	s.mu.Unlock()
	return s.MemStore.DeleteFinished(ctx, cutoff)
}

func (s *watchersOutliveDelete) InsertTask(ctx context.Context, rec workers.Record) error {
	s.mu.Lock()
	for _, w := range s.left[rec.ID] {
		if !slices.Contains(rec.Watchers, w) {
			rec.Watchers = append(rec.Watchers, w)
		}
	}
	s.mu.Unlock()
	return s.MemStore.InsertTask(ctx, rec)
}
