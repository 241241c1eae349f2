package workers

import (
	"encoding/json"
	"slices"
	"time"
)

// memRecord is how a MemStore keeps a record. What every record has sits
// inline; what a waiting record lacks (its start, its outcome, an error)
// sits apart in a memRest made when first needed, so that a PENDING
// record, the most numerous kind in a long queue, stays small. The first
// watcher has room inline.
//
// The watcher slice is never appended to in place (AddWatcher makes a new
// one), and a clone copies rest's fields out, so nothing handed out
// aliases what a later write changes.
type memRecord struct {
	id, runID, queue string
	watchers         []string
	created          time.Time
	progress         int
	attempt          int
	rest             *memRest // nil while all of its fields are zero
	first            [1]string
	status           uint8 // an index in memStatuses
}

// memRest is the part of a record that a PENDING one lacks.
type memRest struct {
	startedAt, completedAt time.Time
	result                 json.RawMessage
	cause                  Cause
	errText                string
	cancelledBy            string
	cancelReason           string
	stack                  string
}

// memRecordWithRest is a record inserted with a start or an outcome
// already (a run registered RUNNING): both parts in one allocation.
type memRecordWithRest struct {
	memRecord
	rest memRest
}

// memStatuses are the statuses, indexed by memRecord.status.
var memStatuses = [...]Status{StatusPending, StatusRunning, StatusCompleted, StatusFailed, StatusCancelled}

// statusCode is s's index in memStatuses; s has passed checkState.
func statusCode(s Status) uint8 {
	return uint8(slices.Index(memStatuses[:], s))
}

// restOf returns the fields of st that a memRest keeps.
func restOf(st *State) memRest {
	return memRest{
		startedAt: st.StartedAt, completedAt: st.CompletedAt,
		result: st.Result, cause: st.Cause, errText: st.Error,
		cancelledBy: st.CancelledBy, cancelReason: st.CancelReason, stack: st.Stack,
	}
}

// zero reports whether every field of m is zero.
func (m *memRest) zero() bool {
	return m.startedAt == time.Time{} && m.completedAt == time.Time{} && m.result == nil &&
		m.cause == "" && m.errText == "" && m.cancelledBy == "" && m.cancelReason == "" && m.stack == ""
}

// newMemRecord returns the stored copy of rec, which has been checked and
// whose Result the store owns: one allocation for the common record,
// watchers included.
func newMemRecord(rec *Record) *memRecord {
	var r *memRecord
	if rest := restOf(&rec.State); rest.zero() {
		r = new(memRecord)
	} else {
		w := &memRecordWithRest{rest: rest}
		r = &w.memRecord
		r.rest = &w.rest
	}
	r.id, r.runID, r.queue, r.created = rec.ID, rec.RunID, rec.Queue, rec.CreatedAt
	r.status, r.progress, r.attempt = statusCode(rec.Status), rec.Progress, rec.Attempt
	if len(rec.Watchers) > 0 {
		r.watchers = append(r.first[:0:len(r.first)], rec.Watchers...)
	}
	return r
}

// setState writes st, which has passed checkState and whose Result the
// store owns. rest is written in place: clones copy its fields out.
func (r *memRecord) setState(st *State) {
	r.status, r.progress, r.attempt = statusCode(st.Status), st.Progress, st.Attempt
	rest := restOf(st)
	switch {
	case rest.zero():
		r.rest = nil
	case r.rest == nil:
		r.rest = new(memRest)
		fallthrough
	default:
		*r.rest = rest
	}
}

// Status returns the record's status.
func (r *memRecord) Status() Status { return memStatuses[r.status] }

// fill writes the record into v without copying its watchers or result:
// the caller reads v under the store's lock and keeps none of it, or
// detaches it. Every field of v is written.
func (r *memRecord) fill(v *Record) {
	*v = Record{ID: r.id, RunID: r.runID, Queue: r.queue, Watchers: r.watchers, CreatedAt: r.created,
		State: State{Status: r.Status(), Progress: r.progress, Attempt: r.attempt}}
	if m := r.rest; m != nil {
		v.StartedAt, v.CompletedAt, v.Result, v.Cause = m.startedAt, m.completedAt, m.result, m.cause
		v.Error, v.CancelledBy, v.CancelReason, v.Stack = m.errText, m.cancelledBy, m.cancelReason, m.stack
	}
}

// completedAt returns the record's CompletedAt.
func (r *memRecord) completedAt() time.Time {
	if r.rest == nil {
		return time.Time{}
	}
	return r.rest.completedAt
}

// compareMem orders records as CompareRecords does.
func compareMem(a, b *memRecord) int {
	return compareKeys(a.created, a.id, b.created, b.id)
}
