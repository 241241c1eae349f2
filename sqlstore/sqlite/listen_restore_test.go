package sqlite_test

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"testing"
	"time"

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
	// changes, its numbering back to the copy's (a rowid table numbers
	// its next row after its largest).
	if _, err := raw.Exec(`DELETE FROM workers_changes WHERE seq > 3`); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Exec(`DELETE FROM workers_tasks WHERE id LIKE 'alice::lost%'`); err != nil {
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
