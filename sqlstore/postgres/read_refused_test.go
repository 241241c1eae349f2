package postgres_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/taskgate/workers"
)

// A read that cannot connect (the database's address refuses
// connections: the server is down, or restarting) is made again only
// after a pause, 50 ms and then 100 ms, and no more: it used to dial again
// at once, as many times as the pool has connections and once more, each
// try refused alike. A caller's context ends the pause. The test needs no
// server.
func TestAReadThatCannotConnectPausesBeforeItsNextTry(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil { // nothing listens there now: each dial is refused
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig("postgres://nobody@" + addr + "/none?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 8
	var dials atomic.Int32
	var dialer net.Dialer
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return dialer.DialContext(ctx, network, addr)
	}
	s := storeOver(t, cfg)

	begin := time.Now()
	_, err = s.GetTask(t.Context(), "u::t")
	took := time.Since(begin)
	if !errors.Is(err, workers.ErrUnavailable) {
		t.Fatalf("GetTask: %v, want an error wrapping ErrUnavailable", err)
	}
	if n := dials.Load(); n != 3 || took < 150*time.Millisecond {
		t.Errorf("GetTask dialed %d times in %v, each refused: want 3, with 150 ms of pauses between them", n, took)
	}

	dials.Store(0)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	begin = time.Now()
	_, err = s.GetTask(ctx, "u::t")
	took = time.Since(begin)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("GetTask whose deadline passes in its pause: %v, want DeadlineExceeded", err)
	}
	if n := dials.Load(); n != 1 || took > time.Second {
		t.Errorf("GetTask whose deadline passes in its pause dialed %d times in %v: want once, and an answer at its deadline", n, took)
	}
}
