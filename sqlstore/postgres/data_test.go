package postgres_test

import (
	"errors"
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
// (a time beyond timestamptz's range, SQLSTATE 22008) wraps
// ErrInvalidData, which the runtime takes as permanent.
func TestDatabaseRefusalIsInvalidData(t *testing.T) {
	s := newStore(t)
	far := time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC)
	err := s.InsertTask(t.Context(), workers.Record{ID: "u::far", RunID: "i.1", Watchers: []string{"u"}, CreatedAt: far,
		State: workers.State{Status: workers.StatusPending}})
	if err == nil {
		t.Skip("this server stores year 300000; no data error to provoke")
	}
	if !errors.Is(err, workers.ErrInvalidData) {
		t.Fatalf("InsertTask with a time out of range = %v, want ErrInvalidData", err)
	}
}
