package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// epoch is the suite's time origin. Like every time the runtime writes,
// it is UTC and truncated to the microsecond, and it has a non-zero
// microsecond part, so a store that keeps less precision is caught.
var epoch = time.Date(2025, time.March, 14, 15, 9, 26, 535897000, time.UTC)

// farPast and farFuture are beyond every time a store holds: a store
// refuses to write them, and compares them with the times it holds.
var (
	farPast   = time.Date(-300_000, time.January, 1, 0, 0, 0, 0, time.UTC)
	farFuture = time.Date(300_000, time.January, 1, 0, 0, 0, 0, time.UTC)
)

// beforeYear1 is a time before the zero time, which no store holds: the
// zero time says undated, and no stored time sorts before it.
var beforeYear1 = time.Date(0, time.June, 1, 0, 0, 0, 0, time.UTC)

// withinYear1sMicrosecond is a time that every store would keep as the
// zero time, undated (they keep times to the microsecond), and so
// refuses.
var withinYear1sMicrosecond = time.Time{}.Add(time.Nanosecond)

// at returns the time min minutes after epoch.
func at(min int) time.Time { return epoch.Add(time.Duration(min) * time.Minute) }

// record returns a PENDING record created at epoch.
func record(id, runID string, watchers ...string) workers.Record {
	return workers.Record{
		ID:        id,
		RunID:     runID,
		Watchers:  watchers,
		CreatedAt: epoch,
		State:     workers.State{Status: workers.StatusPending},
	}
}

// outcome returns a State in status with every field set; n varies the
// result, so that two outcomes can be told apart.
func outcome(status workers.Status, n int) workers.State {
	return workers.State{
		Status:      status,
		Progress:    100,
		Attempt:     2,
		Result:      json.RawMessage(fmt.Sprintf(`{"rows": %d, "tags": ["a", "é"], "ok": true, "ratio": 0.5, "none": null}`, n)),
		Error:       fmt.Sprintf("échec %d: disk full", n),
		StartedAt:   at(1),
		CompletedAt: at(2),
	}
}

// insert stores recs, failing t if the store refuses any of them.
func insert(t *testing.T, s workers.Store, recs ...workers.Record) {
	t.Helper()
	for _, r := range recs {
		if err := s.InsertTask(t.Context(), r); err != nil {
			t.Fatalf("setup: InsertTask(%q): %v", r.ID, err)
		}
	}
}

// get returns the record stored for id, failing t if there is none.
func get(t *testing.T, s workers.Store, id string) workers.Record {
	t.Helper()
	r, err := s.GetTask(t.Context(), id)
	if err != nil {
		t.Fatalf("GetTask(%q): %v", id, err)
	}
	return r
}

// list returns the records f selects, failing t on an error.
func list(t *testing.T, s workers.Store, f workers.Filter) []workers.Record {
	t.Helper()
	recs, err := s.ListTasks(t.Context(), f)
	if err != nil {
		t.Fatalf("ListTasks(%+v): %v", f, err)
	}
	return recs
}

// wantStored fails t unless GetTask returns want.
func wantStored(t *testing.T, s workers.Store, want workers.Record) {
	t.Helper()
	got, err := s.GetTask(t.Context(), want.ID)
	if err != nil {
		t.Errorf("GetTask(%q): %v", want.ID, err)
		return
	}
	if d := diff(got, want); d != "" {
		t.Errorf("GetTask(%q) returned a different record:%s", want.ID, d)
	}
}

// wantMissing fails t unless the store has no record for id.
func wantMissing(t *testing.T, s workers.Store, id string) {
	t.Helper()
	_, err := s.GetTask(t.Context(), id)
	wantErr(t, fmt.Sprintf("GetTask(%q)", id), err, workers.ErrNotFound)
}

// wantErr fails t unless errors.Is(err, target).
func wantErr(t *testing.T, call string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Errorf("%s: error %v, want %v", call, err, target)
	}
}

// wantWatchers fails t unless the record id lists exactly want, in any
// order.
func wantWatchers(t *testing.T, s workers.Store, id string, want ...string) {
	t.Helper()
	if got := get(t, s, id).Watchers; !sameSet(got, want) {
		t.Errorf("record %q has watchers %q, want %q (in any order)", id, got, want)
	}
}

// diff describes how got differs from want, field by field, or returns ""
// if they are the same record under the suite's rules: times equal as
// instants, watchers equal as sets, results equal byte for byte.
func diff(got, want workers.Record) string {
	fields := []struct {
		name      string
		equal     bool
		got, want any
	}{
		{"ID", got.ID == want.ID, got.ID, want.ID},
		{"RunID", got.RunID == want.RunID, got.RunID, want.RunID},
		{"Queue", got.Queue == want.Queue, got.Queue, want.Queue},
		{"Watchers", sameSet(got.Watchers, want.Watchers), got.Watchers, want.Watchers},
		{"CreatedAt", got.CreatedAt.Equal(want.CreatedAt), got.CreatedAt, want.CreatedAt},
		{"Status", got.Status == want.Status, got.Status, want.Status},
		{"Progress", got.Progress == want.Progress, got.Progress, want.Progress},
		{"Attempt", got.Attempt == want.Attempt, got.Attempt, want.Attempt},
		{"Result", string(got.Result) == string(want.Result), string(got.Result), string(want.Result)},
		{"Error", got.Error == want.Error, got.Error, want.Error},
		{"StartedAt", got.StartedAt.Equal(want.StartedAt), got.StartedAt, want.StartedAt},
		{"CompletedAt", got.CompletedAt.Equal(want.CompletedAt), got.CompletedAt, want.CompletedAt},
		{"Cause", got.Cause == want.Cause, got.Cause, want.Cause},
		{"CancelledBy", got.CancelledBy == want.CancelledBy, got.CancelledBy, want.CancelledBy},
		{"CancelReason", got.CancelReason == want.CancelReason, got.CancelReason, want.CancelReason},
		{"Stack", got.Stack == want.Stack, got.Stack, want.Stack},
	}
	var b strings.Builder
	for _, f := range fields {
		if !f.equal {
			fmt.Fprintf(&b, "\n\t%s = %s, want %s", f.name, show(f.got), show(f.want))
		}
	}
	return b.String()
}

// show formats a record field for a failure message.
func show(v any) string {
	switch v := v.(type) {
	case string, workers.Status, workers.Cause:
		return fmt.Sprintf("%q", v)
	case []string:
		return fmt.Sprintf("%q", v)
	case json.RawMessage:
		if v == nil {
			return "nil"
		}
		return fmt.Sprintf("`%s`", v)
	case time.Time:
		if v.IsZero() {
			return "zero time"
		}
		return v.Format(time.RFC3339Nano)
	}
	return fmt.Sprint(v)
}

// sameSet reports whether a and b hold the same strings, each as often.
func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// ids returns the ids of recs, in order.
func ids(recs []workers.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.ID
	}
	return out
}

// race runs f(0) to f(n-1) on n goroutines released at once, and waits
// for all of them.
func race(n int, f func(i int)) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			f(i)
		})
	}
	close(start)
	wg.Wait()
}

// racers is how many goroutines a concurrent case races.
const racers = 16
