package postgres

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// The statements in flight when the server ended their connections fail
// one after the other, and only the first resets the pool; those that
// fail within resetEvery of it reset nothing: a reset closes every
// connection the pool holds, and another would close only those dialed
// since. A connection that could not be dialed resets nothing.
func TestLostConnectionsResetThePoolOncePerInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		resets := 0
		var logged bytes.Buffer
		r := newResetter(func() { resets++ }, slog.New(slog.NewTextHandler(&logged, nil)))
		ended := fmt.Errorf("get task: %w", &pgconn.PgError{Severity: "FATAL", Code: "57P01"})
		check := func(when string, want int) {
			t.Helper()
			if resets != want {
				t.Fatalf("%s: %d resets, want %d", when, resets, want)
			}
		}

		r.lost(fmt.Errorf("get task: %w", &pgconn.ConnectError{}))
		check("a dial that failed", 0)
		r.lost(ended)
		r.lost(ended)
		r.lost(errors.New("unexpected EOF"))
		check("three statements lost at once", 1)
		time.Sleep(resetEvery - time.Millisecond)
		r.lost(ended)
		check("a statement lost within the interval", 1)
		time.Sleep(time.Millisecond)
		r.lost(ended)
		check("a statement lost an interval after the reset", 2)
		r.lost(&pgconn.ConnectError{})
		time.Sleep(resetEvery)
		r.lost(&pgconn.ConnectError{})
		check("dials that failed", 2)
		if n := strings.Count(logged.String(), "level=WARN msg=\"sqlstore/postgres: a connection was lost; the pool's connections are closed, for new ones\" err="); n != 2 {
			t.Errorf("%d resets logged, want 2:\n%s", n, logged.String())
		}
	})
}
