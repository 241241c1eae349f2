package workers

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// memRecord is how a MemStore keeps a record. What every record has sits
// inline; what a waiting record lacks (its start and end) sits apart in
// a memRest made when first needed, so that a PENDING record, the most
// numerous kind in a long queue, stays small; and what a run that
// completed plainly lacks (a result, an error, a cause other than
// completed) sits apart again, so that the most numerous kind of ended
// record stays small too. Times are microseconds (see memTime), and the
// first watcher has room inline.
//
// A later write changes first, rest and rest.outcome in place, and
// replaces more: the readers that are handed a record's watchers or
// result without a copy (fill) read them under the record's shard lock
// (see MemStore), and every other reader gets a detached copy.
type memRecord struct {
	ids      string    // the task id, then the run id: a runtime's run shares its own (see runIDs)
	queue    string    //
	first    [1]string // the only watcher; empty when there is none or more is set
	more     *[]string // every watcher, when first cannot hold them
	rest     *memRest  // nil while the record has no start, no end and no outcome beyond its status's
	run      *Task     // guarded by its shard's lock: the run whose handle the record keeps, or nil (see runSet)
	created  memTime
	attempt  int32 // CheckState bounds Progress and Attempt
	idLen    uint16
	progress uint8
	status   uint8 // an index in memStatuses
	removed  bool  // guarded by its shard's lock: no longer stored (see MemStore.transition)
	shard    uint8 // the index of its shard plus one, set as it is stored; 0 before
	livePos  int32 // guarded by its shard's lock: its index in the shard's live records plus one; 0 when not among them
}

// id returns the record's task id.
func (r *memRecord) id() string { return r.ids[:r.idLen] }

// runID returns the record's run id.
func (r *memRecord) runID() string { return r.ids[r.idLen:] }

// memRest is the part of a record that a PENDING one lacks.
type memRest struct {
	startedAt, completedAt memTime
	outcome                *memOutcome // nil while its fields are what the status implies
}

// memOutcome is what a record says beyond its times and its status: a
// result, an error, a cause other than the one its status implies (see
// plainOutcome). A plainly completed record, like a live one, has none.
type memOutcome struct {
	result       json.RawMessage
	cause        Cause
	errText      string
	cancelledBy  string
	cancelReason string
	stack        string
}

// memRecordWithRest is a record inserted with a memRest already (a run
// registered RUNNING, a record inserted ended): both parts in one
// allocation.
type memRecordWithRest struct {
	memRecord
	rest memRest
}

// memTime is a time as a MemStore keeps it: microseconds since the zero
// time (January 1, year 1, UTC), so that the zero time is 0. It holds no
// pointer and no location, and orders as the times do.
type memTime int64

// memTimeLimit bounds, in seconds either side of the zero time (about
// 285,000 years), the times a memTime holds.
const memTimeLimit = 9e12

// zeroUnix is the zero time in Unix seconds.
const zeroUnix = -62135596800

// toMemTime returns t to the microsecond, or false when t lies beyond
// memTimeLimit. (A time within the zero time's microsecond, which would
// read back as zero, CheckRecord and CheckState refuse before.)
func toMemTime(t time.Time) (memTime, bool) {
	s := t.Unix() - zeroUnix
	if s < -memTimeLimit || s > memTimeLimit {
		return 0, false
	}
	return memTime(s*1e6 + int64(t.Nanosecond()/1e3)), true
}

// mustMemTime is toMemTime for a time checkMemTimes has passed.
func mustMemTime(t time.Time) memTime {
	m, _ := toMemTime(t)
	return m
}

// time returns m as a time in UTC.
func (m memTime) time() time.Time {
	if m == 0 {
		return time.Time{}
	}
	return time.UnixMicro(int64(m) + zeroUnix*1e6).UTC()
}

// checkMemTimes reports the first time a MemStore cannot keep, with
// ErrInvalidData.
func checkMemTimes(ts ...time.Time) error {
	for _, t := range ts {
		if _, ok := toMemTime(t); !ok {
			return fmt.Errorf("%w: a MemStore cannot keep time %v", ErrInvalidData, t)
		}
	}
	return nil
}

// memStatuses are the statuses, indexed by memRecord.status.
var memStatuses = [...]Status{StatusPending, StatusRunning, StatusCompleted, StatusFailed, StatusCancelled}

// statusCode is s's index in memStatuses; s has passed checkState.
func statusCode(s Status) uint8 {
	return uint8(slices.Index(memStatuses[:], s))
}

// impliedCause is the cause a record of status s holds unless it says
// otherwise: completed for a COMPLETED one, none for any other.
func impliedCause(s Status) Cause {
	if s == StatusCompleted {
		return CauseCompleted
	}
	return CauseNone
}

// plainOutcome reports whether st's outcome fields are what its status
// implies, so that no memOutcome need keep them.
func plainOutcome(st *State) bool {
	return st.Result == nil && st.Cause == impliedCause(st.Status) && st.Error == "" &&
		st.CancelledBy == "" && st.CancelReason == "" && st.Stack == ""
}

// hasRest reports whether st, which has passed checkMemTimes, needs a
// memRest: it has a start or an end, or its outcome is not plain (see
// plainOutcome).
func hasRest(st *State, plain bool) bool {
	return !st.StartedAt.IsZero() || !st.CompletedAt.IsZero() || !plain
}

// newMemRecord returns the stored copy of rec, which has passed
// checkRecord and checkMemTimes and whose Result the store owns: one
// allocation for the common record, its one watcher included. ids is
// rec's ID then its RunID in one string, as a runtime's run holds them,
// or "" to have them joined here.
func newMemRecord(rec *Record, ids string) *memRecord {
	var r *memRecord
	if hasRest(&rec.State, plainOutcome(&rec.State)) {
		w := new(memRecordWithRest)
		r = &w.memRecord
		r.rest = &w.rest
	} else {
		r = new(memRecord)
	}
	if ids == "" {
		ids = rec.ID + rec.RunID
	}
	r.ids, r.idLen, r.queue, r.created = ids, uint16(len(rec.ID)), rec.Queue, mustMemTime(rec.CreatedAt)
	r.setState(&rec.State)
	r.setWatchers(distinct(rec.Watchers))
	return r
}

// distinct returns w with each watcher once, where it first appears: w
// itself, with no copy, when no watcher is there twice. A runtime's
// watcher lists never are, and its records are built without it (see
// Task.memRecord). A list longer than distinctSet is checked through a
// set, which it allocates, so that a record or a submission naming
// thousands of watchers costs O(n), not O(n²); a shorter one allocates
// nothing unless it has a repeat.
func distinct(w []string) []string {
	if len(w) > distinctSet {
		return distinctLong(w)
	}
	for i := 1; i < len(w); i++ {
		if !slices.Contains(w[:i], w[i]) {
			continue
		}
		out := slices.Clone(w[:i])
		for _, x := range w[i+1:] {
			if !slices.Contains(out, x) {
				out = append(out, x)
			}
		}
		return out
	}
	return w
}

// distinctSet is the length past which distinct checks a list through a
// set rather than by comparing each name with those before it.
const distinctSet = 32

// distinctLong is distinct through a set.
func distinctLong(w []string) []string {
	seen := make(map[string]struct{}, len(w))
	for i, x := range w {
		if _, twice := seen[x]; !twice {
			seen[x] = struct{}{}
			continue
		}
		out := slices.Clone(w[:i])
		for _, y := range w[i+1:] {
			if _, twice := seen[y]; !twice {
				seen[y] = struct{}{}
				out = append(out, y)
			}
		}
		return out
	}
	return w
}

// taskID returns the record's id, which keys it in the store's idMap.
func (r *memRecord) taskID() string { return r.id() }

// watchers returns the record's watchers, which the caller must not
// modify.
func (r *memRecord) watchers() []string {
	switch {
	case r.more != nil:
		return *r.more
	case r.first[0] != "":
		return r.first[:]
	}
	return nil
}

// setWatchers stores a copy of w: one watcher inline, more in a slice
// of their own.
func (r *memRecord) setWatchers(w []string) {
	r.first[0], r.more = "", nil
	switch {
	case len(w) == 1 && w[0] != "":
		r.first[0] = w[0]
	case len(w) > 0:
		all := slices.Clone(w)
		r.more = &all
	}
}

// setState writes st, which has passed checkState and checkMemTimes and
// whose Result the store owns. rest and its outcome are written in
// place, made when first needed: clones copy their fields out.
func (r *memRecord) setState(st *State) {
	r.status, r.progress, r.attempt = statusCode(st.Status), uint8(st.Progress), int32(st.Attempt)
	plain := plainOutcome(st)
	if !hasRest(st, plain) {
		r.rest = nil
		return
	}
	if r.rest == nil {
		r.rest = new(memRest)
	}
	m := r.rest
	m.startedAt, m.completedAt = mustMemTime(st.StartedAt), mustMemTime(st.CompletedAt)
	if plain {
		m.outcome = nil
		return
	}
	if m.outcome == nil {
		m.outcome = new(memOutcome)
	}
	*m.outcome = memOutcome{
		result: st.Result, cause: st.Cause, errText: st.Error,
		cancelledBy: st.CancelledBy, cancelReason: st.CancelReason, stack: st.Stack,
	}
}

// Status returns the record's status.
func (r *memRecord) Status() Status { return memStatuses[r.status] }

// live reports whether the record is PENDING or RUNNING (the first two
// of memStatuses).
func (r *memRecord) live() bool { return r.status <= 1 }

// fill writes the record into v without copying its watchers or result:
// the caller reads v under the record's shard lock and keeps none of
// it, or detaches it. Every field of v is written.
func (r *memRecord) fill(v *Record) {
	*v = Record{ID: r.id(), RunID: r.runID(), Queue: r.queue, Watchers: r.watchers(), CreatedAt: r.created.time(),
		State: State{Status: r.Status(), Progress: int(r.progress), Attempt: int(r.attempt), Cause: impliedCause(r.Status())}}
	m := r.rest
	if m == nil {
		return
	}
	v.StartedAt, v.CompletedAt = m.startedAt.time(), m.completedAt.time()
	if o := m.outcome; o != nil {
		v.Result, v.Cause, v.Error = o.result, o.cause, o.errText
		v.CancelledBy, v.CancelReason, v.Stack = o.cancelledBy, o.cancelReason, o.stack
	}
}

// completedAt returns the record's CompletedAt.
func (r *memRecord) completedAt() time.Time {
	if r.rest == nil {
		return time.Time{}
	}
	return r.rest.completedAt.time()
}

// compareMem orders records as CompareRecords does.
func compareMem(a, b *memRecord) int {
	if c := cmp.Compare(a.created, b.created); c != 0 {
		return c
	}
	return strings.Compare(a.id(), b.id())
}
