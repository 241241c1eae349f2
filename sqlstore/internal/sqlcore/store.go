package sqlcore

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/taskgate/workers"
)

// The shared SQL. {tasks} and {watchers} are the quoted table names, {agg}
// is Dialect.JSONAgg and {share} is Dialect.RowShareLock. Parameters $1 to
// $12 are always the id and the eleven State columns, in this order.
const (
	sqlSelect = `SELECT t.id, t.run_id, t.queue, t.created_at, t.status, t.progress, t.attempt,
	t.result, t.error, t.started_at, t.completed_at, t.cause, t.cancelled_by, t.cancel_reason, t.stack,
	COALESCE((SELECT {agg}(w.user_id ORDER BY w.seq) FROM {watchers} w WHERE w.task_id = t.id), '[]')
FROM {tasks} t`

	sqlGet = sqlSelect + ` WHERE t.id = $1`

	sqlInsert = `INSERT INTO {tasks}
	(id, status, progress, attempt, result, error, started_at, completed_at,
	cause, cancelled_by, cancel_reason, stack, run_id, queue, created_at, owner)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
ON CONFLICT (id) DO NOTHING`

	sqlSetState = `UPDATE {tasks} SET status = $2, progress = $3, attempt = $4, result = $5, error = $6,
	started_at = $7, completed_at = $8, cause = $9, cancelled_by = $10, cancel_reason = $11, stack = $12`

	sqlSet = sqlSetState + ` WHERE id = $1`

	// TransitionTask appends "AND status IN (...)" with parameters from $14.
	sqlTransition = sqlSetState + ` WHERE id = $1 AND run_id = $13`

	sqlReplace = sqlSetState + `, run_id = $13, queue = $14, created_at = $15 WHERE id = $1 AND run_id = $16`

	// The compare-and-set append: the SELECT yields the task row only if
	// it belongs to run $2, and the primary key on (task_id, user_id)
	// makes a watcher already present a no-op. {share} locks the row
	// against a concurrent ReplaceTask until the append commits; once that
	// replace has committed, the re-checked run id no longer matches.
	sqlAddWatcher = `INSERT INTO {watchers} (task_id, user_id, created_at)
SELECT id, $3, created_at FROM {tasks} WHERE id = $1 AND run_id = $2{share}
ON CONFLICT DO NOTHING`

	sqlRunOf = `SELECT run_id FROM {tasks} WHERE id = $1`

	sqlDropWatchers = `DELETE FROM {watchers} WHERE task_id = $1`

	// insertWatchers appends one "($1, $2, $n)" row per watcher: the
	// task id, its created_at, the user id.
	sqlInsertWatchers = `INSERT INTO {watchers} (task_id, created_at, user_id) VALUES `

	// One batch of DeleteFinished: at most $5 rows, so that no statement
	// holds the write lock (SQLite's, the whole file's) for long. The
	// outer WHERE repeats the conditions, for a database that checks a
	// row changed while the DELETE waited for it against the outer WHERE
	// alone: a task re-run since is not deleted.
	sqlDeleteFinished = `DELETE FROM {tasks} WHERE id IN (
SELECT id FROM {tasks} WHERE status IN ($2, $3, $4) AND (completed_at < $1 OR completed_at IS NULL) LIMIT $5)
AND status IN ($2, $3, $4) AND (completed_at < $1 OR completed_at IS NULL)`

	// A listing's branches (see listQuery): the ids of one range of one
	// source, read in order from its (owner | user_id | -, created_at, id)
	// index. %[1]s is the conditions, %[2]s the ORDER BY and LIMIT.
	sqlOwnedIDs   = `SELECT page.id FROM (SELECT id FROM {tasks} WHERE %[1]s%[2]s) page`
	sqlWatchedIDs = `SELECT page.id FROM (SELECT task_id AS id FROM {watchers} WHERE %[1]s%[2]s) page`
	// With status or queue filters, a watcher branch reads each task's
	// row beside its watcher row, in the watcher index's order.
	sqlWatchedFilteredIDs = `SELECT page.id FROM (SELECT w.task_id AS id FROM {watchers} w JOIN {tasks} t ON t.id = w.task_id WHERE %[1]s%[2]s) page`

	sqlCreateVersions = `CREATE TABLE IF NOT EXISTS {versions} (version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL DEFAULT '', compatible_from integer)`
	sqlReadVersions   = `SELECT version FROM {versions} WHERE 1 = 0`
	sqlReadChecksum   = `SELECT checksum FROM {versions} WHERE 1 = 0`
	sqlAddChecksum    = `ALTER TABLE {versions} ADD COLUMN checksum text NOT NULL DEFAULT ''`
	sqlReadCompatible = `SELECT compatible_from FROM {versions} WHERE 1 = 0`
	sqlAddCompatible  = `ALTER TABLE {versions} ADD COLUMN compatible_from integer`
	sqlApplied        = `SELECT version, name, checksum, compatible_from FROM {versions} ORDER BY version`
	sqlSetChecksum    = `UPDATE {versions} SET checksum = $2 WHERE version = $1`
	sqlSetCompatible  = `UPDATE {versions} SET compatible_from = $2 WHERE version = $1`
	sqlRecordVersion  = `INSERT INTO {versions} (version, name, checksum, compatible_from) VALUES ($1, $2, $3, $4)`

	// A renewal is one upsert whose expiry the database computes; on
	// conflict, extended records whether the lease it replaces was live.
	sqlRenewLease = `INSERT INTO {leases} AS l (instance, expires_at, extended) VALUES ($1, {expiry}, false)
ON CONFLICT (instance) DO UPDATE SET expires_at = excluded.expires_at, extended = l.expires_at > {now}
RETURNING extended`
	sqlReleaseLease = `DELETE FROM {leases} WHERE instance = $1`
	sqlLiveLeases   = `SELECT instance FROM {leases} WHERE expires_at > {now}`
	// An expired lease counts as none, so deleting it changes nothing.
	sqlPruneLeases = `DELETE FROM {leases} WHERE expires_at <= {now}`

	// The probes read every column of the tables and match no row.
	sqlProbe      = sqlSelect + ` WHERE 1 = 0`
	sqlProbeLease = `SELECT instance, expires_at, extended FROM {leases} WHERE 1 = 0`
)

// Store implements workers.Store on a database/sql handle for one
// Dialect. Every write is one statement, or one transaction whose first
// statement is the conditional write, so several processes may share the
// tables.
type Store struct {
	workers.Authorizers

	d    *Dialect
	cfg  Config
	r, w *sql.DB // reads and writes; the same handle unless the dialect splits them
	q    queries // expanded once by New, read-only after

	// Group commit, where the dialect has the statements for it: nil
	// otherwise, and each write goes alone. Where the dialect has
	// InsertMany, inserts go in batches of their own (inserts), and
	// announce sends their notices.
	writes, inserts *combiner[groupWrite]
	announce        *announcer

	lone  chan struct{} // nil, or a slot per write made alone at once (Config.LoneWrites)
	tries chan struct{} // with lone, the one slot more of the tries alone in the group statement (see tryAlone)
}

// queries is the shared SQL with table names and dialect hooks filled in.
type queries struct {
	get, insert, set, transition, replace, addWatcher, runOf string
	insertWithWatchers, writeMany, insertMany, announce      string
	insertWatchers, dropWatchers, deleteFinished, list       string
	owned, watched, watchedFiltered                          string
	createVersions, readChecksum, addChecksum, applied       string
	readVersions                                             string
	readCompatible, addCompatible, setCompatible             string
	setChecksum, recordVersion                               string
	probes                                                   []string
	renewLease, releaseLease, liveLeases, pruneLeases        string
}

var (
	_ workers.Store  = (*Store)(nil)
	_ workers.Leaser = (*Store)(nil)
)

// New returns a Store over read and write, which may be the same handle.
// The caller keeps ownership of both. New does not touch the database;
// call Migrate to create or update the tables.
func New(d *Dialect, read, write *sql.DB, cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	hooks := strings.NewReplacer("{agg}", d.JSONAgg, "{share}", d.RowShareLock, "{now}", d.Now, "{expiry}", d.Expiry)
	x := func(q string) string { return hooks.Replace(cfg.expand(q)) }
	st := &Store{
		d: d, cfg: cfg, r: read, w: write,
		q: queries{
			writeMany:  x(d.WriteMany),
			insertMany: x(d.InsertMany),
			announce:   x(d.Announce),
			get:        x(sqlGet),
			insert:     x(sqlInsert),
			insertWithWatchers: x(strings.ReplaceAll(d.InsertWithWatchers, "{insert}",
				strings.TrimSuffix(sqlInsert, "\nON CONFLICT (id) DO NOTHING"))),
			set:             x(sqlSet),
			transition:      x(sqlTransition),
			replace:         x(sqlReplace),
			addWatcher:      x(sqlAddWatcher),
			runOf:           x(sqlRunOf),
			insertWatchers:  x(sqlInsertWatchers),
			dropWatchers:    x(sqlDropWatchers),
			deleteFinished:  x(cmp.Or(d.DeleteFinished, sqlDeleteFinished)),
			list:            x(sqlSelect),
			owned:           x(sqlOwnedIDs),
			watched:         x(sqlWatchedIDs),
			watchedFiltered: x(sqlWatchedFilteredIDs),
			createVersions:  x(sqlCreateVersions),
			readVersions:    x(sqlReadVersions),
			readChecksum:    x(sqlReadChecksum),
			addChecksum:     x(sqlAddChecksum),
			applied:         x(sqlApplied),
			setChecksum:     x(sqlSetChecksum),
			readCompatible:  x(sqlReadCompatible),
			addCompatible:   x(sqlAddCompatible),
			setCompatible:   x(sqlSetCompatible),
			recordVersion:   x(sqlRecordVersion),
			probes:          append([]string{x(sqlProbe), x(sqlProbeLease)}, expandAll(x, d.Probes)...),
			renewLease:      x(sqlRenewLease),
			releaseLease:    x(sqlReleaseLease),
			liveLeases:      x(sqlLiveLeases),
			pruneLeases:     x(sqlPruneLeases),
		},
	}
	if cfg.LoneWrites > 0 {
		st.lone = make(chan struct{}, cfg.LoneWrites)
		st.tries = make(chan struct{}, 1)
	}
	if st.q.writeMany != "" {
		st.writes = &combiner[groupWrite]{limit: batchLimit, max: batchMax, spare: batchSpare, stall: batchStall, exec: st.writeMany}
		if st.q.insertMany != "" {
			st.inserts = &combiner[groupWrite]{limit: batchLimit, max: batchMax, spare: batchSpare, stall: batchStall, exec: st.insertMany}
			st.announce = newAnnouncer(st.sendNotices, cmp.Or(cfg.Logger, slog.Default()).With("store", d.Name))
		}
	}
	return st, nil
}

// Stop sends the notices s has yet to announce (see
// Dialect.InsertMany), waiting a second at most, and announces no more:
// the dialect's store calls it as it closes. It is a function, not a
// method, so that it is not promoted to the dialects' stores' API.
func Stop(s *Store) {
	if s.announce != nil {
		s.announce.stop()
	}
}

// expandAll returns each of qs expanded by x.
func expandAll(x func(string) string, qs []string) []string {
	out := make([]string, len(qs))
	for i, q := range qs {
		out[i] = x(q)
	}
	return out
}

// read runs the read fn, again on a lost connection, up to
// Config.ReadAttempts times: a database that restarts or fails over
// leaves every idle connection of the pool dead, each found out only when
// used, and a read can safely be made again. A read that could not
// connect at all (Dialect.ConnectFailed: the database down, or starting
// up) dropped no dead connection, and its next try would connect again
// at once and fail alike: it is made again only after a pause, of
// readPause and then twice as long, while ctx allows, and no more.
func (s *Store) read(ctx context.Context, fn func() error) error {
	pause := readPause
	for i := 1; ; i++ {
		err := fn()
		if err == nil || i >= s.cfg.ReadAttempts || ctx.Err() != nil {
			return err
		}
		connect := s.d.ConnectFailed != nil && s.d.ConnectFailed(err)
		if connect && pause > 2*readPause || !s.lost(err) {
			return err
		}
		if connect {
			if !Sleep(ctx, pause) {
				return ctx.Err()
			}
			pause *= 2
		}
	}
}

// readPause is the first pause of a read that could not connect before
// it is made again (see read): long enough that a database down for a
// moment is not asked again at once, short enough that its three tries
// cost a caller 150 ms of pauses at most.
const readPause = 50 * time.Millisecond

// lost reports whether err says that the connection a statement went on
// was lost (Dialect.ConnLost), not cut because its context ended, and
// then calls Config.Lost. Each statement's error is judged here once: by
// wrap, by read for each try but the last (which its caller wraps), by
// sendNotices, or by RenewLease for its prune, whose error is dropped.
func (s *Store) lost(err error) bool {
	if s.d.ConnLost == nil || !s.d.ConnLost(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if s.cfg.Lost != nil {
		s.cfg.Lost(err)
	}
	return true
}

// GetTask implements workers.Store: one primary-key lookup. An id the
// database cannot hold is not sent (see sendable).
func (s *Store) GetTask(ctx context.Context, id string) (workers.Record, error) {
	if !s.sendable(id) {
		return workers.Record{}, missing(ctx)
	}
	var rec workers.Record
	err := s.read(ctx, func() (err error) {
		rec, err = scanRecord(s.r.QueryRowContext(ctx, s.q.get, id))
		return err
	})
	if errors.Is(err, sql.ErrNoRows) {
		return workers.Record{}, workers.ErrNotFound
	}
	if err != nil {
		return workers.Record{}, s.wrap(ctx, "get task", err)
	}
	return rec, nil
}

// InsertTask implements workers.Store: INSERT ... ON CONFLICT (id) DO
// NOTHING, where no row inserted means ErrConflict. A record with
// watchers is inserted with them in one statement where the dialect has
// Dialect.InsertWithWatchers, and in one transaction otherwise. Where the
// dialect has Dialect.WriteMany, concurrent inserts and transitions go
// together in one statement (see combiner), each insert still made only
// if its id is free; where it has Dialect.InsertMany too, inserts go in
// statements of their own, and are announced after their commit, unless
// the last announcement failed.
func (s *Store) InsertTask(ctx context.Context, rec workers.Record) error {
	if err := s.checkRecord(&rec); err != nil {
		return err
	}
	c := s.inserts
	if c == nil || s.announce.failing.Load() {
		// Without an announcer, or while its statements fail, an insert
		// goes as the other writes do, and notifies from the trigger.
		c = s.writes
	}
	if c != nil {
		_, err := c.do(ctx, rec.ID, groupWrite{insert: &rec})
		return err
	}
	return s.insertOne(ctx, rec)
}

// insertOne inserts one checked record in one statement or transaction.
func (s *Store) insertOne(ctx context.Context, rec workers.Record) error {
	args := s.recordArgs(&rec)
	var owner any
	if o, ok := workers.OwnerOf(rec.ID); ok {
		owner = o.ID()
	}
	args = append(args, owner)
	insert := func(x execer) error {
		n, err := affected(x.ExecContext(ctx, s.q.insert, args...))
		if err != nil {
			return s.wrap(ctx, "insert task", err)
		}
		if n == 0 {
			return workers.ErrConflict
		}
		return s.insertWatchers(ctx, x, rec.ID, s.time(rec.CreatedAt), rec.Watchers)
	}
	if len(rec.Watchers) == 0 {
		return insert(s.w)
	}
	if s.q.insertWithWatchers != "" {
		n, err := affected(s.w.ExecContext(ctx, s.q.insertWithWatchers, append(args, rec.Watchers)...))
		if err != nil {
			return s.wrap(ctx, "insert task", err)
		}
		if n == 0 {
			return workers.ErrConflict
		}
		return nil
	}
	return s.inTx(ctx, func(tx *sql.Tx) error { return insert(tx) })
}

// SetTask implements workers.Store: an UPDATE of the state columns only.
func (s *Store) SetTask(ctx context.Context, rec workers.Record) error {
	if err := s.checkState(&rec.State); err != nil {
		return err
	}
	if !s.sendable(rec.ID) {
		return missing(ctx)
	}
	n, err := affected(s.w.ExecContext(ctx, s.q.set, s.stateArgs(rec.ID, &rec.State)...))
	if err != nil {
		return s.wrap(ctx, "set task", err)
	}
	if n == 0 {
		return workers.ErrNotFound
	}
	return nil
}

// ReplaceTask implements workers.Store: in one transaction, an UPDATE
// conditional on the previous run id, then the new watcher list. When the
// UPDATE matches nothing, a read in the same transaction tells ErrNotFound
// from ErrConflict. A prevRunID the database cannot hold is not sent
// (see sendable): the read alone answers.
func (s *Store) ReplaceTask(ctx context.Context, rec workers.Record, prevRunID string) error {
	if err := s.checkRecord(&rec); err != nil {
		return err
	}
	if !s.sendable(prevRunID) {
		if _, err := s.readRunOf(ctx, rec.ID); err != nil {
			return err
		}
		return workers.ErrConflict
	}
	args := append(s.recordArgs(&rec), prevRunID)
	return s.inTx(ctx, func(tx *sql.Tx) error {
		n, err := affected(tx.ExecContext(ctx, s.q.replace, args...))
		if err != nil {
			return s.wrap(ctx, "replace task", err)
		}
		if n == 0 {
			if _, err := s.runOf(ctx, tx, rec.ID); err != nil {
				return err
			}
			return workers.ErrConflict
		}
		if _, err := tx.ExecContext(ctx, s.q.dropWatchers, rec.ID); err != nil {
			return s.wrap(ctx, "replace task", err)
		}
		return s.insertWatchers(ctx, tx, rec.ID, s.time(rec.CreatedAt), rec.Watchers)
	})
}

// TransitionTask implements workers.Store: one UPDATE conditional on id,
// run id and status. Only when it matches nothing does a second read
// tell a missing record (ErrNotFound) from a fenced-off one (false).
// Where the dialect has Dialect.WriteMany, concurrent transitions and
// inserts go together in one statement (see combiner), each transition
// fenced on its own id, run id and statuses. A status of from that is
// not a known one matches no record, and never reaches the database
// (see knownStatuses); nor does an id or run id the database cannot
// hold (see sendable). next is checked first, as a sent one would be,
// even when nothing is sent.
func (s *Store) TransitionTask(ctx context.Context, id, runID string, from []workers.Status, next workers.State) (bool, error) {
	if runID == "" {
		return false, workers.ErrInvalidRunID
	}
	if err := s.checkState(&next); err != nil {
		return false, err
	}
	if from = knownStatuses(from); len(from) > 0 && s.sendable(runID) && s.sendable(id) {
		row := transitionRow{id: id, runID: runID, from: from, next: next}
		var ok bool
		var err error
		if s.writes != nil {
			ok, err = s.writes.do(ctx, id, groupWrite{transition: &row})
		} else {
			ok, err = s.transitionOne(ctx, row)
		}
		if ok || err != nil {
			return ok, err
		}
	}
	if _, err := s.readRunOf(ctx, id); err != nil {
		return false, err
	}
	return false, nil
}

// transitionOne is one fenced UPDATE of a checked state.
func (s *Store) transitionOne(ctx context.Context, row transitionRow) (bool, error) {
	args := append(s.stateArgs(row.id, &row.next), row.runID)
	q := s.q.transition + " AND status IN " + params(&args, row.from)
	n, err := affected(s.w.ExecContext(ctx, q, args...))
	if err != nil {
		return false, s.wrap(ctx, "transition task", err)
	}
	return n > 0, nil
}

// knownStatuses returns from without the statuses that are not known
// (workers.Status.Valid), which match no record: from itself, with no
// copy, when every status is known. A batch's fence joins its statuses
// with commas (Dialect.WriteMany), which no known status holds, so that
// none is split into others.
func knownStatuses(from []workers.Status) []workers.Status {
	for i, st := range from {
		if st.Valid() {
			continue
		}
		known := slices.Clone(from[:i])
		for _, st := range from[i+1:] {
			if st.Valid() {
				known = append(known, st)
			}
		}
		return known
	}
	return from
}

// AddWatcher implements workers.Store: one INSERT ... SELECT fenced on
// the run id, with ON CONFLICT DO NOTHING for a watcher already present.
// Concurrent appends insert distinct rows, so all of them survive. When
// nothing was inserted, a second read says why. A watcher that
// workers.CheckWatcher refuses is refused before anything is sent, and
// an id or run id the database cannot hold is not sent (see sendable):
// the read alone answers.
func (s *Store) AddWatcher(ctx context.Context, id, runID, watcher string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if runID == "" {
		return false, workers.ErrInvalidRunID
	}
	if err := workers.CheckWatcher(watcher); err != nil {
		return false, fmt.Errorf("%s: %w", s.d.Name, err)
	}
	if s.sendable(runID) && s.sendable(id) {
		n, err := affected(s.w.ExecContext(ctx, s.q.addWatcher, id, runID, watcher))
		if err != nil {
			return false, s.wrap(ctx, "add watcher", err)
		}
		if n > 0 {
			return true, nil
		}
	}
	cur, err := s.readRunOf(ctx, id)
	if err != nil {
		return false, err
	}
	if cur != runID {
		return false, workers.ErrConflict
	}
	return false, nil
}

// ListTasks implements workers.Store. With Filter.VisibleTo set it reads
// only that user's rows, through the owner and watcher indexes. A user or
// queue the database cannot hold (see sendable), which no row holds,
// selects nothing and is not sent, as in the other stores.
func (s *Store) ListTasks(ctx context.Context, f workers.Filter) ([]workers.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if !s.sendable(f.VisibleTo) || !s.sendable(f.Queue) {
		return nil, nil
	}
	q, args := s.listQuery(f)
	var out []workers.Record
	err := s.read(ctx, func() error {
		out = nil
		rows, err := s.r.QueryContext(ctx, q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			rec, err := scanRecord(rows)
			if err != nil {
				return err
			}
			out = append(out, rec)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, s.wrap(ctx, "list tasks", err)
	}
	return out, nil
}

// listQuery builds the SELECT for f and its arguments.
//
// Records sort by (created_at, id), a NULL created_at first (the zero
// time, as workers.CompareRecords sorts it); NewestFirst is the exact
// reverse. A page after a position is a keyset condition, split into
// ranges that each read one index in order: (created_at, id) beyond the
// position, plus the NULL rows where the order reaches them after it. A
// position between two microseconds, which no stored time is at, is
// passed by created_at alone (see ceilMicro), as Filter.Match passes it.
// A user's listing is the union of its owned and watched tasks; each
// (source, range) branch reads at most Limit ids from its index, so a
// page costs in proportion to its size, whatever the user's history. The
// ids the branches find are then held to the position again by their
// task rows, which is what the order is of.
func (s *Store) listQuery(f workers.Filter) (string, []any) {
	var args []any
	desc := f.Order == workers.NewestFirst
	order := func(created, id string) string {
		if desc {
			return " ORDER BY " + created + " DESC" + s.d.NullsLast + ", " + id + " DESC"
		}
		return " ORDER BY " + created + s.d.NullsFirst + ", " + id
	}
	limit := ""
	if f.Limit > 0 {
		limit = " LIMIT " + param(&args, f.Limit)
	}
	// The extra filters, for columns of tasks under the given alias.
	var statuses, queue string
	if len(f.Statuses) > 0 {
		statuses = params(&args, f.Statuses)
	}
	if f.Queue != "" {
		queue = param(&args, f.Queue)
	}
	filters := func(alias string) []string {
		var c []string
		if statuses != "" {
			c = append(c, alias+"status IN "+statuses)
		}
		if queue != "" {
			c = append(c, alias+"queue = "+queue)
		}
		return c
	}
	// The ranges after f.After, each a condition on (created, id).
	ranges := []func(created, id string) string{nil}
	if p := f.After; p != nil {
		cmp := " > "
		if desc {
			cmp = " < "
		}
		switch {
		case p.CreatedAt.IsZero():
			pid := param(&args, p.ID)
			ranges = []func(string, string) string{func(c, i string) string { return c + " IS NULL AND " + i + cmp + pid }}
			if !desc {
				ranges = append(ranges, func(c, _ string) string { return c + " IS NOT NULL" })
			}
		case p.CreatedAt.Nanosecond()%1000 == 0:
			pid := param(&args, p.ID)
			pc := param(&args, s.bound(p.CreatedAt))
			ranges = []func(string, string) string{func(c, i string) string { return "(" + c + ", " + i + ")" + cmp + "(" + pc + ", " + pid + ")" }}
		default:
			// Between two microseconds, where no stored time is, so the
			// id breaks no tie: the records after the position are those
			// stored at the microsecond after it or later (oldest
			// first), or at the one before it or earlier (newest first).
			at, op := ceilMicro(p.CreatedAt), " >= "
			if desc {
				at, op = floorMicro(p.CreatedAt), " <= "
			}
			pc := param(&args, s.bound(at))
			ranges = []func(string, string) string{func(c, _ string) string { return c + op + pc }}
		}
		if desc && !p.CreatedAt.IsZero() {
			ranges = append(ranges, func(c, _ string) string { return c + " IS NULL" })
		}
	}
	where := func(conds []string) string {
		if len(conds) == 0 {
			return ""
		}
		return " WHERE " + strings.Join(conds, " AND ")
	}
	with := func(conds []string, r func(string, string) string, c, i string) []string {
		if r != nil {
			conds = append(conds, r(c, i))
		}
		return conds
	}

	if f.VisibleTo == "" && len(ranges) == 1 {
		// One range of the whole table: read in order from the
		// (created_at, id) index, or from the status index when the
		// statuses select few rows.
		conds := with(filters("t."), ranges[0], "t.created_at", "t.id")
		return s.q.list + where(conds) + order("t.created_at", "t.id") + limit, args
	}
	var branches []string
	branch := func(tmpl string, conds []string, created, id string) {
		if len(conds) == 0 {
			conds = []string{"1 = 1"}
		}
		tail := ""
		if limit != "" {
			tail = order(created, id) + limit
		}
		branches = append(branches, fmt.Sprintf(tmpl, strings.Join(conds, " AND "), tail))
	}
	for _, r := range ranges {
		if f.VisibleTo == "" {
			branch(s.q.owned, with(filters(""), r, "created_at", "id"), "created_at", "id")
			continue
		}
		u := param(&args, f.VisibleTo)
		branch(s.q.owned, with(append([]string{"owner = " + u}, filters("")...), r, "created_at", "id"), "created_at", "id")
		if statuses == "" && queue == "" {
			branch(s.q.watched, with([]string{"user_id = " + u}, r, "created_at", "task_id"), "created_at", "task_id")
		} else {
			branch(s.q.watchedFiltered, with(append([]string{"w.user_id = " + u}, filters("t.")...), r, "w.created_at", "w.task_id"), "w.created_at", "w.task_id")
		}
	}
	// The outer query applies the position again, to the task rows: a
	// watcher branch reads its watcher rows' created_at, which a row an
	// older release wrote may lack, or hold another time than its
	// task's; a task such a row brings is then listed only after the
	// position, so no page repeats one (a walk may still miss it: a
	// branch picks its rows by their own time).
	in := " WHERE t.id IN (" + strings.Join(branches, " UNION ") + ")"
	if f.After != nil {
		after := make([]string, len(ranges))
		for i, r := range ranges {
			after[i] = r("t.created_at", "t.id")
		}
		in += " AND (" + strings.Join(after, " OR ") + ")"
	}
	return s.q.list + in + order("t.created_at", "t.id") + limit, args
}

// DeleteFinished implements workers.Store: DELETEs over the (status,
// completed_at) index of at most deleteBatch records each, until one
// deletes fewer; the watcher rows go with their records (ON DELETE
// CASCADE). A cutoff between two microseconds is rounded up to the
// later: the stored times before it are those before that.
func (s *Store) DeleteFinished(ctx context.Context, cutoff time.Time) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if !cutoff.After(time.Time{}) {
		return 0, nil // nothing completed before the zero time
	}
	deleted := 0
	for {
		n, err := affected(s.w.ExecContext(ctx, s.q.deleteFinished, s.bound(ceilMicro(cutoff)),
			string(workers.StatusCompleted), string(workers.StatusFailed), string(workers.StatusCancelled), deleteBatch))
		if err != nil {
			return deleted, s.wrap(ctx, "delete finished", err)
		}
		deleted += int(n)
		if n < deleteBatch {
			return deleted, nil
		}
	}
}

// deleteBatch is how many records one statement of DeleteFinished
// deletes at most: a cleanup of a long history goes in many short
// transactions, between which other writers get their turn.
const deleteBatch = 1000

// runOf returns the run id stored for id, or ErrNotFound.
func (s *Store) runOf(ctx context.Context, q querier, id string) (string, error) {
	run, err := s.scanRunOf(ctx, q, id)
	return run, s.runOfErr(ctx, err)
}

// readRunOf is runOf outside a transaction, made again on a lost
// connection (see read): the read that says why a write changed nothing.
func (s *Store) readRunOf(ctx context.Context, id string) (run string, err error) {
	if !s.sendable(id) {
		return "", missing(ctx)
	}
	err = s.read(ctx, func() (err error) {
		run, err = s.scanRunOf(ctx, s.r, id)
		return err
	})
	return run, s.runOfErr(ctx, err)
}

// scanRunOf reads id's run id with q; its error is the driver's, for
// read to judge each try by and runOfErr to name once.
func (s *Store) scanRunOf(ctx context.Context, q querier, id string) (string, error) {
	var run string
	err := q.QueryRowContext(ctx, s.q.runOf, id).Scan(&run)
	return run, err
}

// runOfErr is what runOf returns for the error of its read: nil,
// ErrNotFound for no row, or err wrapped.
func (s *Store) runOfErr(ctx context.Context, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, sql.ErrNoRows):
		return workers.ErrNotFound
	}
	return s.wrap(ctx, "read run id", err)
}

// insertWatchers appends watchers to id's list, in order, with the task's
// created_at, in one statement per watcherChunk of them, the caller's
// transaction holding them together; duplicates collapse into the first.
func (s *Store) insertWatchers(ctx context.Context, x execer, id string, created any, watchers []string) error {
	for chunk := range slices.Chunk(watchers, watcherChunk) {
		args := make([]any, 2, 2+len(chunk))
		args[0], args[1] = id, created
		var b strings.Builder
		b.WriteString(s.q.insertWatchers)
		for i, w := range chunk {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString("($1, $2, " + param(&args, w) + ")")
		}
		b.WriteString(" ON CONFLICT DO NOTHING")
		if _, err := x.ExecContext(ctx, b.String(), args...); err != nil {
			return s.wrap(ctx, "insert watchers", err)
		}
	}
	return nil
}

// watcherChunk is the most watchers one statement inserts, each a
// parameter of its own: a record with more is inserted in several, in
// its transaction, since a database bounds a statement's parameters
// (SQLite to 32,766).
const watcherChunk = 1000

// inTx runs fn in a transaction on the write handle, committing if it
// returns nil.
func (s *Store) inTx(ctx context.Context, fn func(*sql.Tx) error) error {
	return s.inTxWith(ctx, nil, fn)
}

// inTxWith is inTx with the transaction's options.
func (s *Store) inTxWith(ctx context.Context, opts *sql.TxOptions, fn func(*sql.Tx) error) error {
	tx, err := s.w.BeginTx(ctx, opts)
	if err != nil {
		return s.wrap(ctx, "begin", err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		if errors.Is(err, sql.ErrTxDone) && ctx.Err() != nil {
			// ctx ended before the commit, and database/sql rolled the
			// transaction back: say so with ctx's error, which callers
			// test for, rather than ErrTxDone.
			err = ctx.Err()
		}
		return s.wrap(ctx, "commit", err)
	}
	return nil
}

// stateArgs returns the arguments $1 to $12: id and the State columns,
// of a state the caller has checked (workers.CheckState).
func (s *Store) stateArgs(id string, st *workers.State) []any {
	var result any
	if len(st.Result) > 0 {
		result = string(st.Result)
	}
	return append(make([]any, 0, 16),
		id, string(st.Status), st.Progress, st.Attempt, result, st.Error,
		s.time(st.StartedAt), s.time(st.CompletedAt),
		string(st.Cause), st.CancelledBy, st.CancelReason, st.Stack)
}

// recordArgs returns the arguments $1 to $15: stateArgs, then the run id,
// queue and creation time.
func (s *Store) recordArgs(rec *workers.Record) []any {
	return append(s.stateArgs(rec.ID, &rec.State), rec.RunID, rec.Queue, s.time(rec.CreatedAt))
}

// time encodes t for the dialect; the zero time is NULL.
// checkRecord is workers.CheckRecord, and checkTimes of rec's times.
func (s *Store) checkRecord(rec *workers.Record) error {
	if err := workers.CheckRecord(*rec); err != nil {
		return err
	}
	return s.checkTimes(rec.CreatedAt, rec.StartedAt, rec.CompletedAt)
}

// checkState is workers.CheckState, and checkTimes of st's times.
func (s *Store) checkState(st *workers.State) error {
	if err := workers.CheckState(*st); err != nil {
		return err
	}
	return s.checkTimes(st.StartedAt, st.CompletedAt)
}

// checkTimes refuses, with workers.ErrInvalidData, a time outside
// Dialect.MinTime and MaxTime.
func (s *Store) checkTimes(times ...time.Time) error {
	if s.d.MaxTime.IsZero() {
		return nil
	}
	for _, t := range times {
		if !t.IsZero() && (t.Before(s.d.MinTime) || t.After(s.d.MaxTime)) {
			return fmt.Errorf("%s: %w: time %v outside the range the store holds", s.d.Name, workers.ErrInvalidData, t)
		}
	}
	return nil
}

func (s *Store) time(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return s.d.Time(t)
}

// ceilMicro and floorMicro round t up and down to the microsecond, the
// precision of the stored times (Dialect.Time keeps a time's
// microsecond): a stored time is before t exactly when it is before
// ceilMicro(t), and after t exactly when it is after floorMicro(t).
// Nanosecond counts from a whole second, so these hold before 1970 too.
func ceilMicro(t time.Time) time.Time {
	if sub := t.Nanosecond() % 1000; sub != 0 {
		return t.Add(time.Duration(1000 - sub))
	}
	return t
}

func floorMicro(t time.Time) time.Time { return t.Add(-time.Duration(t.Nanosecond() % 1000)) }

// bound encodes t, which is not zero, to be compared with stored times:
// as time does, or as Dialect.Before or After for a time outside the
// range the columns hold, which compares the same with every stored time.
func (s *Store) bound(t time.Time) any {
	switch {
	case s.d.MaxTime.IsZero():
	case t.Before(s.d.MinTime):
		return s.d.Before
	case t.After(s.d.MaxTime):
		return s.d.After
	}
	return s.d.Time(t)
}

// wrap names the store and op in err. An error the dialect says the
// database raised for the data itself also wraps workers.ErrInvalidData,
// which the runtime takes as permanent; every other error is transient.
// One that says the connection was refused, lost or cut, or that the
// database refuses writes for now (Dialect.WritesRefused), also wraps
// workers.ErrUnavailable. One that says a table or function of the
// store's own, or a column, is missing (Dialect.Missing) says to call
// Migrate, outside Migrate itself; a table or function of another name
// is the application's, and Migrate would not make it.
func (s *Store) wrap(ctx context.Context, op string, err error) error {
	switch {
	case s.d.DataError != nil && s.d.DataError(err):
		return fmt.Errorf("%s: %s: %w: %w", s.d.Name, op, workers.ErrInvalidData, err)
	case s.d.WritesRefused != nil && s.d.WritesRefused(err), s.lost(err):
		return fmt.Errorf("%s: %s: %w: %w", s.d.Name, op, workers.ErrUnavailable, err)
	case s.missingOwn(err) && !strings.HasPrefix(op, "migrate"):
		if noSchema := s.schemaExists(ctx, s.r, op); errors.Is(noSchema, ErrNoSchema) {
			return fmt.Errorf("%w: %w", noSchema, err)
		}
		return fmt.Errorf("%s: %s: %w (the store's tables are missing or out of date: call Migrate first)", s.d.Name, op, err)
	}
	return fmt.Errorf("%s: %s: %w", s.d.Name, op, err)
}

// schemaExists returns an error wrapping ErrNoSchema, and naming op,
// when the store's Config names a schema that q finds does not exist
// (Dialect.SchemaExists); it returns nil when the schema exists, when
// the store names none, or the dialect cannot tell, and the error of
// the read, as the driver gave it, when it fails: Migrate wraps it as
// any other statement's, and wrap, which asks on another statement's
// failure, keeps that failure's.
func (s *Store) schemaExists(ctx context.Context, q querier, op string) error {
	if s.cfg.Schema == "" || s.d.SchemaExists == "" {
		return nil
	}
	var exists bool
	if err := q.QueryRowContext(ctx, s.d.SchemaExists, s.cfg.Schema).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		return fmt.Errorf("%s: %s: %w %q: create it before Migrate, which does not", s.d.Name, op, ErrNoSchema, s.cfg.Schema)
	}
	return nil
}

// execer and querier are what *sql.DB and *sql.Tx have in common.
type (
	execer interface {
		ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	}
	querier interface {
		QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	}
)

func affected(res sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// missingOwn reports whether err says that a table or function of the
// store's own, or a column, is missing (see Dialect.Missing).
func (s *Store) missingOwn(err error) bool {
	if s.d.Missing == nil {
		return false
	}
	name, ok := s.d.Missing(err)
	return ok && s.cfg.owns(name)
}

// missing is the answer about an id the database cannot hold (see
// sendable): ErrNotFound, or ctx's error if it is done, as a read would
// have found.
func missing(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return workers.ErrNotFound
}

// sendable reports whether an id or run id argument is sent to the
// database: always where it keeps any text (see Dialect.KeepsAnyText),
// so that it matches a row an earlier release stored with it; else only
// if it is storable, since no row holds any other.
func (s *Store) sendable(arg string) bool { return s.d.KeepsAnyText || storable(arg) }

// storable reports whether every store can hold s verbatim, as
// workers.CheckRecord asks of a record's text: valid UTF-8 without NUL
// bytes. A run id argument that is not matches no record, and is never
// sent, since PostgreSQL would refuse it as data.
func storable(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// param appends v to args and returns its placeholder.
func param(args *[]any, v any) string {
	*args = append(*args, v)
	return "$" + strconv.Itoa(len(*args))
}

// params appends the statuses to args and returns "($i, $j, ...)".
func params(args *[]any, statuses []workers.Status) string {
	var b strings.Builder
	b.WriteByte('(')
	for i, st := range statuses {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(param(args, string(st)))
	}
	b.WriteByte(')')
	return b.String()
}

// Channel is the name of the notification channel of s's tables. It is
// a function, not a method, so that it is not promoted to the dialects'
// stores' API.
func Channel(s *Store) string { return s.cfg.Channel() }
