package sqlite

import (
	"context"
	"database/sql"
	"errors"
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
// to the changes table for every committed insert or update of a task,
// every delete of a live one, and every added watcher, numbered in
// commit order; Listen reads the rows
// after the last one it read every notice interval (WithNoticeInterval,
// 50 ms by default), on a read connection, and calls changed for each.
// So a change made by another process, a cancel say, reaches this one
// within about an interval, and a runtime here follows other processes'
// tasks without reading them on a timer of its own.
//
// It calls changed with a Resync as soon as it has read where the
// changes end, and again when it finds that more changes than the table
// keeps (at least the last 4,096) were made since its last read, some of
// which it can no longer read, or that the numbering went back: the
// table emptied by hand, or the file restored from an earlier copy,
// which numbers its next changes from where the copy ended. Each read
// reads again the last change it read, and a change no longer there, or
// another one (of another task, run or status) numbered as it, says the
// numbering went back, however many changes were made since. A read
// that fails is tried again at the next interval, the changes waiting in
// the table; when reads have failed for a second, Listen returns the
// last one's error: a runtime logs it, and calls Listen again after its
// Config.LeaseInterval. Listen returns ctx's error when ctx ends.
func (s *Store) Listen(ctx context.Context, changed func(workers.Change)) error {
	var last mark
	if err := s.readEnd(ctx, &last); err != nil {
		return listenError(ctx, err)
	}
	changed(workers.Change{Resync: true})
	tick := time.NewTicker(s.notices)
	defer tick.Stop()
	var failing time.Time // when reads began to fail; zero while they do not
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		err := s.readAll(ctx, &last, changed)
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

// mark is the last change a listener read: its number, and the change,
// by which a read tells that the row numbered so is still that one.
// seq 0 is before every change.
type mark struct {
	seq    int64
	change workers.Change
}

// readEnd sets *last to the last change in the table.
func (s *Store) readEnd(ctx context.Context, last *mark) error {
	var m mark
	err := s.read.QueryRowContext(ctx, s.lastChange).Scan(&m.seq, &m.change.ID, &m.change.RunID, &m.change.Status)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	*last = m
	return nil
}

// readAll calls changed for every change after *last, a page at a time.
func (s *Store) readAll(ctx context.Context, last *mark, changed func(workers.Change)) error {
	for {
		n, err := s.readChanges(ctx, last, changed)
		if err != nil || n < noticePage {
			return err
		}
	}
}

// readChanges calls changed for the changes after *last, at most a page
// of them, moves *last past them, and returns how many it read. It reads
// the change *last names too: when that is gone, or another change holds
// its number, the numbering went back or changes were deleted unread,
// and a Resync comes first. When no change at all is numbered from
// *last on, the numbering went back below it: *last moves to the end.
func (s *Store) readChanges(ctx context.Context, last *mark, changed func(workers.Change)) (int, error) {
	rows, err := s.read.QueryContext(ctx, s.changesFrom, last.seq, noticePage+1)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	n := 0
	first := true
	for rows.Next() {
		var m mark
		if err := rows.Scan(&m.seq, &m.change.ID, &m.change.RunID, &m.change.Status); err != nil {
			return n, err
		}
		if first {
			first = false
			if m == *last {
				continue
			}
			if last.seq > 0 || m.seq > 1 {
				changed(workers.Change{Resync: true})
			}
		}
		changed(m.change)
		*last = m
		n++
	}
	if err := rows.Err(); err != nil {
		return n, err
	}
	if first && last.seq > 0 {
		// Nothing numbered from *last on: the numbering went back.
		if err := s.readEnd(ctx, last); err != nil {
			return 0, err
		}
		changed(workers.Change{Resync: true})
	}
	return n, nil
}
