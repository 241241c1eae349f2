package sqlite_test

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/sqlite"
)

// A file restored from a copy taken a little earlier numbers its next
// changes from where the copy ended, reusing numbers a listener has
// read past. When more changes than the restore removed are written
// before the listener reads again, the numbering has moved on past where
// the listener stood: it says Resync all the same, rather than skip the
// changes numbered in between.
func TestListenResyncsAfterARestoreOvertakenByNewChanges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tasks.db")
	// A long interval: the restore and the writes after it land between
	// two reads, in the first second after the listener's last check.
	s := openAt(t, path, sqlite.WithNoticeInterval(200*time.Millisecond))
	raw := openRaw(t, path)
	insert := func(id string) {
		t.Helper()
		if _, err := raw.Exec(`INSERT INTO workers_tasks (id, run_id, status) VALUES (?, 'run-1', 'pending')`, id); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		insert("alice::copied" + strconv.Itoa(i))
	}
	next, stop := listen(t, s)
	for i := range 2 {
		insert("alice::lost" + strconv.Itoa(i))
	}
	for i := range 2 {
		if c := next(); c.ID != "alice::lost"+strconv.Itoa(i) {
			t.Fatalf("notice %+v, want alice::lost%d", c, i)
		}
	}

	// The restore: the file as the copy held it, without the last two
	// tasks and their changes, its numbering back to the copy's (a rowid
	// table numbers its next row after its largest). The tasks go first:
	// their delete appends changes, which the copy does not hold either.
	if _, err := raw.Exec(`DELETE FROM workers_tasks WHERE id LIKE 'alice::lost%'`); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Exec(`DELETE FROM workers_changes WHERE seq > 3`); err != nil {
		t.Fatal(err)
	}
	// Three changes after it: seq 4 and 5 again, and 6.
	for i := range 3 {
		insert("alice::after" + strconv.Itoa(i))
	}
	c := next()
	if !c.Resync {
		t.Fatalf("after a restore and more changes than it removed: %+v, want a Resync", c)
	}
	insert("alice::later")
	for c := next(); c.ID != "alice::later"; c = next() {
		if c.Resync || len(c.ID) < len("alice::after") || c.ID[:len("alice::after")] != "alice::after" {
			t.Fatalf("after the Resync: %+v, want alice::after* or alice::later", c)
		}
	}
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Errorf("Listen returned %v, want context.Canceled", err)
	}
}

// heardStore is a store whose listener reports each notice it passes on.
type heardStore struct {
	*sqlite.Store
	heard chan workers.Change
}

func (s heardStore) Listen(ctx context.Context, changed func(workers.Change)) error {
	return s.Store.Listen(ctx, func(c workers.Change) {
		changed(c)
		select {
		case s.heard <- c:
		default: // nobody reads any more
		}
	})
}

// A cancel made in another process right after the changes table went
// back (a restore) takes the number of a change the listener of the
// process running the task has read: the run is cancelled all the
// same, at once, not at the next pass of the sync loop.
func TestCancelAfterARestoreReachesTheRun(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "tasks.db")
	a := heardStore{openAt(t, path, sqlite.WithNoticeInterval(20*time.Millisecond)), make(chan workers.Change, 1024)}
	b := openAt(t, path)
	raw := openRaw(t, path)
	cfg := workers.Config{SyncInterval: time.Hour} // only a notice can bring the cancel in time
	rtA, rtB := workers.NewRuntime(a, cfg), workers.NewRuntime(b, cfg)
	shutdown := func(rt interface{ Shutdown(context.Context) error }) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rt.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	}
	defer shutdown(rtA)
	defer shutdown(rtB)
	if err := rtA.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := rtB.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	hear := func(want func(workers.Change) bool, what string) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case c := <-a.heard:
				if want(c) {
					return
				}
			case <-deadline:
				t.Fatalf("A's listener did not hear %s within 10 s", what)
			}
		}
	}
	// A's listener listens before the run starts: one that began later
	// would start from the end, past the run's start.
	hear(func(c workers.Change) bool { return c.Resync }, "its first Resync")
	alice := workers.MustOwner("alice")
	ended := make(chan error, 1)
	sub, err := rtA.Submit(t.Context(), "report", func(ctx context.Context, _ *workers.Task) (any, error) {
		<-ctx.Done()
		ended <- context.Cause(ctx)
		return nil, context.Cause(ctx)
	}, alice)
	if err != nil {
		t.Fatal(err)
	}
	// A's listener reads the run's start, and every change after it.
	hear(func(c workers.Change) bool { return c.ID == sub.ID && c.Status == workers.StatusRunning }, "the run start")
	var end workers.Change
	var last int64
	if err := raw.QueryRow(`SELECT seq, task_id, run_id, status FROM workers_changes ORDER BY seq DESC LIMIT 1`).Scan(&last, &end.ID, &end.RunID, &end.Status); err != nil {
		t.Fatal(err)
	}
	hear(func(c workers.Change) bool { return c == end }, "the last change")

	// The restore: the changes from the start on are gone, and other
	// changes are made after it, up to the one before the listener's
	// last: the cancel takes that one's number.
	tx, err := raw.Begin()
	if err != nil {
		t.Fatal(err)
	}
	var from int64
	if err := tx.QueryRow(`SELECT MIN(seq) FROM workers_changes WHERE task_id = ? AND status = 'running'`, sub.ID).Scan(&from); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(`DELETE FROM workers_changes WHERE seq >= ?`, from); err != nil {
		t.Fatal(err)
	}
	for i := from; i < last; i++ {
		if _, err := tx.Exec(`INSERT INTO workers_tasks (id, run_id, status) VALUES (?, 'run-1', 'completed')`, "bob::other"+strconv.FormatInt(i, 10)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := rtB.Cancel(t.Context(), sub.ID, alice); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ended:
		if !errors.Is(err, workers.ErrCancelled) {
			t.Errorf("the run ended with %v, want ErrCancelled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the cancel from another process did not reach the run within 5 s")
	}
}
