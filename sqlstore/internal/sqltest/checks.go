package sqltest

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// Run runs the checks the SQL stores add to the conformance suite, each
// as a parallel subtest with a store of its own from newStore.
func Run(t *testing.T, newStore func(t *testing.T) workers.Store) {
	for _, c := range []struct {
		name  string
		check func(*testing.T, workers.Store)
	}{
		{"Fencing/ReplaceRacesAddWatcher", ReplaceFencesAddWatcher},
		{"Result/InvalidJSONRefused", invalidResult},
		{"Times/ReturnedInUTC", timesUTC},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.check(t, newStore(t))
		})
	}
}

// invalidResult checks that every write of a result that is not JSON
// fails with ErrResultEncoding and writes nothing.
func invalidResult(t *testing.T, s workers.Store) {
	ctx := t.Context()
	bad := workers.State{Status: workers.StatusCompleted, Result: []byte("{not json"), CompletedAt: now()}
	rec := workers.Record{ID: "owner::bad", RunID: "run-1", State: bad}
	if err := s.InsertTask(ctx, rec); !errors.Is(err, workers.ErrResultEncoding) {
		t.Errorf("InsertTask with an invalid result: %v, want ErrResultEncoding", err)
	}
	rec.State = workers.State{Status: workers.StatusRunning}
	if err := s.InsertTask(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if _, err := s.TransitionTask(ctx, rec.ID, rec.RunID, []workers.Status{workers.StatusRunning}, bad); !errors.Is(err, workers.ErrResultEncoding) {
		t.Errorf("TransitionTask with an invalid result: %v, want ErrResultEncoding", err)
	}
	if err := s.SetTask(ctx, workers.Record{ID: rec.ID, State: bad}); !errors.Is(err, workers.ErrResultEncoding) {
		t.Errorf("SetTask with an invalid result: %v, want ErrResultEncoding", err)
	}
	if got, err := s.GetTask(ctx, rec.ID); err != nil || got.Status != workers.StatusRunning {
		t.Errorf("after refused writes: GetTask = %+v, %v; want the RUNNING record", got, err)
	}
}

// timesUTC checks that times come back in UTC, to the microsecond.
func timesUTC(t *testing.T, s workers.Store) {
	at := time.Date(2025, 6, 1, 12, 30, 0, 123456000, time.FixedZone("CEST", 2*3600))
	rec := workers.Record{ID: "owner::utc", RunID: "run-1", CreatedAt: at,
		State: workers.State{Status: workers.StatusCompleted, StartedAt: at, CompletedAt: at}}
	if err := s.InsertTask(t.Context(), rec); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetTask(t.Context(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, tm := range []time.Time{got.CreatedAt, got.StartedAt, got.CompletedAt} {
		if !tm.Equal(at) || tm.Location() != time.UTC {
			t.Errorf("stored %v, got back %v; want the same instant in UTC", at, tm)
		}
	}
}

func now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

// ReplaceFencesAddWatcher checks that a watcher appended under a run
// never appears on the record of the run that replaced it, when the
// append races the ReplaceTask. An append that reads the old run id, then
// lands after the replace dropped the old watcher rows, would grant a
// watcher of the old run access to the new one.
func ReplaceFencesAddWatcher(t *testing.T, s workers.Store) {
	const (
		rounds  = 100
		writers = 4 // late appends per round
	)
	ctx := t.Context()
	prev := workers.Record{ID: "owner::rerun", RunID: "run-0", Watchers: []string{"owner"},
		State: workers.State{Status: workers.StatusCompleted, CompletedAt: now()}}
	if err := s.InsertTask(ctx, prev); err != nil {
		t.Fatal(err)
	}
	for round := range rounds {
		next := prev
		next.RunID = fmt.Sprintf("run-%d", round+1)
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Go(func() {
			<-start
			if err := s.ReplaceTask(ctx, next, prev.RunID); err != nil {
				t.Errorf("ReplaceTask: %v", err)
			}
		})
		for w := range writers {
			wg.Go(func() {
				<-start
				_, err := s.AddWatcher(ctx, prev.ID, prev.RunID, fmt.Sprintf("late-%d-%d", round, w))
				if err != nil && !errors.Is(err, workers.ErrConflict) {
					t.Errorf("AddWatcher: %v", err)
				}
			})
		}
		close(start)
		wg.Wait()
		got, err := s.GetTask(ctx, prev.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.RunID != next.RunID || !slices.Equal(got.Watchers, next.Watchers) {
			t.Fatalf("round %d: after the replace the record is run %q with watchers %q; want run %q with %q",
				round, got.RunID, got.Watchers, next.RunID, next.Watchers)
		}
		prev = next
	}
}
