package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/taskgate/workers"
)

// Listener backoff after a dropped connection: it doubles from the first
// to the last, and a connection that listened again resets it.
const (
	listenBackoffMin = 50 * time.Millisecond
	listenBackoffMax = 5 * time.Second
	listenCloseLimit = 5 * time.Second // for closing a connection once ctx has ended
)

// Listen implements workers.Notifier with PostgreSQL's LISTEN/NOTIFY.
//
// The notices come from triggers on the tables (migration 0003), so
// every committed insert or update of a task and every added watcher
// sends one, whoever wrote it, and a rolled-back write sends none.
// Listen holds one connection of its own, opened with the pool's
// configuration but outside the pool, so it never takes a connection
// the store's queries need. Once it listens it calls changed with a
// Change whose Resync is set, so that a caller who started watching
// before Listen connected misses nothing; after a dropped connection it
// reconnects with a backoff of 50 ms doubling up to 5 s and calls changed
// with Resync again. A notice too long for NOTIFY's 8000-byte payload
// (a very long task id) arrives as Resync.
//
// Listen returns ctx's error when ctx ends, having closed its
// connection. It returns another error only if its first connection
// fails, in which case it leaves nothing open.
func (s *Store) Listen(ctx context.Context, changed func(workers.Change)) error {
	conn, err := s.listenConn(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("sqlstore/postgres: listen: %w", err)
	}
	backoff := listenBackoffMin
	for {
		changed(workers.Change{Resync: true})
		err := s.follow(ctx, conn, changed)
		closeConn(conn)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		_ = err // the Resync after reconnecting tells the caller what it needs
		for {
			if !pause(ctx, backoff) {
				return ctx.Err()
			}
			backoff = min(2*backoff, listenBackoffMax)
			if conn, err = s.listenConn(ctx); err == nil {
				backoff = listenBackoffMin
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
	}
}

// listenConn opens a connection outside the pool and listens on the
// store's channel.
func (s *Store) listenConn(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize()); err != nil {
		closeConn(conn)
		return nil, err
	}
	return conn, nil
}

// follow passes conn's notices to changed until the connection fails or
// ctx ends.
func (s *Store) follow(ctx context.Context, conn *pgx.Conn, changed func(workers.Change)) error {
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		changed(decodeNotice(n.Payload))
	}
}

// notice is the payload the trigger sends.
type notice struct {
	ID     string `json:"id"`
	Run    string `json:"run"`
	Status string `json:"status"`
}

// decodeNotice turns a payload into a Change; one it cannot read (the
// empty payload of a notice too long to send) is a Resync.
func decodeNotice(payload string) workers.Change {
	var n notice
	if payload == "" || json.Unmarshal([]byte(payload), &n) != nil || n.ID == "" {
		return workers.Change{Resync: true}
	}
	return workers.Change{ID: n.ID, RunID: n.Run, Status: workers.Status(n.Status)}
}

// closeConn closes conn within a bound, whatever the caller's context.
func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), listenCloseLimit)
	defer cancel()
	_ = conn.Close(ctx)
}

// pause waits for d or until ctx ends, and reports whether d passed.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
