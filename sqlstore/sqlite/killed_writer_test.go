package sqlite_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/sqlite"
)

// holderEnv names, for the child of TestKilledWriterLeavesNoLockNorChange,
// the database file whose write lock it holds.
const holderEnv = "WORKERS_SQLITE_TEST_HOLDER"

// ghosts is how many tasks the killed process inserts without
// committing: more changes than the changes table keeps.
const ghosts = 5000

// A process killed with SIGKILL while it holds the file's write lock, in
// the middle of a transaction that has written pages, leaves no lock
// behind and none of its writes: the next write of another process
// lands at once, even with no busy timeout at all; the dead
// transaction's tasks are not there; and a listener hears the changes
// after it, numbered on from the last committed one, without a Resync
// and without a notice of the dead writes.
func TestKilledWriterLeavesNoLockNorChange(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "tasks.db")
	s := openAt(t, path, sqlite.WithNoticeInterval(5*time.Millisecond))
	impatient := openAt(t, path, sqlite.WithBusyTimeout(0))
	rec := func(id string) workers.Record {
		return workers.Record{ID: id, RunID: "run-1", Watchers: []string{"alice"}, State: workers.State{Status: workers.StatusPending}}
	}
	if err := s.InsertTask(t.Context(), rec("alice::before")); err != nil {
		t.Fatal(err)
	}
	next, stop := listen(t, s)

	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperHoldingTheWriteLock$", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), holderEnv+"="+path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	holding := make(chan bool, 1)
	go func() {
		lines := bufio.NewScanner(out)
		ok := false
		for lines.Scan() {
			if lines.Text() == "holding" {
				ok = true
				break
			}
		}
		holding <- ok
		_, _ = io.Copy(io.Discard, out)
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Process.Kill()
		<-exited
	})
	select {
	case ok := <-holding:
		if !ok {
			t.Fatal("the child exited without taking the write lock")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the child did not take the write lock within 30 s")
	}
	// The child holds the lock: a write that does not wait fails.
	if err := impatient.InsertTask(t.Context(), rec("alice::during")); err == nil {
		t.Fatal("a write landed while another process held the write lock")
	}

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		exited <- nil // for the cleanup
	case <-time.After(30 * time.Second):
		t.Fatal("the child outlived SIGKILL by 30 s")
	}
	if st := cmd.ProcessState; st == nil || st.Exited() {
		t.Fatalf("the child exited by itself (%v) instead of being killed", st)
	}

	// No lock left: a write that does not wait lands.
	if err := impatient.InsertTask(t.Context(), rec("alice::after")); err != nil {
		t.Fatalf("a write after the lock holder was killed: %v", err)
	}
	if _, err := s.GetTask(t.Context(), "alice::ghost1"); !errors.Is(err, workers.ErrNotFound) {
		t.Errorf("a task of the killed transaction: %v, want ErrNotFound", err)
	}
	// The listener hears the insert after the kill, and its watcher, as
	// the next changes: nothing of the dead transaction, and no Resync.
	for _, want := range []workers.Change{
		{ID: "alice::after", RunID: "run-1", Status: workers.StatusPending},
		{ID: "alice::after"},
	} {
		if c := next(); c != want {
			t.Fatalf("notice %+v, want %+v", c, want)
		}
	}
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Errorf("Listen returned %v, want context.Canceled", err)
	}
}

// TestHelperHoldingTheWriteLock is the child of
// TestKilledWriterLeavesNoLockNorChange: it begins a transaction on the
// file holderEnv names, inserts tasks in it, says "holding", and waits,
// holding the write lock, until it is killed. Run on its own, it does
// nothing.
func TestHelperHoldingTheWriteLock(t *testing.T) {
	path := os.Getenv(holderEnv)
	if path == "" {
		return
	}
	db, err := sql.Open("sqlite", path+"?_busy_timeout=5000&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	// A small page cache, so that the transaction writes its pages to
	// the WAL before it commits.
	if _, err := db.Exec(`PRAGMA cache_size = 16`); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec(`WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
		INSERT INTO workers_tasks (id, run_id, status) SELECT 'alice::ghost' || i, 'run-1', 'pending' FROM n`, ghosts); err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString("holding\n")
	_, _ = io.Copy(io.Discard, os.Stdin) // until killed, or the parent's end
}
