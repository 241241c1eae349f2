package sqlite_test

import (
	"database/sql"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/taskgate/workers/sqlstore/sqlite"
)

// Open waits, up to the busy timeout, for another process's write lock
// on a file it must switch to WAL, as every statement of the store waits
// for a lock. Here the other process (a replica of a rolling deploy
// switching the same new file to WAL, or creating its tables) holds the
// file's write lock for 200 ms: Open, with a busy timeout of 5 s, must
// wait for it and succeed.
func TestOpenWaitsForAnotherProcessesWriteLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tasks.db")
	other, err := sql.Open("sqlite", path) // rollback journal, as a new file is
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	conn, err := other.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(t.Context(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(t.Context(), "CREATE TABLE app (id INTEGER PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	release := time.AfterFunc(200*time.Millisecond, func() { // the other process's write takes 200 ms
		defer wg.Done()
		_, _ = conn.ExecContext(t.Context(), "COMMIT")
	})
	defer func() {
		if release.Stop() {
			wg.Done()
			_, _ = conn.ExecContext(t.Context(), "ROLLBACK")
		}
		wg.Wait()
	}()
	start := time.Now()
	s, err := sqlite.Open(t.Context(), path, sqlite.WithBusyTimeout(5*time.Second))
	if err != nil {
		t.Fatalf("Open with a busy timeout of 5s, while another process held the write lock for 200ms, failed after %v: %v", time.Since(start), err)
	}
	defer s.Close()
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// Replicas that start at once on a new file (a rolling deploy's first
// start, several processes of one host) all open it and migrate it.
func TestReplicasOpenANewFileAtOnce(t *testing.T) {
	for round := range 40 {
		path := filepath.Join(t.TempDir(), "tasks.db")
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for i := range errs {
			wg.Go(func() {
				s, err := sqlite.Open(t.Context(), path)
				if err != nil {
					errs[i] = err
					return
				}
				defer s.Close()
				errs[i] = s.Migrate(t.Context())
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, replica %d: %v", round, i, err)
			}
		}
	}
}
