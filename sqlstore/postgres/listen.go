package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/taskgate/workers"
)

var _ workers.Notifier = (*Store)(nil)

// Listen implements workers.Notifier with LISTEN/NOTIFY. A trigger on the
// tables sends a notice on the store's channel when a task row is
// inserted or updated and when a watcher is added, delivered once the
// write commits. Listen holds one connection of its own, opened with the
// pool's configuration but outside the pool, named "workers listener" in
// pg_stat_activity.
//
// It calls changed with a Resync as soon as it listens, and again after
// every reconnect, since notices sent while it was not listening are
// lost. A dropped connection is reopened with capped backoff (50 ms to
// 5 s). Listen returns ctx's error when ctx ends, and another error only
// when its first connection fails.
func (s *Store) Listen(ctx context.Context, changed func(workers.Change)) error {
	cfg := s.pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] = listenerName
	listen := "LISTEN " + pgx.Identifier{s.Channel()}.Sanitize()
	const first, most = 50 * time.Millisecond, 5 * time.Second
	backoff := first
	for listened := false; ; {
		err := listenOnce(ctx, cfg, listen, func(c workers.Change) {
			listened, backoff = true, first
			changed(c)
		})
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case !listened:
			return fmt.Errorf("sqlstore/postgres: listen: %w", err)
		}
		timer := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
		backoff = min(2*backoff, most)
	}
}

// listenerName is the application_name of Listen's connection.
const listenerName = "workers listener"

// listenOnce opens a connection, listens, reports a Resync, then every
// notice until the connection fails or ctx ends.
func listenOnce(ctx context.Context, cfg *pgx.ConnConfig, listen string, changed func(workers.Change)) error {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		closing, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		conn.Close(closing)
	}()
	if _, err := conn.Exec(ctx, listen); err != nil {
		return err
	}
	changed(workers.Change{Resync: true})
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		changed(parseNotice(n.Payload))
	}
}

// parseNotice reads a notice's payload: the JSON the trigger builds, or
// empty when the change was too large to describe, which is a Resync.
func parseNotice(payload string) workers.Change {
	var p struct{ ID, Run, Status string }
	if payload == "" || json.Unmarshal([]byte(payload), &p) != nil || p.ID == "" {
		return workers.Change{Resync: true}
	}
	return workers.Change{ID: p.ID, RunID: p.Run, Status: workers.Status(p.Status)}
}
