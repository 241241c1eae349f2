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
// which it can no longer read, or that the numbering went back (the
// table emptied by hand). A read that fails is tried again at the next
// interval, the changes waiting in the table; when reads have failed for
// a second, Listen returns the last one's error: a runtime logs it, and
// calls Listen again after its Config.LeaseInterval. Listen returns
// ctx's error when ctx ends.
func (s *Store) Listen(ctx context.Context, changed func(workers.Change)) error {
	var last int64
	if err := s.read.QueryRowContext(ctx, s.lastChange).Scan(&last); err != nil {
		return listenError(ctx, err)
	}
	changed(workers.Change{Resync: true})
	tick := time.NewTicker(s.notices)
	defer tick.Stop()
	var failing time.Time // when reads began to fail; zero while they do not
	checked := time.Now() // when the numbering was last checked
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		err := s.readAll(ctx, &last, &checked, changed)
		switch {
		case err == nil:
			failing = time.Time{}
		case ctx.Err() != nil:
			return ctx.Err()
		case failing.IsZero():
			failing = time.Now()
		case time.Since(failing) >= listenFailure:
			return listenError(ctx, err)
		}
	}
}

// listenFailure is how long Listen's reads may fail before it returns.
const listenFailure = time.Second

// listenError is the error Listen returns after err: ctx's, once ctx
// has ended.
func listenError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("sqlstore/sqlite: listen: %w", err)
}

// readAll calls changed for every change after *last, a page at a time.
// At most once a second, after a read that found none, it checks that
// the numbering did not go back below *last, and says Resync if it did.
func (s *Store) readAll(ctx context.Context, last *int64, checked *time.Time, changed func(workers.Change)) error {
	for {
		n, err := s.readChanges(ctx, last, changed)
		if err != nil {
			return err
		}
		if n == noticePage {
			continue
		}
		if n > 0 || time.Since(*checked) < time.Second {
			return nil
		}
		*checked = time.Now()
		var end int64
		if err := s.read.QueryRowContext(ctx, s.lastChange).Scan(&end); err != nil {
			return err
		}
		if end < *last {
			*last = end
			changed(workers.Change{Resync: true})
		}
		return nil
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
