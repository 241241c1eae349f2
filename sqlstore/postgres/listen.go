package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/internal/sqlcore"
)

var _ workers.Notifier = (*Store)(nil)

// Listen implements workers.Notifier with LISTEN/NOTIFY. A trigger on the
// tables sends a notice on the store's channel when a task row is inserted
// or updated, when a live one is deleted, and when a watcher is added,
// delivered once the write commits; the store's own inserts of new tasks
// are announced just after their commit instead (see the package's
// Notices). Listen holds one
// connection of its own, opened outside the pool as the pool opens its own
// (its configuration, with its BeforeConnect and AfterConnect hooks run
// for each connection, so that credentials a hook supplies serve the
// listener too), and named "workers listener" in pg_stat_activity. Its
// session sets idle_session_timeout to 0: it waits idle for notices, and
// a server that ends idle sessions would otherwise end it each time,
// with a Resync after each reconnect.
//
// It calls changed with a Resync as soon as it listens, and again after
// every reconnect, since notices sent while it was not listening are
// lost. A dropped connection is reopened with backoff (50 ms, doubling),
// for a second at most (see below). A connection that carried no notice for 15 s is pinged, and
// dropped if the ping is not answered within 5 s: a server gone without
// closing it (a failover, a network partition) is noticed within about
// 20 s, not when TCP gives up. Connecting (the pool's hooks included)
// and starting to listen are bounded by 20 s. The pool's OnNotification
// handler, if it has one, is not the listener's. Listen returns ctx's
// error when ctx ends, and another error when its first connection
// fails, or when a dropped connection could not be reopened for a second
// (the server refusing new connections, say): it does not listen then,
// and a runtime polls meanwhile and calls Listen again after its
// Config.LeaseInterval.
func (s *Store) Listen(ctx context.Context, changed func(workers.Change)) error {
	pc := s.pool.Config()
	listen := "LISTEN " + pgx.Identifier{sqlcore.Channel(s.core)}.Sanitize()
	const first = 50 * time.Millisecond
	backoff := first
	var dropped time.Time // when the connection dropped, while no other listens; zero while one does
	for listened := false; ; {
		err := listenOnce(ctx, pc, listen, s.listen, func(c workers.Change) {
			listened, backoff, dropped = true, first, time.Time{}
			changed(c)
		})
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case !listened:
			return fmt.Errorf("sqlstore/postgres: listen: %w", err)
		case dropped.IsZero():
			dropped = time.Now()
		case time.Since(dropped) >= reconnectFor:
			// Not listening, and no telling for how long: the caller is
			// told, so that it stops counting on notices (a runtime's
			// Waits poll again) and calls Listen again later.
			return fmt.Errorf("sqlstore/postgres: listen: no connection for %v since the last one dropped: %w", reconnectFor, err)
		}
		if !sqlcore.Sleep(ctx, backoff) {
			return ctx.Err()
		}
		backoff *= 2
	}
}

// reconnectFor is how long Listen tries to reopen a dropped connection
// before it returns an error, as the SQLite store's Listen does once its
// reads have failed for a second.
const reconnectFor = time.Second

// listenerName is the application_name of Listen's connection.
const listenerName = "workers listener"

// listenOnce opens a connection as the pool pc would, listens, reports a
// Resync, then every notice until the connection fails or ctx ends.
func listenOnce(ctx context.Context, pc *pgxpool.Config, listen string, timing listenTiming, changed func(workers.Change)) error {
	cfg := pc.ConnConfig.Copy()
	// Setting up is bounded too, the pool's hooks with it, for a server
	// that accepts the connection and then stops answering, or a hook
	// whose credential service hangs.
	setup, cancelSetup := context.WithTimeout(ctx, timing.check+timing.ping)
	defer cancelSetup()
	if pc.BeforeConnect != nil {
		if err := pc.BeforeConnect(setup, cfg); err != nil {
			return err
		}
	}
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["application_name"] = listenerName
	// The wait for a notice ends every timing.check: the connection must
	// stay usable when it does, which a deadline on the socket leaves
	// it, where a cancel request the pool's configuration may ask for
	// would cost a connection to the server each time.
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	// pgx keeps a notice for WaitForNotification only when the
	// connection has no handler of its own: the pool's may have one.
	cfg.OnNotification = nil
	conn, err := pgx.ConnectConfig(setup, cfg)
	if err != nil {
		return err
	}
	defer func() {
		closing, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		conn.Close(closing)
	}()
	if pc.AfterConnect != nil {
		if err := pc.AfterConnect(setup, conn); err != nil {
			return err
		}
	}
	// A server that ends idle sessions (idle_session_timeout, from
	// PostgreSQL 14, set in the connection string or for the role or the
	// database) would end this one, which waits idle for notices, every
	// time it runs out, and every reconnect is a Resync, a re-read of
	// all their runs, for every runtime listening: this session never
	// times out. A server before 14 does not know the setting.
	if _, err := conn.Exec(setup, "SET idle_session_timeout = 0"); err != nil && !unknownSetting(err) {
		return err
	}
	if _, err := conn.Exec(setup, listen); err != nil {
		return err
	}
	cancelSetup()
	changed(workers.Change{Resync: true})
	for {
		wait, cancel := context.WithTimeout(ctx, timing.check)
		n, err := conn.WaitForNotification(wait)
		cancel()
		if n != nil {
			changed(parseNotice(n.Payload))
		}
		switch {
		case err == nil:
			continue
		case ctx.Err() != nil || wait.Err() == nil:
			return err
		}
		// Silent for timing.check: a server gone without closing the
		// connection (a failover, a partition) would leave the wait
		// until TCP gives up, minutes or hours later.
		ping, cancel := context.WithTimeout(ctx, timing.ping)
		err = conn.Ping(ping)
		cancel()
		if err != nil {
			return fmt.Errorf("the connection did not answer a ping after %v without notices: %w", timing.check, err)
		}
	}
}

// unknownSetting reports whether err is the server's answer that it has
// no such setting (undefined_object).
func unknownSetting(err error) bool {
	pe, ok := errors.AsType[*pgconn.PgError](err)
	return ok && pe.Code == "42704"
}

// listenTiming is how long a listener's connection may carry no notice
// before it is pinged (check), and how long the ping may take (ping)
// before the connection is dropped. Setting the connection up may take
// both.
type listenTiming struct{ check, ping time.Duration }

var defaultListen = listenTiming{check: 15 * time.Second, ping: 5 * time.Second}

// parseNotice reads a notice's payload: the JSON the trigger builds, or
// empty when the change was too large to describe, which is a Resync.
func parseNotice(payload string) workers.Change {
	if c, ok := scanNotice(payload); ok {
		return c
	}
	return decodeNotice(payload)
}

// decodeNotice is parseNotice for any payload, with encoding/json.
func decodeNotice(payload string) workers.Change {
	var p struct{ ID, Run, Status string }
	if payload == "" || json.Unmarshal([]byte(payload), &p) != nil || p.ID == "" {
		return workers.Change{Resync: true}
	}
	return workers.Change{ID: p.ID, RunID: p.Run, Status: workers.Status(p.Status)}
}

// scanNotice reads the payload as the trigger builds it, an object whose
// values are plain strings, without encoding/json's allocations: a
// listener reads a notice for every write of every process. The fields
// are substrings of payload. It reports false, for parseNotice to decode
// the payload in full, at anything else: an escape, a value that is not
// a string, text that is not UTF-8, malformed JSON. Keys match as
// encoding/json matches them to the fields, regardless of case.
func scanNotice(payload string) (workers.Change, bool) {
	var p struct{ ID, Run, Status string }
	sc := noticeScanner{s: payload}
	if !sc.next('{') {
		return workers.Change{}, false
	}
	for first := true; !sc.next('}'); first = false {
		if !first && !sc.next(',') {
			return workers.Change{}, false
		}
		key, ok := sc.str()
		if !ok || !sc.next(':') {
			return workers.Change{}, false
		}
		val, ok := sc.str()
		if !ok {
			return workers.Change{}, false
		}
		switch {
		case strings.EqualFold(key, "id"):
			p.ID = val
		case strings.EqualFold(key, "run"):
			p.Run = val
		case strings.EqualFold(key, "status"):
			p.Status = val
		}
	}
	if sc.space(); sc.i != len(payload) || p.ID == "" {
		return workers.Change{}, false
	}
	return workers.Change{ID: p.ID, RunID: p.Run, Status: workers.Status(p.Status)}, true
}

// noticeScanner walks a notice's payload for scanNotice.
type noticeScanner struct {
	s string
	i int
}

// space skips JSON whitespace.
func (sc *noticeScanner) space() {
	for sc.i < len(sc.s) {
		switch sc.s[sc.i] {
		case ' ', '\t', '\n', '\r':
			sc.i++
		default:
			return
		}
	}
}

// next consumes b, after whitespace, if it comes next.
func (sc *noticeScanner) next(b byte) bool {
	sc.space()
	if sc.i < len(sc.s) && sc.s[sc.i] == b {
		sc.i++
		return true
	}
	return false
}

// str consumes a string without escapes, after whitespace, and returns
// its contents.
func (sc *noticeScanner) str() (string, bool) {
	if !sc.next('"') {
		return "", false
	}
	for j := sc.i; j < len(sc.s); j++ {
		switch c := sc.s[j]; {
		case c == '"':
			v := sc.s[sc.i:j]
			sc.i = j + 1
			return v, utf8.ValidString(v)
		case c == '\\' || c < 0x20:
			return "", false
		}
	}
	return "", false
}
