package postgres

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/taskgate/workers"
)

// TestParseNotice: the trigger's payloads become Changes; an empty one
// (what the trigger sends when the payload would pass NOTIFY's limit)
// and one that cannot be read become a Resync.
func TestParseNotice(t *testing.T) {
	for payload, want := range map[string]workers.Change{
		`{"id" : "a::k", "run" : "i.1", "status" : "running"}`: {ID: "a::k", RunID: "i.1", Status: workers.StatusRunning},
		`{"id" : "a::k"}`: {ID: "a::k"},
		``:                {Resync: true},
		`{"run":"i.1"}`:   {Resync: true},
		`not json`:        {Resync: true},
	} {
		if got := parseNotice(payload); got != want {
			t.Errorf("parseNotice(%q) = %+v, want %+v", payload, got, want)
		}
	}
}

// TestDataError: the refusals of data (SQLSTATE class 22) are data
// errors, which the store wraps in workers.ErrInvalidData; a lost
// connection, a terminated backend or a serialization failure is not.
func TestDataError(t *testing.T) {
	for code, want := range map[string]bool{
		"22P05": true,  // untranslatable character (\u0000 in jsonb)
		"22021": true,  // NUL byte in text
		"22008": true,  // datetime field overflow
		"08006": false, // connection failure
		"57P01": false, // admin shutdown (pg_terminate_backend)
		"40001": false, // serialization failure
	} {
		if got := dialect.DataError(&pgconn.PgError{Code: code}); got != want {
			t.Errorf("DataError(SQLSTATE %s) = %v, want %v", code, got, want)
		}
	}
}

// TestConnLost: a backend the server ended and a connection that failed
// or was cut are lost connections, so a read goes again; a refusal of
// the statement is not.
func TestConnLost(t *testing.T) {
	for err, want := range map[error]bool{
		&pgconn.PgError{Code: "57P01"}:              true, // admin shutdown (pg_terminate_backend)
		&pgconn.PgError{Code: "57P02"}:              true, // crash shutdown
		&pgconn.PgError{Code: "08006"}:              true, // connection failure
		fmt.Errorf("read: %w", io.ErrUnexpectedEOF): true,
		fmt.Errorf("query: %w", driver.ErrBadConn):  true,
		// A pooled connection the driver closed (its backend ended) before
		// the query, as pgx reports it when it first clears its cache.
		fmt.Errorf("failed to deallocate cached statement(s): %w", pgconn.ErrConnClosed): true,
		&pgconn.PgError{Code: "22P05"}: false, // a data error
		&pgconn.PgError{Code: "40001"}: false, // serialization failure
		&pgconn.PgError{Code: "57014"}: false, // query cancelled
		errors.New("something else"):   false,
		context.DeadlineExceeded:       false,
	} {
		if got := dialect.ConnLost(err); got != want {
			t.Errorf("ConnLost(%v) = %v, want %v", err, got, want)
		}
	}
}

// FuzzScanNotice: where the allocation-free scan reads a payload, it
// reads what encoding/json reads.
func FuzzScanNotice(f *testing.F) {
	for _, p := range []string{
		`{"id" : "a::k", "run" : "i.1", "status" : "running"}`,
		`{"id" : "a::k"}`, `{}`, ``, `{"ID":"x","Run":"y","STATUS":"z"}`,
		`{"id":"a","id":"b"}`, `{"id":"a\"b"}`, `{"id":"é","other":"x"}`,
		`{"id":"a","run":null}`, ` { "id" : "a" } `, `{"id":"a",}`, `{"id":"a"}x`,
	} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, payload string) {
		got, ok := scanNotice(payload)
		if !ok {
			return
		}
		if want := decodeNotice(payload); got != want {
			t.Errorf("scanNotice(%q) = %+v, encoding/json reads %+v", payload, got, want)
		}
	})
}

// The trigger's payloads take the scan, with no allocation.
func TestScanNoticeAllocatesNothing(t *testing.T) {
	payload := `{"id" : "alice::report", "run" : "Q1w2E3r4T5y6U7i8O9p0aA.12", "status" : "completed"}`
	var c workers.Change
	allocs := testing.AllocsPerRun(100, func() { c = parseNotice(payload) })
	if want := (workers.Change{ID: "alice::report", RunID: "Q1w2E3r4T5y6U7i8O9p0aA.12", Status: workers.StatusCompleted}); c != want {
		t.Fatalf("parseNotice = %+v, want %+v", c, want)
	}
	if allocs != 0 {
		t.Errorf("parseNotice allocates %v times per notice, want none", allocs)
	}
}
