// Package postgres is a durable [workers.Store] on PostgreSQL, through
// github.com/jackc/pgx/v5 and its connection pool.
//
// Open a store, migrate it once at startup, and hand it to the runtime:
//
//	s, err := postgres.Open(ctx, "postgres://app@db/app", postgres.WithSchema("jobs"))
//	if err != nil { ... }
//	defer s.Close()
//	if err := s.Migrate(ctx); err != nil { ... }
//	rt := workers.NewRuntime(s, workers.Config{})
//
// # Several processes
//
// Any number of processes may share the tables. Every write is one
// statement, or one transaction whose first statement is the conditional
// write, so nothing is ever read, modified and written back across round
// trips: TransitionTask is a single UPDATE fenced on the id, the run id and
// the status; AddWatcher is a single INSERT ... SELECT that locks the task
// row FOR SHARE and checks its run id, so concurrent appends all land and
// none lands on a newer run; InsertTask is INSERT ... ON CONFLICT DO
// NOTHING; ReplaceTask updates the row only if it still holds the previous
// run id. Migrate takes a transaction-scoped advisory lock, so processes
// may all call it at startup.
//
// # Group commit
//
// Transitions that arrive while one of the store's batch statements is in
// flight wait for it, then go together as the next: one statement (an
// UPDATE ... FROM, each row with its own condition), one round trip and
// one commit for all of them. Inserts do the same apart, in batches of
// their own (an INSERT of the new records and their watchers), which send
// no notice from the trigger: see Notices below. Each caller is told its
// own outcome: inserted or ErrConflict, moved or fenced off. A write
// that finds nothing in flight goes at once, alone, in the batch
// statement, so a lone submission waits for no tick. A batch holds at most one write
// per task id and 256 rows; one batch of each kind is in flight at a
// time, which measured best, since PostgreSQL serializes the commits of
// transactions that notify anyway. A batch still in flight after 20 ms
// (one waiting on a row lock that a transaction elsewhere holds, or on a
// database that stalls) does not hold back the writes queued behind it:
// they go in a batch beside it, and so on each 20 ms, up to four batches
// in flight; no two batches in flight hold the same task id, so a second
// write of a stuck task still waits behind the first; the bound on
// batches in flight keeps a database that stalls from taking more than
// four of the pool's connections for writes. A batch, of one write or
// many, waits at most 100 ms for a row held elsewhere, and a batch the
// database refuses (a value a constraint refuses, say) landed nowhere:
// either way the batch ends, and each of its writes is made again alone,
// as a single-row statement, on a goroutine of its own, under its own
// caller's context, so only the refused one fails, and a held row holds
// back only its own task's writes, however many rows are held. (A write
// of a batch that met a held row is first tried on its own in the batch
// statement, which lands it if its row is free: no more such
// tries go at once than half the pool's connections and one more.) Each
// such write holds a connection of the pool while it waits for its row,
// half the pool's connections at most, the rest waiting for one of them
// to end, until the rows are let go or the callers give up (the
// runtime's own calls, within its Config.StoreTimeout). A batch cut off by a lost connection fails
// every write in it, each of which the runtime then treats as possibly
// landed, as it treats a lone write. The batch statement runs in a
// function of the schema (migration 0006) whose plans are made with
// sequential scans disabled: a batch finds the rows it transitions
// through the primary key however small the table was when the plan it
// reuses was made, so a new deployment's tasks table is never scanned
// whole for every batch while it grows.
//
// A statement whose pooled connection the server ended (a restart,
// pg_terminate_backend, idle_session_timeout: any FATAL error once
// connected) resets the pool (pgxpool.Pool.Reset), at most
// once per 100 ms: the idle connections, dead too after a restart, are
// closed at once, and those in use as they come back, so the next
// statements dial new ones instead of failing one per dead connection
// (the pool pings a connection idle for over a second before lending it,
// but not one used more recently, as on a busy pool). The reset is the
// whole pool's, the one New was given too, even when one backend alone
// was ended; a connection that could not be dialed resets nothing. A
// read (GetTask, ListTasks, LiveInstances) that failed that way is made
// again, so a restart costs no caller an error; a write is not, since it
// may have landed, and the runtime's own handling of a write that failed
// that way applies: its retry, for a registering write, goes to a new
// connection. A read that could not dial a connection at all (the server
// down, or starting up) is made again only after 50 ms, and, in a pool
// of more than one connection, once more after 100 ms, then fails: tried
// at once, it would be refused alike.
//
// Reads (GetTask, ListTasks, LiveInstances, and the read that says why a
// write changed nothing) take the pool's connections less the half kept
// for writes waiting on held rows and one more, one at least, through a
// database/sql handle of their own over the pool: a spike of reads, or
// of slow ones (a service's listings and status reads, a listing
// filtered over a long history), however many at once, and rows held
// elsewhere at the same time, leave a connection to the lease's
// renewals and the runs' other writes, so the replica keeps its lease.
// A read waits for one of the reads' connections, within its own
// context, the runtime's own reads (its recovery's and its sync loop's)
// among them. A pool of one or two connections has none to keep from
// reads; a pool of four leaves them one, of eight three, of sixteen
// seven: a service that reads much wants a larger pool than pgxpool's
// default.
//
// These shares are counted on the pool's MaxConns, as if every
// connection were the store's. A pool that New shares with the
// application's own statements is no different to pgxpool: each
// statement of the store, a lease renewal included, waits its turn for
// a connection, behind the application's, within its own context (the
// runtime's own, within its Config.StoreTimeout). The application's
// handlers that hold connections (long transactions, slow queries, a
// burst of requests) leave the store only the rest: while they hold
// every connection, the store's calls fail with their callers' context
// errors, and the runtime's with its StoreTimeout's, and if that lasts
// LeaseTTL the replica loses its lease and abandons its runs, as when
// the database is out of reach. A transaction of the application's that
// holds a task row locked holds one of those connections too, and the
// store's write of that row holds another while it waits for the lock.
// The shares above are kept only in a pool of the store's own (Open, or
// New over a pool the application does not use): prefer one. A shared
// pool wants at least the application's connections at its peak, its
// transactions that may hold the tables' rows counted twice, and three
// more for the store; even then, rows held elsewhere may have the
// store's writes waiting on them take every connection the application
// leaves. A pool the application closes fails every statement of the
// store at once, with pgxpool's "closed pool" error: close it after the
// runtime's Shutdown and the store's Close.
//
// Each runtime holds a lease in the leases table (workers.Leaser), whose
// expiry the database computes from its own clock, so replicas whose
// clocks disagree still agree on who is alive. A record whose run belongs
// to an instance without a live lease is abandoned: every replica's
// recovery loop ends it, fenced on its run id, and a submission of its key
// starts a new run instead of joining it.
//
// A task's record is the same for every process, so any process's
// runtime answers Status, List and Cancel for a task another process
// runs, with the same authorization: a caller who is not a watcher gets
// workers.ErrNotFound wherever it asks. A cancel from a process that does
// not run the task writes CANCELLED ("Cancelled by user") to the record
// at once, fenced on the run id. The store implements workers.Notifier
// with LISTEN/NOTIFY (see Notices), so the process running the callback
// cancels its context (with workers.ErrCancelled) within milliseconds,
// and Wait in any process returns as soon as the record ends. The
// runtime's sync loop (workers.Config.SyncInterval) remains the fallback
// for a lost notice. Either way the run's own terminal write is fenced
// out and the record stays CANCELLED.
//
// # Notices
//
// A trigger announces every committed change of a task: a trigger rather
// than a NOTIFY sent by each of the store's writes, so that every write
// path notifies, a fix made by hand in SQL included, and the notice
// leaves with the commit of the transaction that made the change, or not
// at all. The one exception is the store's own insert of a new task.
// PostgreSQL serializes the commits of transactions that notify, WAL
// flush included, and a task's start waits for its insert's commit: so
// that it does not wait behind every outcome and cancel that notifies,
// the insert sends no notice, and the store sends it once the insert has
// committed, in a statement of its own that gathers the inserts of the
// moment (migration 0009). That notice names the row as it is when it
// commits, with the row locked meanwhile, so that the notices of a task
// still come in the order of its writes; a row another transaction holds
// locked is skipped, without a wait, and announced again later, so that
// it holds back no other. A process that ends between an
// insert's commit and its notice leaves that notice unsent; Close sends
// the notices still queued, waiting a second at most, and a statement of
// them that fails is tried again with backoff until then; meanwhile, new
// tasks' inserts notify from the trigger, as every other write does, so
// that no insert made after a statement failed waits for one that works.
// (The inserts queued when the statements begin to fail wait for their
// retry; the next write of each such task, its start, notifies as any
// other.)
//
// A delete of a live task row (any status but a terminal one) made by
// hand, an operator's DELETE, sends the task's id alone, with no run and
// no status (migration 0010): a runtime holding a run of it reads the
// record, finds it gone, and ends the run at once with
// workers.ErrDeleted, a run waiting for its turn too, which gives its
// waiting place back. A statement that deletes more than 1,000 live rows
// sends one empty notice instead, as a TRUNCATE does: each listener
// re-reads its runs once, rather than hear of each row. The deletes of
// finished rows send nothing, so that Cleanup, which deletes only those,
// costs the listeners nothing.
//
// # Limits
//
// The store does not implement workers.RecordClearer, so a runtime reset
// never deletes rows. A named schema must exist before Migrate runs,
// which does not create it (ErrNoSchema).
// Every process sharing the tables must spell their schema the same way
// (the same WithSchema, or none and the same search_path): the notice
// channel and the migration lock are named after that spelling, so a
// process that reaches through its search_path the schema another names
// would hear none of its notices (the sync loop would still make up for
// them) and migrate under another lock.
// Listen holds one connection outside the pool for as long as the runtime
// lives. Every task write sends a notice, which PostgreSQL serializes at
// commit (a new task's in a statement after its insert's: see Notices);
// the throughput figures in the bench module include that cost.
//
// # Schema
//
// Three tables, named with the prefix (default "workers_"): tasks, one row
// per task id, with result as json and times as timestamptz (NULL for the
// zero time); watchers, one row per (task, user), deleted with their
// task; and leases, one row per runtime. A status read is one
// primary-key lookup; indexes on tasks(owner, created_at, id),
// tasks(created_at, id) and watchers(user_id, created_at, task_id) read a
// page of a listing in order, in proportion to the page, and one on
// tasks(status, completed_at) lets the recovery and cleanup scans touch
// only the rows they select. A watcher row keeps
// its task's created_at, the order a user's listing reads it in; a
// trigger gives it to a row inserted without one, as a replica of a
// release before schema version 4 inserts them during a rollout.
//
// Results are stored as JSON, as the runtime encodes them, byte for byte
// (\u0000 escapes included, which jsonb would refuse); decode one with
// workers.ResultAs. A write whose result is not valid JSON fails with an
// error wrapping workers.ErrResultEncoding. A value the database refuses
// (SQLSTATE class 22, data exception) fails with an error wrapping
// workers.ErrInvalidData, which the runtime does not retry. A write the
// server refuses whatever its data, because it is read-only (SQLSTATE
// 25006: a standby, after a failover, or default_transaction_read_only)
// or its disk is full (53100), fails with an error wrapping
// workers.ErrUnavailable, as one whose connection was lost does: the
// runtime retries it, and the connection is kept.
package postgres

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/internal/sqlcore"
)

//go:embed migrations/*.sql
var migrations embed.FS

var dialect = &sqlcore.Dialect{
	Name: "sqlstore/postgres",
	Time: func(t time.Time) any { return t.UTC() },
	// The range of timestamptz (4714 BC to 294276 AD), its infinities
	// beyond; it ends earlier, where pgx's encoding of a time in
	// microseconds since 1970 fits an int64, past which the driver
	// would send a time wrapped around, which the server may take.
	MinTime:       time.Date(-4713, time.November, 24, 0, 0, 0, 0, time.UTC),
	MaxTime:       time.UnixMicro(math.MaxInt64).UTC(),
	Before:        "-infinity",
	After:         "infinity",
	JSONAgg:       "json_agg",
	RowShareLock:  " FOR SHARE",
	NullsFirst:    " NULLS FIRST",
	NullsLast:     " NULLS LAST",
	MigrationLock: "SELECT pg_advisory_xact_lock($1)",
	// Run before the advisory lock: a migration's statements run without
	// the statement_timeout and lock_timeout of the role or the
	// connection string, set for the application's statements. The first
	// would fail a replica's start while another migrates, or a
	// migration that waits for a table or builds an index; the second
	// would make a replica that waits for another's migration give up
	// its place, sleep in backoff, and start up to 5 s after that
	// migration ended. PostgreSQL 17's transaction_timeout would end the
	// wait as the first does; it is lifted where the server has it (it
	// cannot be named to an older one). The caller's ctx bounds them.
	MigrationBegin: `SELECT pg_catalog.set_config(name, '0', true) FROM pg_catalog.pg_settings
WHERE name IN ('statement_timeout', 'lock_timeout', 'transaction_timeout')`,
	// Set once the advisory lock is held: a migration that waits for a
	// lock on the tables (DROP INDEX wants the table's exclusive lock)
	// makes every replica's statements on them wait behind it, so it
	// waits a second at most, then lets them go and tries again.
	MigrationLockWait: "SET LOCAL lock_timeout = '1s'",
	LockBusy: func(err error) bool {
		var pe *pgconn.PgError
		return errors.As(err, &pe) && pe.Code == "55P03" // lock_not_available
	},
	// A migration deadlocks with a replica's transaction that writes the
	// tables it alters (a task, then its watcher, as version 4 alters the
	// watchers table, then indexes the tasks table), and the database
	// may cancel the migration to break the cycle.
	Deadlock: func(err error) bool {
		var pe *pgconn.PgError
		return errors.As(err, &pe) && pe.Code == "40P01" // deadlock_detected
	},
	MigrationTx: &sql.TxOptions{Isolation: sql.LevelReadCommitted},
	DataError: func(err error) bool {
		var pe *pgconn.PgError
		return errors.As(err, &pe) && strings.HasPrefix(pe.Code, "22") // data exception
	},
	WritesRefused: writesRefused,
	Missing:       missing,
	SchemaExists:  `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1)`,
	ConnLost:      connLost,
	ConnectFailed: isConnectError,
	// An ERROR (not FATAL: the session goes on) for a statement run
	// outside a transaction means it rolled back; a FATAL one, such as
	// an administrator terminating the backend, may come after the
	// commit. So may an ERROR that says the connection was lost (class
	// 08, 57P01 to 57P03), which a connection pooler between the store
	// and the server sends, as ERROR, when it loses the server's
	// connection, perhaps after the commit.
	Refused: func(err error) bool {
		var pe *pgconn.PgError
		return errors.As(err, &pe) && cmp.Or(pe.SeverityUnlocalized, pe.Severity) == "ERROR" && !connLost(err)
	},
	// Group commit: the rows come as one array per column, to the
	// function of migration 0006, whose statement inserts and transitions
	// them; the inserts and the transitions of one batch are of distinct
	// ids. This release sends it transitions only, its inserts going to
	// InsertMany; the release before sends it both.
	WriteMany: `SELECT id FROM {schema}"{prefix}write_many"($1::text[], $2::text[], $3::bigint[], $4::bigint[],
	$5::text[], $6::text[], $7::timestamptz[], $8::timestamptz[], $9::text[], $10::text[], $11::text[],
	$12::text[], $13::text[], $14::text[], $15::timestamptz[], $16::text[], $17::text[], $18::text[],
	$19::text[], $20::text[], $21::text[], $22::text[], $23::bigint[], $24::bigint[], $25::text[],
	$26::text[], $27::timestamptz[], $28::timestamptz[], $29::text[], $30::text[], $31::text[], $32::text[]) AS w(id)`,
	// Group commit's inserts go apart, to the function of migration 0009,
	// which sends no notice: the store announces the rows it inserted once
	// they have committed (see sqlcore.Dialect.InsertMany).
	InsertMany: `SELECT id FROM {schema}"{prefix}insert_many"($1::text[], $2::text[], $3::bigint[], $4::bigint[],
	$5::text[], $6::text[], $7::timestamptz[], $8::timestamptz[], $9::text[], $10::text[], $11::text[],
	$12::text[], $13::text[], $14::text[], $15::timestamptz[], $16::text[], $17::text[], $18::text[]) AS w(id)`,
	Announce: `SELECT id FROM {schema}"{prefix}announce"($1::text[]) AS a(id)`,
	// The functions of migrations 0006, 0009 and 0010, found in the catalog,
	// which takes no lock on the tables.
	Probes: []string{`SELECT '{schema}"{prefix}write_many"(text[], text[], bigint[], bigint[], text[], text[],
	timestamptz[], timestamptz[], text[], text[], text[], text[], text[], text[], timestamptz[], text[],
	text[], text[], text[], text[], text[], text[], bigint[], bigint[], text[], text[],
	timestamptz[], timestamptz[], text[], text[], text[], text[])'::regprocedure`,
		`SELECT '{schema}"{prefix}insert_many"(text[], text[], bigint[], bigint[], text[], text[],
	timestamptz[], timestamptz[], text[], text[], text[], text[], text[], text[], timestamptz[], text[],
	text[], text[])'::regprocedure`, `SELECT '{schema}"{prefix}announce"(text[])'::regprocedure`,
		// The triggers' functions, which send every write's notice and
		// every delete's.
		`SELECT '{notify_fn}()'::regprocedure`, `SELECT '{schema}"{prefix}notify_delete"()'::regprocedure`},
	Now:        "now()",
	Expiry:     "now() + $2 * interval '1 microsecond'",
	Migrations: migrations,
	// A batch's ids as an array: the shared form, id IN (subquery), is
	// planned as a hash join over a scan of the whole table. The outer
	// WHERE repeats the conditions: a row that another transaction
	// changed while the DELETE waited for its lock is checked again, as
	// it is now, against the outer WHERE alone, and a finished task
	// re-run since must not be deleted.
	DeleteFinished: `DELETE FROM {tasks} WHERE id = ANY(ARRAY(
SELECT id FROM {tasks} WHERE status IN ($2, $3, $4) AND (completed_at < $1 OR completed_at IS NULL) LIMIT $5))
AND status IN ($2, $3, $4) AND (completed_at < $1 OR completed_at IS NULL)`,
	// Version 6 only adds a function, which the code of version 5 never
	// calls; version 7 bounds that function's wait for a lock, which the
	// code of version 6 takes as a refusal of the batch; version 8 gives
	// a watcher row written without a created_at its task's, and the
	// code of version 5 writes it always; version 9 adds a function, and
	// keeps the notices of the statements of every release before it;
	// version 10 adds a trigger whose notices name a task alone, as an
	// added watcher's always have, and which stays silent for the
	// deletes of finished rows that the Cleanup of every release makes.
	CompatibleFrom: map[int]int{6: 5, 7: 5, 8: 5, 9: 5, 10: 5},
	// One statement, one round trip: the record, then its watchers in
	// the order given, only if the record went in; each watcher row
	// carries the record's creation time ($15) for the listing's order.
	InsertWithWatchers: `WITH t AS ({insert}
ON CONFLICT (id) DO NOTHING RETURNING id)
INSERT INTO {watchers} (task_id, created_at, user_id)
SELECT t.id, $15, w.user_id FROM t, unnest($17::text[]) WITH ORDINALITY AS w(user_id, n)
ORDER BY w.n
ON CONFLICT DO NOTHING`,
}

// connLost reports whether err says that the connection a statement went
// on was lost: a backend ended by the server (pg_terminate_backend, a
// shutdown or a restart: SQLSTATE 57P01 to 57P03; or any error of
// severity FATAL or PANIC once connected, which ends the session, such
// as idle_session_timeout's 57P05), a connection exception (class 08),
// or a connection the driver found closed or cut. A FATAL error in
// connecting (a password refused, a database that does not exist) is
// not one: only the server's own unavailability codes count there, and
// its refusal of one connection too many (53300: max_connections, or a
// role's or a database's limit, reached in a storm of connections).
func connLost(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case strings.HasPrefix(pe.Code, "08") || pe.Code == "57P01" || pe.Code == "57P02" || pe.Code == "57P03" ||
			pe.Code == "53300":
			return true
		case isConnectError(err):
			return false
		}
		sev := cmp.Or(pe.SeverityUnlocalized, pe.Severity)
		return sev == "FATAL" || sev == "PANIC"
	}
	var ne *net.OpError
	return pgconn.SafeToRetry(err) || errors.Is(err, driver.ErrBadConn) || errors.Is(err, pgconn.ErrConnClosed) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.As(err, &ne)
}

// writesRefused reports whether err is the server refusing a write for
// now, whatever its data: a read-only transaction, as every one is on a
// standby (a connection that reached one after a failover) or under
// default_transaction_read_only (SQLSTATE 25006), or a full disk
// (53100).
func writesRefused(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "25006" || pe.Code == "53100")
}

// isConnectError reports whether err is a failure to connect, which says
// nothing of the connections a pool holds.
func isConnectError(err error) bool {
	_, ok := errors.AsType[*pgconn.ConnectError](err)
	return ok
}

// resetEvery is how often at most a lost connection resets the pool:
// long enough for the statements in flight when the server ended their
// connections to fail, short enough for the next such event to reset
// the connections dialed since.
const resetEvery = 100 * time.Millisecond

// A resetter resets a pool when a statement finds its connection ended
// by the server (sqlcore.Config.Lost), at most once per resetEvery. A
// reset closes every connection the pool holds, those in use as they come
// back, so the statements in flight when the server ended their
// connections, each failing in turn, need only the first to reset it:
// another would close only connections dialed since. A connection that
// could not be dialed (a pgconn.ConnectError: the server is down, or
// starting up, or its name does not resolve) says nothing of those the
// pool holds, and resets nothing.
type resetter struct {
	reset func()
	log   *slog.Logger // told of each reset, at warn level
	start time.Time    // a monotonic origin for last, one resetEvery before the resetter was made
	last  atomic.Int64 // when the last reset was, as time since start; 0 before the first
}

func newResetter(reset func(), log *slog.Logger) *resetter {
	return &resetter{reset: reset, log: log, start: time.Now().Add(-resetEvery)}
}

func (r *resetter) lost(err error) {
	if isConnectError(err) {
		return
	}
	now := int64(time.Since(r.start))
	last := r.last.Load()
	if now-last < int64(resetEvery) || !r.last.CompareAndSwap(last, now) {
		return
	}
	r.log.Warn("sqlstore/postgres: a connection was lost; the pool's connections are closed, for new ones", "err", err)
	r.reset()
}

// Store is a workers.Store on a PostgreSQL database. It is safe for
// concurrent use, and several processes may share its tables. Besides
// its own methods, it has those of the [workers.Store] and
// [workers.Leaser] interfaces, documented there: GetTask, InsertTask,
// SetTask, ReplaceTask, TransitionTask, AddWatcher, ListTasks,
// DeleteFinished, QueueAuthorizer, SetQueueAuthorizer, WatchAuthorizer,
// SetWatchAuthorizer, RenewLease, ReleaseLease and LiveInstances. Its
// Listen implements [workers.Notifier].
type Store struct {
	*core // the implementation shared with the SQLite store, not API

	pool    *pgxpool.Pool
	db      *sql.DB // database/sql over pool, for writes
	read    *sql.DB // database/sql over pool, for reads: readConns of its connections at most
	ownPool bool    // Close closes pool
	listen  listenTiming
}

var (
	_ workers.Store    = (*Store)(nil)
	_ workers.Leaser   = (*Store)(nil)
	_ workers.Notifier = (*Store)(nil)
)

// core is the implementation Store shares with the SQLite store. An
// alias embeds it under an unexported name, so that its methods are
// promoted and it shows nowhere in Store's API.
type core = sqlcore.Store

// ErrSchemaTooNew is returned by Migrate, wrapped, when the database's
// schema was migrated by a newer release than this one, to a version
// that release did not record as usable by this one's code: Migrate
// changes nothing, and the store should not be used with these tables.
// A newer schema whose every version was recorded as usable by this
// code (one that only adds what it never uses) is accepted, so that a
// rollout's older replicas and a rollback still start.
var ErrSchemaTooNew = sqlcore.ErrSchemaTooNew

// ErrSchemaMismatch is returned by Migrate, wrapped, when the tables do
// not match the migrations recorded as applied to them: a migration file
// edited after it was applied (its line endings aside: a build from a
// checkout with CRLF endings records the same migrations), a recorded
// version this release lacks, or a missing table or column. Migrate
// changes nothing.
var ErrSchemaMismatch = sqlcore.ErrSchemaMismatch

// ErrNoSchema is returned, wrapped, by Migrate and by every other call of
// a store whose schema (WithSchema) does not exist. Migrate does not
// create a schema: whoever administers the database creates it, with
// the privileges the application's role needs in it, and a misspelt
// name is then an error rather than a second set of tables.
var ErrNoSchema = sqlcore.ErrNoSchema

// Option configures a Store.
type Option func(*options)

type options struct {
	sqlcore.Config
	listen listenTiming
}

// WithLogger sets the logger of what the store does on its own, off any
// caller's path: it warns when new tasks cannot be announced (see
// Listen), and says when they are again, and it warns when a lost
// connection resets the pool. Defaults to slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(o *options) { o.Logger = l }
}

// WithSchema places the tables in the named schema, which must exist:
// Migrate does not create it, and it and every other call return an
// error wrapping ErrNoSchema while it does not. The name must be a plain
// identifier (letters, digits, underscores); it is quoted, so it is
// case-sensitive. Defaults to the connection's search_path.
func WithSchema(name string) Option {
	return func(o *options) { o.Schema = name }
}

// WithTablePrefix begins every table and index name with prefix, so that
// several stores can share a schema. It must be empty or a plain
// identifier of at most 32 bytes. Defaults to "workers_".
func WithTablePrefix(prefix string) Option {
	return func(o *options) { o.Prefix = prefix }
}

// New returns a Store over pool. The caller keeps ownership of pool:
// Close does not close it, though a statement of the store that finds its
// connection ended by the server resets it (see the package doc). The
// application may use pool too, but the connections it holds are not the
// store's: see the package doc for how to size a shared pool. New
// does not touch the database; call Migrate.
// An invalid schema name or table prefix is an error wrapping
// workers.ErrInvalidOption.
func New(pool *pgxpool.Pool, opts ...Option) (*Store, error) {
	o := options{Config: sqlcore.Config{Prefix: sqlcore.DefaultPrefix}, listen: defaultListen}
	for _, opt := range opts {
		if opt != nil { // as the runtime's options: a nil one sets nothing
			opt(&o)
		}
	}
	// A statement that finds its connection ended closes the pool's
	// others, dead alike after a restart (see resetter); a read goes
	// again, at most once per connection the pool holds.
	o.ReadAttempts = int(pool.Config().MaxConns) + 1
	// Writes that wait for rows held elsewhere take half the pool at
	// most: the other half serves the store's other statements, the
	// lease's renewals among them.
	o.LoneWrites = loneWrites(pool.Config().MaxConns)
	o.Logger = cmp.Or(o.Logger, slog.Default())
	o.Lost = newResetter(pool.Reset, o.Logger).lost
	db := stdlib.OpenDBFromPool(pool)
	// Reads go through a handle of their own over the same pool, which
	// takes at most what the writes waiting on held rows leave of it,
	// less one: however many reads come at once, and however slow, and
	// however many rows are held, a connection serves the lease's
	// renewals and the runs' other writes, and a read waits for one of
	// its own to end.
	read := stdlib.OpenDBFromPool(pool)
	read.SetMaxOpenConns(readConns(pool.Config().MaxConns))
	core, err := sqlcore.New(dialect, read, db, o.Config)
	if err != nil {
		_ = read.Close()
		_ = db.Close()
		return nil, err
	}
	return &Store{core: core, pool: pool, db: db, read: read, listen: o.listen}, nil
}

// loneWrites is how many of a pool of n connections the writes waiting
// on rows held elsewhere take at most: half, and one at least.
func loneWrites(n int32) int {
	return int(max(1, n/2))
}

// readConns is how many of a pool of n connections reads take at most:
// those the writes waiting on held rows leave (see loneWrites) less one,
// for the lease's renewals and the other writes, and one at least (a
// pool of one or two has none to keep from them).
func readConns(n int32) int {
	return max(1, int(n)-loneWrites(n)-1)
}

// Open connects a pool to the database at connString (a URL or a keyword
// string, as pgxpool.ParseConfig takes it), checks that it answers, and
// returns a Store that owns the pool: Close closes it.
func Open(ctx context.Context, connString string, opts ...Option) (*Store, error) {
	pool, err := pgxpool.New(ctx, connString)
	if err != nil {
		return nil, fmt.Errorf("sqlstore/postgres: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("sqlstore/postgres: %w", err)
	}
	s, err := New(pool, opts...)
	if err != nil {
		pool.Close()
		return nil, err
	}
	s.ownPool = true
	return s, nil
}

// Pool returns the connection pool the store uses.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Close sends the notices of new tasks the store has yet to send (see
// Listen), waiting a second at most, releases the store's handle on the
// pool, and closes the pool if Open created it. It does not wait for a
// runtime using the store: shut that down first.
func (s *Store) Close() error {
	sqlcore.Stop(s.core)
	err := errors.Join(s.read.Close(), s.db.Close())
	if s.ownPool {
		s.pool.Close()
	}
	return err
}

// missing reports whether err is PostgreSQL not finding a table
// (undefined_table), column (undefined_column), function
// (undefined_function) or schema (invalid_schema_name) a statement
// names, and returns the table or function named, as its message gives
// it: a column's table when the message names one, and "" otherwise (a
// schema's message, or one in another language, names none). An
// operator that does not exist, which shares undefined_function's code,
// is not missing in that sense: no migration makes one.
func missing(err error) (name string, ok bool) {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return "", false
	}
	switch pe.Code {
	case "3F000": // schema "name" does not exist, or no schema has been selected to create in
		return "", true
	case "42P01": // relation "name" does not exist
		return quotedAfter(pe.Message, "relation "), true
	case "42703": // column "c" of relation "name" does not exist, or column c does not exist
		return quotedAfter(pe.Message, " of relation "), true
	case "42883": // function name(types) does not exist, or operator does not exist: ...
		if strings.HasPrefix(pe.Message, "operator ") {
			return "", false
		}
		after, _ := strings.CutPrefix(pe.Message, "function ")
		if after == pe.Message {
			return "", true
		}
		name, _, _ = strings.Cut(after, "(")
		return name, true
	}
	return "", false
}

// quotedAfter returns the double-quoted name that follows what in msg,
// without its quotes, or "" if none does.
func quotedAfter(msg, what string) string {
	_, after, found := strings.Cut(msg, what+`"`)
	if !found {
		return ""
	}
	name, _, _ := strings.Cut(after, `"`)
	return name
}

// Migrate creates the store's tables, or brings them up to date, and
// does nothing when they are current: call it before the store's first
// use (before it, a call that finds a table missing fails with an error
// saying to call Migrate). It runs in one transaction under an advisory lock, so that
// processes that start at once (a rolling deploy) apply each version
// once: one that finds another migrating waits for it to end, then
// finds the tables current. Its statements run without the
// statement_timeout, lock_timeout and (PostgreSQL 17)
// transaction_timeout the role or the connection string sets for the
// application's (a wait for another's migration, or an
// index build, may take longer); ctx bounds them. A version that needs
// a lock on the tables which another transaction holds (an older
// replica's, say) waits for it a second at most, since every statement
// on the tables would queue behind it, then rolls back and tries again,
// with backoff up to 5 s, until ctx ends; so does one the database
// cancels to break a deadlock with such a transaction. Tables a newer
// release migrated are used as they are when that release recorded them
// as compatible with this one, and are otherwise refused with
// ErrSchemaTooNew, untouched; tables whose recorded migrations differ
// from this release's are refused with ErrSchemaMismatch. A schema
// named by WithSchema that does not exist is refused with ErrNoSchema:
// Migrate creates tables, never a schema.
func (s *Store) Migrate(ctx context.Context) error { return s.core.Migrate(ctx) }
