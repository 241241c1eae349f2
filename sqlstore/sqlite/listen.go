package sqlite

import (
	"context"
	"fmt"
	"time"

	"github.com/taskgate/workers"
)

// DefaultNoticeInterval is how often Listen reads the changes table
// unless WithNoticeInterval says otherwise.
const DefaultNoticeInterval = 50 * time.Millisecond

// noticePage bounds the changes one read of Listen takes; a listener
// behind by more reads again at once.
const noticePage = 256

// Listen implements workers.Notifier. Triggers on the tables append a row
// to the changes table for every committed insert or update of a task
// and every added watcher, numbered in commit order; Listen reads the rows
// after the last one it read every notice interval (WithNoticeInterval,
// 50 ms by default), on a read connection, and calls changed for each.
// So a change made by another process, a cancel say, reaches this one
// within about an interval, and a runtime here follows other processes'
// tasks without reading them on a timer of its own.
//
// It calls changed with a Resync as soon as it has read where the
// changes end, and again when it finds that more changes than the table
// keeps (at least the last 4,096) were made since its last read, some of
// which it can no longer read. A read that fails is tried again at the next interval:
// the changes wait in the table. Listen returns ctx's error when ctx
// ends, and another error only when its first read fails.
func (s *Store) Listen(ctx context.Context, changed func(workers.Change)) error {
	var last int64
	if err := s.read.QueryRowContext(ctx, s.lastChange).Scan(&last); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("sqlstore/sqlite: listen: %w", err)
	}
	changed(workers.Change{Resync: true})
	tick := time.NewTicker(s.notices)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		for {
			n, err := s.readChanges(ctx, &last, changed)
			if err != nil && ctx.Err() != nil {
				return ctx.Err()
			}
			if err != nil || n < noticePage {
				break // a failed read is made again at the next tick
			}
		}
	}
}

// readChanges calls changed for the changes after *last, at most a page
// of them, moves *last past them, and returns how many it read. A gap
// before the first is changes deleted unread: a Resync comes first.
func (s *Store) readChanges(ctx context.Context, last *int64, changed func(workers.Change)) (int, error) {
	rows, err := s.read.QueryContext(ctx, s.changesAfter, *last, noticePage)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var seq int64
		var c workers.Change
		if err := rows.Scan(&seq, &c.ID, &c.RunID, &c.Status); err != nil {
			return n, err
		}
		if n == 0 && seq > *last+1 {
			changed(workers.Change{Resync: true})
		}
		changed(c)
		*last = seq
		n++
	}
	return n, rows.Err()
}
