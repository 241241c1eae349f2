package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/taskgate/workers/sqlstore/sqlite"
)

// Open is bounded by its context. A database file that is not in WAL
// mode yet (a file another program made, whose tables the store joins
// under its prefix) cannot be switched to WAL while another connection
// reads it: Open waits for that connection, as every statement waits for
// a lock, but no longer than its context allows, not for the whole busy
// timeout.
func TestOpenIsBoundedByItsContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "app.db")
	db, err := sql.Open("sqlite", path) // rollback journal, SQLite's default
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE accounts (id INTEGER PRIMARY KEY); INSERT INTO accounts VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	conn, err := db.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The other program reads, in a transaction.
	if _, err := conn.ExecContext(t.Context(), "BEGIN"); err != nil {
		t.Fatal(err)
	}
	var id int
	if err := conn.QueryRowContext(t.Context(), "SELECT id FROM accounts").Scan(&id); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	type result struct {
		s   *sqlite.Store
		err error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		s, err := sqlite.Open(ctx, path, sqlite.WithBusyTimeout(10*time.Second))
		done <- result{s, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(3 * time.Second):
		t.Errorf("Open with a context of 200ms had not returned after %v", time.Since(start))
		if _, err := conn.ExecContext(context.Background(), "ROLLBACK"); err != nil { // let Open go
			t.Fatal(err)
		}
		r = <-done
		t.Logf("Open returned %v after %v, once the other connection's read ended", r.err, time.Since(start))
	}
	if r.s != nil {
		r.s.Close()
	}
	if r.err == nil {
		t.Errorf("Open with a context of 200ms against a held lock returned no error")
	}
}
