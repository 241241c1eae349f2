package storetest

import (
	"encoding/json"
	"testing"

	"github.com/taskgate/workers"
)

// scribble overwrites, in place, the memory r's slices point at.
func scribble(r *workers.Record) {
	for i := range r.Watchers {
		r.Watchers[i] = "mallory"
	}
	scribbleBytes(r.Result)
}

// scribbleBytes overwrites b in place.
func scribbleBytes(b []byte) {
	for i := range b {
		b[i] = 'x'
	}
}

// withResult returns a PENDING record that has watchers and a result, so
// that both of its slices can be scribbled on.
func withResult(id, runID string) workers.Record {
	r := record(id, runID, "alice", "bob")
	r.Result = json.RawMessage(`{"n": 1}`)
	return r
}

func (*suite) aliasInsert(t *testing.T, s workers.Store) {
	r := withResult("alice::a", "run-1")
	want := r.Clone()
	insert(t, s, r)
	scribble(&r)
	wantStored(t, s, want)
}

func (*suite) aliasReplace(t *testing.T, s workers.Store) {
	insert(t, s, record("alice::a", "run-1"))
	r := withResult("alice::a", "run-2")
	want := r.Clone()
	if err := s.ReplaceTask(t.Context(), r, "run-1"); err != nil {
		t.Fatalf("ReplaceTask: %v", err)
	}
	scribble(&r)
	wantStored(t, s, want)
}

func (*suite) aliasStateWrites(t *testing.T, s workers.Store) {
	want := record("alice::a", "run-1", "alice")
	insert(t, s, want)

	arg := want.Clone()
	arg.State = outcome(workers.StatusRunning, 1)
	if err := s.SetTask(t.Context(), arg); err != nil {
		t.Fatalf("SetTask: %v", err)
	}
	want.State = arg.State
	want = want.Clone()
	scribble(&arg)
	wantStored(t, s, want)

	next := outcome(workers.StatusCompleted, 2)
	transition(t, s, want.ID, want.RunID, runningOnly, next, true)
	want.State = next
	want = want.Clone()
	scribbleBytes(next.Result)
	wantStored(t, s, want)
}

func (*suite) aliasGet(t *testing.T, s workers.Store) {
	returnedNotShared(t, s, func(id string) workers.Record { return get(t, s, id) })
}

func (*suite) aliasList(t *testing.T, s workers.Store) {
	returnedNotShared(t, s, func(id string) workers.Record {
		recs := list(t, s, workers.Filter{})
		if len(recs) != 1 || recs[0].ID != id {
			t.Fatalf("ListTasks returned %q, want [%q]", ids(recs), id)
		}
		return recs[0]
	})
}

// returnedNotShared checks that the records read returns share no memory
// with the store, in either direction.
func returnedNotShared(t *testing.T, s workers.Store, read func(id string) workers.Record) {
	t.Helper()
	r := withResult("alice::a", "run-1")
	insert(t, s, r)

	got := read(r.ID)
	scribble(&got)
	wantStored(t, s, r)

	held := read(r.ID)
	if _, err := s.AddWatcher(t.Context(), r.ID, r.RunID, "carol"); err != nil {
		t.Fatalf("AddWatcher: %v", err)
	}
	state := withResult(r.ID, r.RunID)
	state.Result = json.RawMessage(`{"n": 2}`)
	if err := s.SetTask(t.Context(), state); err != nil {
		t.Fatalf("SetTask: %v", err)
	}
	if d := diff(held, r); d != "" {
		t.Errorf("a record returned before later writes changed under them:%s", d)
	}
}
