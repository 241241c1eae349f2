package postgres

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// A batch is retried row by row only after an error that proves it rolled
// back: an ERROR, never a FATAL one (the backend ended, perhaps after the
// commit) or a failure of the connection.
func TestRefusedOnlyWhenTheStatementRolledBack(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"data exception", &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "22008"}, true},
		{"deadlock, wrapped", fmt.Errorf("write tasks: %w", &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "40P01"}), true},
		{"localized, from an old server", &pgconn.PgError{Severity: "ERROR", Code: "23505"}, true},
		{"localized severity", &pgconn.PgError{Severity: "ERREUR", SeverityUnlocalized: "ERROR", Code: "22008"}, true},
		{"backend terminated", &pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P01"}, false},
		// A pooler that lost the server's connection, perhaps after the
		// commit, says so as an ERROR.
		{"a pooler's lost server connection", &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "08P01", Message: "server conn crashed?"}, false},
		{"a pooler's backend terminated", &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "57P01"}, false},
		{"connection lost", errors.New("unexpected EOF"), false},
	} {
		if got := dialect.Refused(c.err); got != c.want {
			t.Errorf("%s: Refused = %v, want %v", c.name, got, c.want)
		}
	}
}

// A connection is lost when the server ended it, whatever the code of a
// FATAL error once connected (a FATAL error in connecting:
// TestAMissingDatabaseIsNotUnavailable).
func TestConnLostByFatalErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"idle session timeout", &pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P05"}, true},
		{"idle in transaction timeout, wrapped", fmt.Errorf("get task: %w", &pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "25P03"}), true},
		{"database dropped, localized", &pgconn.PgError{Severity: "FATAL", Code: "57P04"}, true},
		{"panic", &pgconn.PgError{Severity: "PANIC", SeverityUnlocalized: "PANIC", Code: "XX000"}, true},
		{"an ERROR", &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "22008"}, false},
	} {
		if got := connLost(c.err); got != c.want {
			t.Errorf("%s: connLost = %v, want %v", c.name, got, c.want)
		}
	}
}

// Reads and the writes waiting on held rows leave at least one of the
// pool's connections to the lease's renewals and the other writes; a
// pool of one or two has none to spare.
func TestReadsLeaveConnectionsToTheWrites(t *testing.T) {
	for n, want := range map[int32]int{1: 1, 2: 1, 3: 1, 4: 1, 5: 2, 6: 2, 8: 3, 10: 4, 100: 49} {
		if got := readConns(n); got != want {
			t.Errorf("readConns(%d) = %d, want %d", n, got, want)
		}
		if n > 2 && readConns(n)+loneWrites(n) >= int(n) {
			t.Errorf("readConns(%d) + loneWrites(%d) = %d, leaving none of the pool's %d", n, n, readConns(n)+loneWrites(n), n)
		}
	}
}

// A write the server refuses whatever its data, read-only (25006: a
// standby after a failover) or out of disk (53100), is unavailability,
// which passes: neither a refusal of the data nor a lost connection,
// which would reset the pool.
func TestWritesRefusedForNow(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"read-only transaction", &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "25006"}, true},
		{"disk full, wrapped", fmt.Errorf("transition task: %w", &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "53100"}), true},
		{"data exception", &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "22008"}, false},
		{"backend terminated", &pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P01"}, false},
		{"connection lost", errors.New("unexpected EOF"), false},
	} {
		if got := dialect.WritesRefused(c.err); got != c.want {
			t.Errorf("%s: WritesRefused = %v, want %v", c.name, got, c.want)
		}
		if c.want && (dialect.DataError(c.err) || connLost(c.err)) {
			t.Errorf("%s: taken for a refusal of the data, or a lost connection", c.name)
		}
	}
}

// An error that says something is missing names what is missing as
// PostgreSQL's message gives it, so that the store says to call Migrate
// only when it is a table or function of its own, or a column: an
// operator that does not exist, which shares undefined_function's code,
// is no missing table or function.
func TestMissingNamesWhatIsMissing(t *testing.T) {
	for _, c := range []struct {
		name     string
		err      error
		want     string
		wantMiss bool
	}{
		{"a table", &pgconn.PgError{Code: "42P01", Message: `relation "s.workers_tasks" does not exist`}, "s.workers_tasks", true},
		{"a column of a table", &pgconn.PgError{Code: "42703", Message: `column "cause" of relation "workers_tasks" does not exist`}, "workers_tasks", true},
		{"a column", &pgconn.PgError{Code: "42703", Message: `column t.cause does not exist`}, "", true},
		{"a function", &pgconn.PgError{Code: "42883", Message: `function s.workers_write_many(text[], integer) does not exist`}, "s.workers_write_many", true},
		{"a schema", &pgconn.PgError{Code: "3F000", Message: `schema "s" does not exist`}, "", true},
		{"an operator", &pgconn.PgError{Code: "42883", Message: `operator does not exist: text = integer`}, "", false},
		{"in another language", &pgconn.PgError{Code: "42883", Message: `la fonction s.workers_write_many(text[]) n'existe pas`}, "", true},
		{"another error", &pgconn.PgError{Code: "22008", Message: `relation "x" does not exist`}, "", false},
	} {
		name, ok := missing(fmt.Errorf("wrapped: %w", c.err))
		if name != c.want || ok != c.wantMiss {
			t.Errorf("%s: missing = %q, %v, want %q, %v", c.name, name, ok, c.want, c.wantMiss)
		}
	}
}
