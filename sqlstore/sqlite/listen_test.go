package sqlite_test

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/sqlite"
)

// Listen hears the changes another process makes. When more changes
// than the 4,096 the table keeps were made since its last read, it says
// Resync before the ones it can still read, in commit order; and the
// table holds 4,096 rows however many changes are made.
func TestListenResyncsAfterMoreChangesThanTheTableKeeps(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tasks.db")
	s := openAt(t, path, sqlite.WithNoticeInterval(5*time.Millisecond))
	next, stop := listen(t, s)

	// Another process inserts 5,000 tasks in one transaction.
	const n = 5000
	raw := openRaw(t, path)
	if _, err := raw.ExecContext(t.Context(), `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < `+strconv.Itoa(n)+`)
		INSERT INTO workers_tasks (id, run_id, status) SELECT 'alice::t' || i, 'run-1', 'pending' FROM n`); err != nil {
		t.Fatal(err)
	}
	if c := next(); !c.Resync {
		t.Fatalf("after %d changes at once, first notice %+v, want a Resync", n, c)
	}
	// The table keeps from 4,096 to 4,351 changes: the last ones, each
	// heard once, in commit order.
	c := next()
	from, err := strconv.Atoi(strings.TrimPrefix(c.ID, "alice::t"))
	if err != nil {
		t.Fatalf("first notice after the Resync: %+v", c)
	}
	if kept := n - from + 1; kept < 4096 || kept > 4351 {
		t.Fatalf("heard the last %d changes, want 4096 to 4351", kept)
	}
	for i := from; i <= n; i++ {
		if i > from {
			c = next()
		}
		if want := (workers.Change{ID: "alice::t" + strconv.Itoa(i), RunID: "run-1", Status: workers.StatusPending}); c != want {
			t.Fatalf("notice %+v, want %+v", c, want)
		}
	}
	var rows int
	if err := raw.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM workers_changes`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != n-from+1 {
		t.Errorf("the changes table holds %d rows, want the %d heard", rows, n-from+1)
	}

	// A watcher added elsewhere is heard, without a run or status.
	if _, err := raw.ExecContext(t.Context(), `INSERT INTO workers_watchers (task_id, user_id) VALUES ('alice::t1', 'bob')`); err != nil {
		t.Fatal(err)
	}
	if c := next(); c != (workers.Change{ID: "alice::t1"}) {
		t.Errorf("after a watcher was added: %+v, want the task's id alone", c)
	}
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Errorf("Listen returned %v, want context.Canceled", err)
	}
}

// Listen fails at once, with an error that says so, when it cannot read
// the changes table at all.
func TestListenFailsWhenItCannotRead(t *testing.T) {
	s := newStore(t)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	err := s.Listen(t.Context(), func(workers.Change) { t.Error("a notice from a closed store") })
	if err == nil || errors.Is(err, context.Canceled) {
		t.Fatalf("Listen on a closed store: %v, want its read's error", err)
	}
}

// The notice interval must be positive.
func TestOpenRefusesANoticeIntervalThatIsNotPositive(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second} {
		if _, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "tasks.db"), sqlite.WithNoticeInterval(d)); !errors.Is(err, workers.ErrInvalidOption) {
			t.Errorf("Open with a notice interval of %v: %v, want ErrInvalidOption", d, err)
		}
	}
}

// A listener whose reads fail for a second (here its store was closed
// under it) returns their error, so that its runtime says so and listens
// again, rather than look as if it listened.
func TestListenReturnsWhenItsReadsKeepFailing(t *testing.T) {
	s, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "tasks.db"), sqlite.WithNoticeInterval(5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	listening := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- s.Listen(t.Context(), func(c workers.Change) {
			if c.Resync {
				close(listening)
			}
		})
	}()
	<-listening
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil || errors.Is(err, context.Canceled) {
			t.Errorf("Listen over a closed store returned %v, want its reads' error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Listen over a closed store did not return")
	}
}

// A changes table emptied by hand numbers its changes from 1 again: the
// listener says Resync, and hears the changes after.
func TestListenResyncsWhenTheNumberingGoesBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tasks.db")
	s := openAt(t, path, sqlite.WithNoticeInterval(5*time.Millisecond))
	raw := openRaw(t, path)
	insert := func(id string) {
		t.Helper()
		if _, err := raw.Exec(`INSERT INTO workers_tasks (id, run_id, status) VALUES (?, 'run-1', 'pending')`, id); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		insert("alice::before" + strconv.Itoa(i))
	}
	next, stop := listen(t, s)
	if _, err := raw.Exec(`DELETE FROM workers_changes`); err != nil {
		t.Fatal(err)
	}
	insert("alice::after")
	if c := next(); !c.Resync {
		t.Fatalf("after the numbering went back: %+v, want a Resync", c)
	}
	insert("alice::later")
	for c := next(); c.ID != "alice::later"; c = next() {
		if c.ID != "alice::after" {
			t.Fatalf("after the Resync: %+v, want alice::after or alice::later", c)
		}
	}
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Errorf("Listen returned %v, want context.Canceled", err)
	}
}

// listen starts s.Listen and returns once its first notice, a Resync,
// came: next returns the next notice, failing the test after 10 s
// without one; stop ends Listen and returns its error.
func listen(t *testing.T, s *sqlite.Store) (next func() workers.Change, stop func() error) {
	t.Helper()
	heard := make(chan workers.Change, 8192)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Listen(ctx, func(c workers.Change) { heard <- c }) }()
	next = func() workers.Change {
		t.Helper()
		select {
		case c := <-heard:
			return c
		case <-time.After(10 * time.Second):
			t.Fatal("no notice within 10 s")
			return workers.Change{}
		}
	}
	if c := next(); !c.Resync {
		t.Fatalf("first notice %+v, want a Resync", c)
	}
	return next, func() error {
		cancel()
		return <-done
	}
}
