package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

var (
	pendingOnly = []workers.Status{workers.StatusPending}
	runningOnly = []workers.Status{workers.StatusRunning}
	allStatuses = []workers.Status{workers.StatusPending, workers.StatusRunning, workers.StatusCompleted, workers.StatusFailed, workers.StatusCancelled}
)

// started is the State a run writes when it starts.
var started = workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: at(1)}

func (*suite) getMissing(t *testing.T, s workers.Store) {
	wantMissing(t, s, "alice::nobody")
	insert(t, s, record("alice::a", "run-1"))
	wantMissing(t, s, "alice::nobody")
}

func (*suite) getUnstorableID(t *testing.T, s workers.Store) {
	insert(t, s, record("alice::a", "run-1", "alice"))
	for _, u := range unstorable {
		id := "alice::" + u.text
		_, err := s.GetTask(t.Context(), id)
		wantErr(t, "GetTask of an id with "+u.name, err, workers.ErrNotFound)
		wantErr(t, "SetTask of an id with "+u.name, s.SetTask(t.Context(), workers.Record{ID: id, State: started}), workers.ErrNotFound)
		ok, err := s.TransitionTask(t.Context(), id, "run-1", allStatuses, started)
		if ok {
			t.Errorf("TransitionTask of an id with %s reported true", u.name)
		}
		wantErr(t, "TransitionTask of an id with "+u.name, err, workers.ErrNotFound)
		added, err := s.AddWatcher(t.Context(), id, "run-1", "bob")
		if added {
			t.Errorf("AddWatcher to an id with %s reported true", u.name)
		}
		wantErr(t, "AddWatcher to an id with "+u.name, err, workers.ErrNotFound)
	}
	wantStored(t, s, record("alice::a", "run-1", "alice"))
}

func (*suite) roundTripAllFields(t *testing.T, s workers.Store) {
	for i, st := range allStatuses {
		r := workers.Record{
			ID:        "alice::report-" + string(st),
			RunID:     "run-" + string(st),
			Queue:     "reports",
			Watchers:  []string{"alice", "svc-audit", "bob"},
			CreatedAt: at(-i),
			State:     outcome(st, i),
		}
		insert(t, s, r)
		wantStored(t, s, r)
	}
}

func (*suite) roundTripResultBytes(t *testing.T, s workers.Store) {
	// Each is valid JSON that a store re-encoding it would change: an
	// integer beyond float64's, escapes, a duplicate key, spacing, a
	// trailing zero.
	results := []string{
		`{"n": 123456789012345678901234567890, "n": 2}`,
		`"\u0041\u00e9\u0000"`,
		` [ 1.50 , {"b":1,"a":2} ] `,
		`-0.0e+00`,
	}
	r := workers.Record{ID: "alice::exact", RunID: "run-1", Watchers: []string{"alice"}, CreatedAt: epoch,
		State: workers.State{Status: workers.StatusRunning, StartedAt: at(1), Result: json.RawMessage(results[0])}}
	insert(t, s, r)
	wantStored(t, s, r)

	r.Result = json.RawMessage(results[1])
	if err := s.SetTask(t.Context(), r); err != nil {
		t.Fatalf("SetTask: %v", err)
	}
	wantStored(t, s, r)

	next := outcome(workers.StatusCompleted, 1)
	next.Result = json.RawMessage(results[2])
	if ok, err := s.TransitionTask(t.Context(), r.ID, r.RunID, []workers.Status{workers.StatusRunning}, next); !ok || err != nil {
		t.Fatalf("TransitionTask = %v, %v; want true, nil", ok, err)
	}
	r.State = next
	wantStored(t, s, r)

	again := r
	again.RunID, again.Result = "run-2", json.RawMessage(results[3])
	if err := s.ReplaceTask(t.Context(), again, r.RunID); err != nil {
		t.Fatalf("ReplaceTask: %v", err)
	}
	wantStored(t, s, again)
}

func (*suite) roundTripZeroValues(t *testing.T, s workers.Store) {
	r := record("nightly", "run-1")
	insert(t, s, r)
	wantStored(t, s, r) // a zero time equals only a zero time
}

func (*suite) insertExisting(t *testing.T, s workers.Store) {
	orig := workers.Record{ID: "alice::a", RunID: "run-1", Queue: "q1", Watchers: []string{"alice"}, CreatedAt: epoch, State: outcome(workers.StatusCompleted, 1)}
	insert(t, s, orig)
	dup := record(orig.ID, "run-2", "mallory")
	dup.CreatedAt = at(5)
	wantErr(t, "InsertTask of an existing id", s.InsertTask(t.Context(), dup), workers.ErrConflict)
	wantStored(t, s, orig)
}

func (*suite) insertEmptyRunID(t *testing.T, s workers.Store) {
	r := record("alice::a", "", "alice")
	wantErr(t, "InsertTask with an empty RunID", s.InsertTask(t.Context(), r), workers.ErrInvalidRunID)
	wantMissing(t, s, r.ID)
}

func (*suite) insertInvalid(t *testing.T, s workers.Store) {
	old := record("alice::replaced", "run-1", "alice")
	old.State = outcome(workers.StatusCompleted, 1)
	insert(t, s, old)
	unknown := record("alice::unknown-status", "run-1")
	unknown.Status = "paused"
	unfinished := record("alice::no-completed-at", "run-1")
	unfinished.Status = workers.StatusCompleted
	undated := record("alice::before-year-1", "run-1")
	undated.CreatedAt = beforeYear1
	nearlyUndated := record("alice::within-year-1s-microsecond", "run-1")
	nearlyUndated.CreatedAt = withinYear1sMicrosecond
	bad := []struct {
		name string
		rec  workers.Record
		want error
	}{
		{"empty id", record("", "run-1"), workers.ErrInvalidKey},
		{"control character in id", record("alice::a\nb", "run-1"), workers.ErrInvalidKey},
		{"unknown status", unknown, workers.ErrInvalidOption},
		{"terminal status without CompletedAt", unfinished, workers.ErrInvalidOption},
		{"a CreatedAt before the zero time", undated, workers.ErrInvalidData},
		{"a CreatedAt within the zero time's microsecond", nearlyUndated, workers.ErrInvalidData},
	}
	for _, u := range unstorableWatchers {
		for _, f := range []struct {
			name string
			set  func(r *workers.Record)
		}{
			{"RunID", func(r *workers.Record) { r.RunID = u.text }},
			{"Queue", func(r *workers.Record) { r.Queue = u.text }},
			{"a watcher", func(r *workers.Record) { r.Watchers = []string{"alice", u.text} }},
		} {
			if f.name != "a watcher" && !slices.Contains(unstorable, u) {
				continue // a long RunID or Queue is no watcher
			}
			r := record(fmt.Sprintf("alice::unstorable-%d", len(bad)), "run-1", "alice")
			f.set(&r)
			bad = append(bad, struct {
				name string
				rec  workers.Record
				want error
			}{u.name + " in " + f.name, r, workers.ErrInvalidData})
		}
	}
	for _, c := range bad {
		wantErr(t, "CheckRecord of a record with "+c.name, workers.CheckRecord(c.rec), c.want)
		wantErr(t, "InsertTask of a record with "+c.name, s.InsertTask(t.Context(), c.rec), c.want)
		if c.rec.ID != "" {
			wantMissing(t, s, c.rec.ID)
		}
		if c.want != workers.ErrInvalidKey {
			r := c.rec
			r.ID = old.ID
			wantErr(t, "ReplaceTask with a record with "+c.name, s.ReplaceTask(t.Context(), r, old.RunID), c.want)
		}
	}
	wantStored(t, s, old)
}

func (*suite) setStateOnly(t *testing.T, s workers.Store) {
	stored := record("alice::a", "run-1", "alice", "svc")
	stored.Queue = "q1"
	insert(t, s, stored)
	for i, arg := range []workers.Record{
		{ID: stored.ID, RunID: "run-stale", Queue: "other", Watchers: []string{"mallory"}, CreatedAt: at(50), State: outcome(workers.StatusFailed, 1)},
		{ID: stored.ID, State: outcome(workers.StatusCompleted, 2)}, // zero identity fields
	} {
		if err := s.SetTask(t.Context(), arg); err != nil {
			t.Fatalf("SetTask #%d: %v", i+1, err)
		}
		want := stored
		want.State = arg.State
		wantStored(t, s, want)
	}
}

func (*suite) setMissing(t *testing.T, s workers.Store) {
	r := record("alice::nobody", "run-1")
	r.State = outcome(workers.StatusCompleted, 1)
	wantErr(t, "SetTask of a missing id", s.SetTask(t.Context(), r), workers.ErrNotFound)
	wantMissing(t, s, r.ID)
}

// replaced returns the records the Replace cases start from and write: a
// finished run, and the next run of the same id with every field changed.
func replaced() (old, next workers.Record) {
	old = workers.Record{ID: "alice::a", RunID: "run-1", Queue: "q1", Watchers: []string{"alice", "bob"}, CreatedAt: epoch, State: outcome(workers.StatusCompleted, 1)}
	next = workers.Record{ID: "alice::a", RunID: "run-2", Queue: "q2", Watchers: []string{"alice", "carol"}, CreatedAt: at(10), State: workers.State{Status: workers.StatusPending}}
	return old, next
}

func (*suite) replacePublishes(t *testing.T, s workers.Store) {
	old, next := replaced()
	insert(t, s, old)
	if err := s.ReplaceTask(t.Context(), next, old.RunID); err != nil {
		t.Fatalf("ReplaceTask: %v", err)
	}
	wantStored(t, s, next)
}

func (*suite) replaceStale(t *testing.T, s workers.Store) {
	old, next := replaced()
	insert(t, s, old)
	for _, prev := range []string{"run-0", next.RunID} {
		wantErr(t, fmt.Sprintf("ReplaceTask with prevRunID %q", prev), s.ReplaceTask(t.Context(), next, prev), workers.ErrConflict)
	}
	wantStored(t, s, old)
}

func (*suite) replaceEmptyRunID(t *testing.T, s workers.Store) {
	old, next := replaced()
	insert(t, s, old)
	next.RunID = ""
	wantErr(t, "ReplaceTask of a record with an empty RunID", s.ReplaceTask(t.Context(), next, old.RunID), workers.ErrInvalidRunID)
	wantStored(t, s, old)
}

func (*suite) replaceMissing(t *testing.T, s workers.Store) {
	_, next := replaced()
	wantErr(t, "ReplaceTask of a missing id", s.ReplaceTask(t.Context(), next, "run-1"), workers.ErrNotFound)
	wantMissing(t, s, next.ID)
}

// transition calls TransitionTask and fails t unless it reports wantOK
// without an error.
func transition(t *testing.T, s workers.Store, id, runID string, from []workers.Status, next workers.State, wantOK bool) {
	t.Helper()
	ok, err := s.TransitionTask(t.Context(), id, runID, from, next)
	if err != nil || ok != wantOK {
		t.Errorf("TransitionTask(%q, run %q, from %q to %q) = %v, %v; want %v, nil", id, runID, from, next.Status, ok, err, wantOK)
	}
}

func (*suite) transitionWrites(t *testing.T, s workers.Store) {
	want := record("alice::a", "run-1", "alice")
	want.Queue = "q1"
	insert(t, s, want)
	for _, step := range []struct {
		from []workers.Status
		next workers.State
	}{
		{pendingOnly, started},
		{[]workers.Status{workers.StatusPending, workers.StatusRunning}, outcome(workers.StatusCompleted, 1)},
	} {
		transition(t, s, want.ID, want.RunID, step.from, step.next, true)
		want.State = step.next
		wantStored(t, s, want)
	}
}

func (*suite) transitionWrongStatus(t *testing.T, s workers.Store) {
	r := record("alice::a", "run-1")
	r.State = started
	insert(t, s, r)
	for _, from := range [][]workers.Status{pendingOnly, {workers.StatusCompleted, workers.StatusFailed}, nil} {
		transition(t, s, r.ID, r.RunID, from, outcome(workers.StatusCancelled, 1), false)
	}
	wantStored(t, s, r)
}

func (*suite) transitionUnknownFrom(t *testing.T, s workers.Store) {
	r := record("alice::a", "run-1")
	r.State = outcome(workers.StatusFailed, 1)
	insert(t, s, r)
	for _, from := range [][]workers.Status{
		{"completed,failed"},
		{"failed,completed", "FAILED", " failed", "failed ", ""},
		{"pending,failed", workers.StatusPending, workers.StatusRunning},
	} {
		transition(t, s, r.ID, r.RunID, from, started, false)
	}
	wantStored(t, s, r)
	next := outcome(workers.StatusCompleted, 2)
	transition(t, s, r.ID, r.RunID, []workers.Status{"completed,failed", workers.StatusFailed}, next, true)
	r.State = next
	wantStored(t, s, r)
}

func (*suite) transitionEmptyRunID(t *testing.T, s workers.Store) {
	r := record("alice::a", "run-1")
	insert(t, s, r)
	_, err := s.TransitionTask(t.Context(), r.ID, "", pendingOnly, started)
	wantErr(t, "TransitionTask with an empty run id", err, workers.ErrInvalidRunID)
	wantStored(t, s, r)
}

func (*suite) transitionMissing(t *testing.T, s workers.Store) {
	ok, err := s.TransitionTask(t.Context(), "alice::nobody", "run-1", pendingOnly, started)
	wantErr(t, "TransitionTask of a missing id", err, workers.ErrNotFound)
	if ok {
		t.Error("TransitionTask of a missing id reported true")
	}
	wantMissing(t, s, "alice::nobody")
}

func (su *suite) transitionRace(t *testing.T, s workers.Store) {
	r := record("alice::a", "run-1")
	insert(t, s, r)
	var startWins, endWins, winner atomic.Int32
	su.within(t, func(ctx context.Context) {
		// PENDING -> RUNNING, all racers writing the same state.
		race(racers, func(int) {
			ok, err := s.TransitionTask(ctx, r.ID, r.RunID, pendingOnly, started)
			if err != nil {
				t.Errorf("TransitionTask to RUNNING: %v", err)
			}
			if ok {
				startWins.Add(1)
			}
		})
		// RUNNING -> terminal, each racer writing an outcome of its own.
		race(racers, func(i int) {
			ok, err := s.TransitionTask(ctx, r.ID, r.RunID, runningOnly, outcome(workers.StatusCompleted, i))
			if err != nil {
				t.Errorf("TransitionTask to COMPLETED: %v", err)
			}
			if ok {
				endWins.Add(1)
				winner.Store(int32(i))
			}
		})
	})
	if n := startWins.Load(); n != 1 {
		t.Errorf("%d of %d racing PENDING->RUNNING transitions reported true, want exactly 1", n, racers)
	}
	if n := endWins.Load(); n != 1 {
		t.Fatalf("%d of %d racing RUNNING->COMPLETED transitions reported true, want exactly 1", n, racers)
	}
	r.State = outcome(workers.StatusCompleted, int(winner.Load()))
	wantStored(t, s, r)
}

func (su *suite) insertRace(t *testing.T, s workers.Store) {
	r := func(i int) workers.Record {
		return record("alice::a", fmt.Sprintf("run-%d", i), "alice", fmt.Sprintf("w%d", i))
	}
	i := su.exactlyOneWins(t, "InsertTask calls of one id", func(ctx context.Context, i int) error { return s.InsertTask(ctx, r(i)) })
	wantStored(t, s, r(i))
}

func (su *suite) replaceRace(t *testing.T, s workers.Store) {
	old := record("alice::a", "run-0", "alice")
	old.State = outcome(workers.StatusCompleted, 0)
	insert(t, s, old)
	next := func(i int) workers.Record {
		return record("alice::a", fmt.Sprintf("run-%d", i+1), "alice", fmt.Sprintf("w%d", i))
	}
	i := su.exactlyOneWins(t, "ReplaceTask calls of one run", func(ctx context.Context, i int) error { return s.ReplaceTask(ctx, next(i), old.RunID) })
	wantStored(t, s, next(i))
}

// exactlyOneWins races racers calls of call and fails t unless exactly
// one returns nil and the others ErrConflict; it returns the winner's i.
func (su *suite) exactlyOneWins(t *testing.T, what string, call func(ctx context.Context, i int) error) int {
	t.Helper()
	var wins, winner atomic.Int32
	su.within(t, func(ctx context.Context) {
		race(racers, func(i int) {
			err := call(ctx, i)
			switch {
			case err == nil:
				wins.Add(1)
				winner.Store(int32(i))
			case !errors.Is(err, workers.ErrConflict):
				t.Errorf("racing %s: %v, want nil or ErrConflict", what, err)
			}
		})
	})
	if n := wins.Load(); n != 1 {
		t.Fatalf("%d of %d racing %s succeeded, want exactly 1", n, racers, what)
	}
	return int(winner.Load())
}

func (*suite) fencingStaleRun(t *testing.T, s workers.Store) {
	r := record("alice::a", "run-2")
	insert(t, s, r)
	for _, stale := range []string{"run-1", "run-2-old", "RUN-2"} {
		transition(t, s, r.ID, stale, pendingOnly, outcome(workers.StatusCompleted, 1), false)
	}
	wantStored(t, s, r)
}

func (*suite) fencingReplacedRun(t *testing.T, s workers.Store) {
	old, next := replaced()
	old.State = started
	insert(t, s, old)
	if err := s.ReplaceTask(t.Context(), next, old.RunID); err != nil {
		t.Fatalf("ReplaceTask: %v", err)
	}
	transition(t, s, next.ID, old.RunID, allStatuses, outcome(workers.StatusFailed, 1), false)
	_, err := s.AddWatcher(t.Context(), next.ID, old.RunID, "mallory")
	wantErr(t, "AddWatcher naming the replaced run", err, workers.ErrConflict)
	wantStored(t, s, next)
}

func (*suite) fencingUnstorableRunID(t *testing.T, s workers.Store) {
	r := record("alice::a", "run-1", "alice")
	insert(t, s, r)
	_, next := replaced()
	for _, u := range unstorable {
		call := func(m string) string { return m + " naming a run id with " + u.name }
		transition(t, s, r.ID, u.text, allStatuses, started, false)
		ok, err := s.TransitionTask(t.Context(), "alice::nobody", u.text, allStatuses, started)
		if ok {
			t.Errorf("%s, of a missing id, reported true", call("TransitionTask"))
		}
		wantErr(t, call("TransitionTask")+", of a missing id", err, workers.ErrNotFound)

		wantErr(t, call("ReplaceTask"), s.ReplaceTask(t.Context(), next, u.text), workers.ErrConflict)
		missing := next
		missing.ID = "alice::nobody"
		wantErr(t, call("ReplaceTask")+", of a missing id", s.ReplaceTask(t.Context(), missing, u.text), workers.ErrNotFound)

		for _, c := range []struct {
			id   string
			want error
		}{{r.ID, workers.ErrConflict}, {"alice::nobody", workers.ErrNotFound}} {
			added, err := s.AddWatcher(t.Context(), c.id, u.text, "bob")
			if added {
				t.Errorf("%s, to %q, reported true", call("AddWatcher"), c.id)
			}
			wantErr(t, fmt.Sprintf("%s, to %q", call("AddWatcher"), c.id), err, c.want)
		}
	}
	wantStored(t, s, r)
	wantMissing(t, s, "alice::nobody")
}

func (su *suite) fencingSuperseded(t *testing.T, s workers.Store) {
	const rounds = 32
	recs := make([]workers.Record, rounds)
	for i := range recs {
		recs[i] = record(fmt.Sprintf("alice::r%02d", i), "run-1", "alice")
	}
	insert(t, s, recs...)
	su.within(t, func(ctx context.Context) {
		race(2*rounds, func(i int) {
			r := recs[i/2]
			if i%2 == 0 {
				next := r
				next.RunID = "run-2"
				if err := s.ReplaceTask(ctx, next, "run-1"); err != nil {
					t.Errorf("ReplaceTask(%q): %v", r.ID, err)
				}
				return
			}
			if _, err := s.TransitionTask(ctx, r.ID, "run-1", pendingOnly, outcome(workers.StatusCompleted, i)); err != nil {
				t.Errorf("TransitionTask(%q): %v", r.ID, err)
			}
		})
	})
	for _, r := range recs {
		r.RunID = "run-2"
		wantStored(t, s, r)
	}
}

func (*suite) deleteFinished(t *testing.T, s workers.Store) {
	cutoff := at(100)
	const undated = -1 << 20 // a terminal record without a CompletedAt
	rows := []struct {
		id        string
		status    workers.Status
		completed int // minutes after epoch, or undated; ignored for live statuses
		deleted   bool
	}{
		{"alice::completed-old", workers.StatusCompleted, 10, true},
		{"alice::failed-old", workers.StatusFailed, 20, true},
		{"alice::cancelled-old", workers.StatusCancelled, 99, true},
		{"alice::completed-undated", workers.StatusCompleted, undated, true},
		{"alice::pending-old", workers.StatusPending, 0, false},
		{"alice::running-old", workers.StatusRunning, 0, false},
		{"alice::completed-at-cutoff", workers.StatusCompleted, 100, false},
		{"alice::failed-recent", workers.StatusFailed, 200, false},
	}
	want := 0
	for _, row := range rows {
		r := record(row.id, "run-1", "alice")
		r.CreatedAt = at(-10000)
		r.Status = row.status
		if row.status == workers.StatusRunning {
			r.StartedAt = at(-9000)
		}
		if row.completed == undated {
			// A record is inserted with its CompletedAt, but a state
			// without one may be set.
			r.Status = workers.StatusPending
			insert(t, s, r)
			r.State = workers.State{Status: row.status}
			if err := s.SetTask(t.Context(), r); err != nil {
				t.Fatalf("setup: SetTask(%q): %v", r.ID, err)
			}
		} else {
			if row.status.Terminal() {
				r.StartedAt, r.CompletedAt = at(row.completed-1), at(row.completed)
			}
			insert(t, s, r)
		}
		if row.deleted {
			want++
		}
	}
	// A cutoff before every time a store holds deletes nothing, and is
	// not an error.
	if n, err := s.DeleteFinished(t.Context(), farPast); err != nil || n != 0 {
		t.Errorf("DeleteFinished(year -300,000) = %d, %v; want 0, nil", n, err)
	}
	for _, w := range []int{want, 0} {
		n, err := s.DeleteFinished(t.Context(), cutoff)
		if err != nil || n != w {
			t.Errorf("DeleteFinished(cutoff) = %d, %v; want %d, nil", n, err, w)
		}
	}
	for _, row := range rows {
		if row.deleted {
			wantMissing(t, s, row.id)
		} else {
			get(t, s, row.id)
		}
	}
	// A cutoff after every time a store holds deletes every terminal
	// record, and is not an error.
	if n, err := s.DeleteFinished(t.Context(), farFuture); err != nil || n != 2 {
		t.Errorf("DeleteFinished(year 300,000) = %d, %v; want 2, nil", n, err)
	}
	get(t, s, "alice::pending-old")
	get(t, s, "alice::running-old")
}

// deleteSubMicrosecond deletes with cutoffs that fall between two
// microseconds, which no stored time does (a store keeps times to the
// microsecond), over records completed a microsecond apart.
func (*suite) deleteSubMicrosecond(t *testing.T, s workers.Store) {
	for i, completed := range []time.Duration{-time.Microsecond, 0, time.Microsecond} {
		r := record(fmt.Sprintf("alice::r%d", i), "run-1", "alice")
		r.State = outcome(workers.StatusCompleted, i)
		r.StartedAt, r.CompletedAt = epoch.Add(-time.Second), epoch.Add(completed)
		insert(t, s, r)
	}
	for _, step := range []struct {
		cutoff time.Duration // after epoch
		want   int
	}{
		{-1001, 0}, {-999, 1}, {1, 1}, {999, 0}, {1000, 0}, {1001, 1},
	} {
		cutoff := epoch.Add(step.cutoff * time.Nanosecond)
		if n, err := s.DeleteFinished(t.Context(), cutoff); err != nil || n != step.want {
			t.Errorf("DeleteFinished(epoch%+dns) = %d, %v; want %d, nil", step.cutoff, n, err, step.want)
		}
	}
}

// deleteThenReinsert checks that a deleted record leaves nothing of
// itself behind: a new record of its id has only its own watchers, and a
// watcher of the deleted one no longer sees the id.
func (*suite) deleteThenReinsert(t *testing.T, s workers.Store) {
	old := record("alice::nightly", "run-1", "alice", "mallory")
	old.State = outcome(workers.StatusCompleted, 1)
	insert(t, s, old)
	if n, err := s.DeleteFinished(t.Context(), at(100)); err != nil || n != 1 {
		t.Fatalf("DeleteFinished = %d, %v; want 1, nil", n, err)
	}
	next := record("alice::nightly", "run-2", "alice", "bob")
	insert(t, s, next)
	wantStored(t, s, next)
	if recs := list(t, s, workers.Filter{VisibleTo: "mallory"}); len(recs) != 0 {
		t.Errorf("a watcher of the deleted record still sees %d records", len(recs))
	}
}

func (*suite) invalidStateRefused(t *testing.T, s workers.Store) {
	stored := record("alice::a", "run-1", "alice")
	insert(t, s, stored)
	notJSON := outcome(workers.StatusCompleted, 1)
	notJSON.Result = []byte("{not json")
	notUTF8 := outcome(workers.StatusCompleted, 1)
	notUTF8.Result = []byte("\"\xff\"")
	deep := outcome(workers.StatusCompleted, 1)
	deep.Result = []byte(strings.Repeat("[", 1001) + strings.Repeat("]", 1001))
	unknown := outcome(workers.StatusCompleted, 1)
	unknown.Status = "paused"
	farOff := outcome(workers.StatusCompleted, 1)
	farOff.CompletedAt = farFuture
	startedEarly := outcome(workers.StatusCompleted, 1)
	startedEarly.StartedAt = beforeYear1
	completedEarly := outcome(workers.StatusCompleted, 1)
	completedEarly.CompletedAt = beforeYear1
	startedUndated := outcome(workers.StatusCompleted, 1)
	startedUndated.StartedAt = withinYear1sMicrosecond
	completedUndated := outcome(workers.StatusCompleted, 1)
	completedUndated.CompletedAt = withinYear1sMicrosecond
	for _, c := range []struct {
		name string
		st   workers.State
		want error
	}{
		{"a result that is not JSON", notJSON, workers.ErrResultEncoding},
		{"a result that is not UTF-8", notUTF8, workers.ErrResultEncoding},
		{"a result nested deeper than every store holds", deep, workers.ErrResultEncoding},
		{"an unknown status", unknown, workers.ErrInvalidOption},
		{"a time beyond what every store holds (year 300,000)", farOff, workers.ErrInvalidData},
		{"a StartedAt before the zero time", startedEarly, workers.ErrInvalidData},
		{"a CompletedAt before the zero time", completedEarly, workers.ErrInvalidData},
		{"a StartedAt within the zero time's microsecond", startedUndated, workers.ErrInvalidData},
		{"a CompletedAt within the zero time's microsecond", completedUndated, workers.ErrInvalidData},
	} {
		bad := record("alice::bad", "run-1")
		bad.State = c.st
		wantErr(t, "InsertTask with "+c.name, s.InsertTask(t.Context(), bad), c.want)
		wantMissing(t, s, bad.ID)

		arg := stored
		arg.State = c.st
		wantErr(t, "SetTask with "+c.name, s.SetTask(t.Context(), arg), c.want)
		for _, from := range [][]workers.Status{pendingOnly, nil} {
			_, err := s.TransitionTask(t.Context(), stored.ID, stored.RunID, from, c.st)
			wantErr(t, fmt.Sprintf("TransitionTask from %q with %s", from, c.name), err, c.want)
		}
		arg.RunID = "run-2"
		wantErr(t, "ReplaceTask with "+c.name, s.ReplaceTask(t.Context(), arg, stored.RunID), c.want)
		wantStored(t, s, stored)
	}
}

func (*suite) insertIDsExact(t *testing.T, s workers.Store) {
	base := record("alice::report", "run-1", "alice")
	insert(t, s, base)
	wantMissing(t, s, "alice::Report")
	wantMissing(t, s, "alice::report ")
	others := []workers.Record{
		record("Alice::report", "run-2", "Alice"),
		record("alice::REPORT", "run-3", "alice"),
		record("alice::report ", "run-4", "alice"),
		record("alice::rèport", "run-5", "alice"),
	}
	for _, r := range others {
		if err := s.InsertTask(t.Context(), r); err != nil {
			t.Errorf("InsertTask(%q) beside %q: %v, want nil", r.ID, base.ID, err)
		}
	}
	wantStored(t, s, base)
	for _, r := range others {
		wantStored(t, s, r)
	}
	// A fenced write through one id touches no other.
	if ok, err := s.TransitionTask(t.Context(), "Alice::report", "run-2", pendingOnly, started); err != nil || !ok {
		t.Errorf("TransitionTask(Alice::report) = %v, %v; want true, nil", ok, err)
	}
	wantStored(t, s, base)
	got := ids(list(t, s, workers.Filter{VisibleTo: "alice"}))
	if want := []string{"alice::REPORT", "alice::report", "alice::report ", "alice::rèport"}; !slices.Equal(got, want) {
		t.Errorf("ListTasks(VisibleTo alice) = %q, want %q", got, want)
	}
}
