package postgres_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// TestNULTextRefusedBeforeSQL: a State whose text holds a NUL byte is
// refused with ErrInvalidData before any SQL runs: the store's pool is
// closed, so any statement would fail otherwise.
func TestNULTextRefusedBeforeSQL(t *testing.T) {
	sc := newScratchT(t)
	s := sc.store(t)
	ctx := t.Context()
	if err := s.InsertTask(ctx, workers.Record{ID: "u::k", RunID: "i.1", Watchers: []string{"u"}, CreatedAt: time.Now(),
		State: workers.State{Status: workers.StatusRunning, Attempt: 1}}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	next := workers.State{Status: workers.StatusFailed, Attempt: 1, CompletedAt: time.Now(), Error: "a\x00b"}
	if _, err := s.TransitionTask(ctx, "u::k", "i.1", []workers.Status{workers.StatusRunning}, next); !errors.Is(err, workers.ErrInvalidData) {
		t.Fatalf("TransitionTask with a NUL in Error = %v, want ErrInvalidData", err)
	}
	// A closed handle's error is not a data error.
	if _, err := s.GetTask(ctx, "u::k"); err == nil || errors.Is(err, workers.ErrInvalidData) {
		t.Fatalf("GetTask on a closed store = %v, want an error that is not ErrInvalidData", err)
	}
}

// TestDatabaseRefusalIsInvalidData: a value the database itself refuses
// (here a row a trigger refuses with a data exception, class 22) wraps
// ErrInvalidData, which the runtime takes as permanent.
func TestDatabaseRefusalIsInvalidData(t *testing.T) {
	sc := newScratchT(t)
	s := sc.store(t)
	refuseInTheDatabase(t, sc)
	err := s.InsertTask(t.Context(), workers.Record{ID: "u::r", RunID: "i.1", Queue: refusal, Watchers: []string{"u"}, CreatedAt: time.Now(),
		State: workers.State{Status: workers.StatusPending}})
	if !errors.Is(err, workers.ErrInvalidData) {
		t.Fatalf("InsertTask of a row the database refuses = %v, want ErrInvalidData", err)
	}
}

// A time past what the driver can send (pgx encodes microseconds since
// 1970 in an int64) is refused with ErrInvalidData before it is sent,
// whether or not its wrapped-around value would fall in timestamptz's
// range, as year 600,000's does: a write never stores another time.
func TestTimesBeyondWhatTheDriverSendsAreRefused(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	insertPending(t, s, "run-1", "u::a")
	for _, far := range []time.Time{
		time.Date(600_000, time.January, 1, 0, 0, 0, 0, time.UTC),
		time.Date(294_250, time.January, 1, 0, 0, 0, 0, time.UTC), // in timestamptz's range, past pgx's
		time.UnixMicro(math.MaxInt64).Add(time.Microsecond),
		time.Date(-600_000, time.January, 1, 0, 0, 0, 0, time.UTC),
	} {
		rec := workers.Record{ID: "u::far", RunID: "run-1", Watchers: []string{"u"}, CreatedAt: far, State: workers.State{Status: workers.StatusPending}}
		if err := s.InsertTask(ctx, rec); !errors.Is(err, workers.ErrInvalidData) {
			got, _ := s.GetTask(ctx, "u::far")
			t.Fatalf("InsertTask with CreatedAt %v = %v, want ErrInvalidData; stored CreatedAt %v", far, err, got.CreatedAt)
		}
		done := workers.State{Status: workers.StatusCompleted, Attempt: 1, Progress: 100, StartedAt: time.Now(), CompletedAt: far}
		if ok, err := s.TransitionTask(ctx, "u::a", "run-1", []workers.Status{workers.StatusPending}, done); !errors.Is(err, workers.ErrInvalidData) {
			got, _ := s.GetTask(ctx, "u::a")
			t.Fatalf("TransitionTask with CompletedAt %v = %v, %v, want ErrInvalidData; stored %s, CompletedAt %v", far, ok, err, got.Status, got.CompletedAt)
		}
	}
	// The last time the driver sends is held. (The first of timestamptz
	// is before year 1, which no record holds.)
	edge := time.UnixMicro(math.MaxInt64).UTC()
	if err := s.InsertTask(ctx, workers.Record{ID: "u::edge", RunID: "run-1", Watchers: []string{"u"}, CreatedAt: edge, State: workers.State{Status: workers.StatusPending}}); err != nil {
		t.Fatalf("InsertTask with CreatedAt %v: %v", edge, err)
	}
	if got, err := s.GetTask(ctx, "u::edge"); err != nil || !got.CreatedAt.Equal(edge) {
		t.Fatalf("GetTask of a record created at %v = %v, %v", edge, got.CreatedAt, err)
	}
}
