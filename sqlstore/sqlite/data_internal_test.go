package sqlite

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"
	"time"

	driver "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/taskgate/workers"
)

// A value SQLite refuses for good (here a result longer than the
// connection's length limit, lowered from its billion bytes so that the
// test need not write one) is ErrInvalidData, which the runtime takes as
// permanent (a FAILED record, cause store), not a plain error it would
// try again and again.
func TestAValueSQLiteRefusesIsInvalidData(t *testing.T) {
	ctx := t.Context()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "tasks.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := s.write.Conn(ctx) // the write handle's one connection
	if err != nil {
		t.Fatal(err)
	}
	if _, err := driver.Limit(conn, sqlite3.SQLITE_LIMIT_LENGTH, 100_000); err != nil {
		t.Fatal(err)
	}
	conn.Close() // back to the handle, its limit kept
	rec := workers.Record{ID: "big", RunID: "r1", CreatedAt: time.Now(), State: workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: time.Now()}}
	if err := s.InsertTask(ctx, rec); err != nil {
		t.Fatal(err)
	}
	result := append(append([]byte{'"'}, bytes.Repeat([]byte("a"), 200_000)...), '"')
	done := workers.State{Status: workers.StatusCompleted, Attempt: 1, Progress: 100, StartedAt: rec.StartedAt, CompletedAt: time.Now(), Result: result}
	if _, err := s.TransitionTask(ctx, "big", "r1", []workers.Status{workers.StatusRunning}, done); !errors.Is(err, workers.ErrInvalidData) {
		t.Fatalf("TransitionTask of a result over the length limit: %v, want ErrInvalidData", err)
	}
	if got, err := s.GetTask(ctx, "big"); err != nil || got.Status != workers.StatusRunning {
		t.Fatalf("GetTask after the refused write: %s, %v", got.Status, err)
	}
}
