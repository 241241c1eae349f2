// Package sqlite is a durable [workers.Store] in a SQLite database file,
// through modernc.org/sqlite (pure Go, no cgo).
//
// Open a store, migrate it once at startup, and hand it to the runtime:
//
//	s, err := sqlite.Open(ctx, "/var/lib/app/tasks.db")
//	if err != nil { ... }
//	defer s.Close()
//	if err := s.Migrate(ctx); err != nil { ... }
//	rt := workers.NewRuntime(s, workers.Config{})
//	if err := rt.Start(ctx); err != nil { ... } // takes the lease, recovers dead runs
//	defer rt.Shutdown(context.Background())
//
// # Limits
//
// SQLite has one writer at a time. The store opens the file in WAL mode,
// so reads never wait for the writer, and gives writes a single
// connection of their own, so this process's writes queue in Go instead
// of contending for the file lock; a write transaction begins IMMEDIATE,
// taking the lock up front. Other processes may open the same file: their
// writes wait for the lock for up to the busy timeout (WithBusyTimeout)
// and then fail. Every write is one statement or one transaction, so
// processes sharing the file never lose each other's updates; they only
// take turns.
//
// The store does not implement workers.RecordClearer, so a runtime reset never
// deletes rows. The database must be a file: ":memory:" would give every
// connection a database of its own. Commits use synchronous=NORMAL: a
// power loss may lose the last commits, never the database.
//
// # Several processes
//
// A task's record is the same for every process that opens the file, so
// any process's runtime answers Status, List and Cancel for a task
// another process runs, with the same authorization: a caller who is not
// a watcher gets workers.ErrNotFound wherever it asks. A cancel from a
// process that does not run the task writes CANCELLED ("Cancelled by
// user") to the record at once, fenced on the run id. The store is a
// workers.Notifier: triggers on the tables record every change, numbered,
// in a changes table, which each process's listener reads every 50 ms
// (WithNoticeInterval; see Store.Listen), even while nothing changes. So the process running the
// callback cancels its context (with workers.ErrCancelled) within about
// that long, and Wait, Watch and Subscribe in other processes follow the
// task through the notices (Wait and Watch read it once a second too, in
// case a notice is lost). The run's terminal write is fenced out and the record stays
// CANCELLED. A running task's progress is stored for other processes to
// read within workers.Config.ProgressInterval (a second by default) of
// its change. The notices cost each write a row in that table (pruned
// every 256 rows), and each process reads its own changes too: in the
// benchmarks they cut the peak submission rate by about 23%. They cannot
// be turned off. Code of schema version 5 keeps working over a file at
// version 6, 7 or 8, without notices.
//
// A delete of a live task row (any status but a terminal one) made by
// another process with SQL, an operator's DELETE, appends a change that
// names the task alone, with no run and no status (schema version 8): a
// runtime holding a run of it reads the record within a notice
// interval, finds it gone, and ends the run with workers.ErrDeleted, a
// run waiting for its turn too, which gives its waiting place back. The
// deletes of finished rows append nothing, so that Cleanup, which
// deletes only those, costs the listeners nothing. Each live row deleted
// appends its own change: a delete of more live rows than the table
// keeps has each listener re-read everything, as any such burst does.
//
// Each runtime holds a lease in the leases table (workers.Leaser), whose
// expiry SQLite's clock computes (unixepoch('subsec'), in the one upsert
// that renews it); processes sharing a file share one host and so one
// clock. A record whose run belongs to an
// instance without a live lease is abandoned: every process's recovery
// loop ends it, fenced on its run id, and a submission of its key starts
// a new run instead of joining it.
//
// # Schema
//
// Four STRICT tables, named with the prefix (default "workers_"): tasks,
// one row per task id, with result as JSON text and times as integer Unix
// microseconds (NULL for the zero time); watchers, one row per (task,
// user), deleted with their task; leases, one row per runtime
// instance, its expiry in Unix microseconds; and changes, the last
// changes numbered for the listeners (at least 4,096 of them, at most
// 4,351), kept so by the triggers that append them. A fifth,
// schema_version, records the migrations applied. A status read is one primary-key
// lookup; indexes on tasks(owner, created_at, id), tasks(created_at, id)
// and watchers(user_id, created_at, task_id) make a listing read its
// page in order, at a cost in proportion to the page, and one on
// tasks(status, completed_at) lets the recovery and cleanup scans touch
// only the rows they select. A watcher row keeps its task's created_at,
// for that order; a trigger gives it to a row inserted without one, as a
// process of a release before schema version 4 inserts them.
//
// Results are stored as JSON, as the runtime encodes them; decode one with
// workers.ResultAs. A write whose result is not valid JSON fails with an
// error wrapping workers.ErrResultEncoding. A write SQLite refuses
// whatever its data, because the file or its disk is full (SQLITE_FULL)
// or it cannot be written (SQLITE_READONLY), fails with an error
// wrapping workers.ErrUnavailable, which the runtime retries.
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"math"
	"net/url"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/internal/sqlcore"
	driver "modernc.org/sqlite" // registers the "sqlite" driver
	sqlite3 "modernc.org/sqlite/lib"
)

//go:embed migrations/*.sql
var migrations embed.FS

var dialect = &sqlcore.Dialect{
	Name:         "sqlstore/sqlite",
	KeepsAnyText: true,
	Time:         func(t time.Time) any { return t.UnixMicro() },
	// The times UnixMicro holds, beyond which it would wrap around, but
	// for the one at each end, which stands for every time beyond.
	MinTime:      time.UnixMicro(math.MinInt64 + 1),
	MaxTime:      time.UnixMicro(math.MaxInt64 - 1),
	Before:       int64(math.MinInt64),
	After:        int64(math.MaxInt64),
	JSONAgg:      "json_group_array",
	RowShareLock: "", // one writer: the INSERT ... SELECT cannot interleave with another write
	Now:          "CAST(unixepoch('subsec') * 1000000 AS INTEGER)",
	Expiry:       "CAST(unixepoch('subsec') * 1000000 AS INTEGER) + $2",
	Migrations:   migrations,
	// Version 6 adds the changes table and its triggers, which keep it
	// bounded by themselves: code that does not listen can use the
	// tables. Version 7 gives a watcher row written without a created_at
	// its task's, and the code of version 5 writes it always. Version 8
	// adds a trigger whose changes name a task alone, as an added
	// watcher's always have, and which appends none for the deletes of
	// finished rows that the Cleanup of every release makes.
	CompatibleFrom: map[int]int{6: 5, 7: 5, 8: 5},
	// The changes table, which every write's trigger appends to and
	// Listen reads: Migrate refuses tables without it.
	Probes: []string{`SELECT seq, task_id, run_id, status FROM "{prefix}changes" WHERE 1 = 0`},
	// No MigrationLock: the write handle begins every transaction
	// IMMEDIATE, which is the lock.
	DataError:     dataError,
	WritesRefused: writesRefused,
	Missing:       missing,
	// A batch deletes the rows it picked by their rowid. Without
	// statistics (nothing runs ANALYZE on the file), SQLite plans the
	// shared statement's DELETE through the status index, testing every
	// finished record against the batch, and its pick through the same
	// index by status alone, reading each status's records completed
	// since the cutoff too: each batch, under the file's write lock,
	// would cost the whole history. The pick is two ranges of that
	// index, the records without a completion time and those completed
	// before the cutoff. The statement runs under that lock from its
	// read to its delete, so the conditions need no second check.
	DeleteFinished: `DELETE FROM {tasks} WHERE rowid IN (
SELECT rowid FROM {tasks} WHERE status IN ($2, $3, $4) AND completed_at IS NULL
UNION ALL
SELECT rowid FROM {tasks} WHERE status IN ($2, $3, $4) AND completed_at < $1
LIMIT $5)`,
}

// dataError reports whether err is SQLite's refusal of the data itself:
// a string or blob longer than it holds (SQLITE_TOOBIG; a result over a
// billion bytes, by default), or a value of a type a column refuses
// (SQLITE_MISMATCH). Trying the same write again would fail the same way.
func dataError(err error) bool {
	return primaryCodeIn(err, sqlite3.SQLITE_TOOBIG, sqlite3.SQLITE_MISMATCH)
}

// writesRefused reports whether err is SQLite refusing a write for now,
// whatever its data: the file, or its disk, is full (SQLITE_FULL), or
// it cannot be written (SQLITE_READONLY: its file, directory or mount
// went read-only).
func writesRefused(err error) bool {
	return primaryCodeIn(err, sqlite3.SQLITE_FULL, sqlite3.SQLITE_READONLY)
}

// missing reports whether err is SQLite not finding a table, column or
// function a statement names, and returns the table or function named
// ("" for a column named alone; the table, for an insert's column the
// table lacks): SQLite says so only in its message, under the generic
// SQLITE_ERROR code.
func missing(err error) (name string, ok bool) {
	if !primaryCodeIn(err, sqlite3.SQLITE_ERROR) {
		return "", false
	}
	msg := err.Error()
	for _, what := range []string{"no such table: ", "no such function: "} {
		if _, after, found := strings.Cut(msg, what); found {
			name, _, _ = strings.Cut(after, " ")
			return name, true
		}
	}
	if before, _, found := strings.Cut(msg, " has no column named "); found {
		// "table T has no column named C": an insert's column, which T,
		// made by an older release, lacks.
		if i := strings.LastIndex(before, "table "); i >= 0 {
			return before[i+len("table "):], true
		}
	}
	return "", strings.Contains(msg, "no such column")
}

// primaryCodeIn reports whether err is a SQLite error whose primary
// code (that of an extended one) is one of codes.
func primaryCodeIn(err error, codes ...int) bool {
	se, ok := errors.AsType[*driver.Error](err)
	return ok && slices.Contains(codes, se.Code()&0xff)
}

// Store is a workers.Store in a SQLite database file. It is safe for
// concurrent use. Besides its own methods, it has
// those of the [workers.Store] and [workers.Leaser] interfaces,
// documented there: GetTask, InsertTask, SetTask, ReplaceTask,
// TransitionTask, AddWatcher, ListTasks, DeleteFinished,
// QueueAuthorizer, SetQueueAuthorizer, WatchAuthorizer,
// SetWatchAuthorizer, RenewLease, ReleaseLease and LiveInstances. Its
// Listen implements [workers.Notifier].
type Store struct {
	*core // the implementation shared with the PostgreSQL store, not API

	read  *sql.DB // query-only connections, one per core or more
	write *sql.DB // exactly one connection

	notices     time.Duration // how often Listen reads the changes table
	lastChange  string        // Listen's query of the last change
	changesFrom string        // Listen's query of the changes from a seq on
}

var (
	_ workers.Store    = (*Store)(nil)
	_ workers.Leaser   = (*Store)(nil)
	_ workers.Notifier = (*Store)(nil)
)

// core is the implementation Store shares with the PostgreSQL store. An
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

// Option configures a Store.
type Option func(*options)

type options struct {
	sqlcore.Config
	busyTimeout time.Duration
	notices     time.Duration
}

// WithTablePrefix begins every table and index name with prefix, so that
// several stores can share a database file. It must be empty or a plain
// identifier of at most 32 bytes, in lower case: SQLite's names ignore
// case, so "A_" and "a_" would name the same tables. It must not begin
// with "sqlite_", which SQLite keeps for its own tables. Defaults to
// "workers_".
func WithTablePrefix(prefix string) Option {
	return func(o *options) { o.Prefix = prefix }
}

// WithBusyTimeout sets how long a statement waits for another process's
// lock on the file before it fails. Defaults to 5 seconds. SQLite counts
// it in whole milliseconds, up to about 24.8 days (2^31-1 ms): a timeout
// under a millisecond waits one, and a longer one that long. Zero waits
// not at all: a statement that meets another process's lock fails at
// once (SQLITE_BUSY).
func WithBusyTimeout(d time.Duration) Option {
	return func(o *options) { o.busyTimeout = d }
}

// WithNoticeInterval sets how often Listen reads the changes table,
// which holds the changes of every process over the file, this one's
// included (see Store.Listen): a change reaches a runtime over the store
// within about this long. Defaults to DefaultNoticeInterval (50 ms); it
// must be positive.
func WithNoticeInterval(d time.Duration) Option {
	return func(o *options) { o.notices = d }
}

// busyMillis is d as SQLite's busy_timeout takes it, a count of
// milliseconds in an int32: rounded up, and capped, for a value past it
// would read as no wait at all.
func busyMillis(d time.Duration) int64 {
	ms := d.Milliseconds()
	if d%time.Millisecond > 0 {
		ms++
	}
	return min(ms, math.MaxInt32)
}

// Open opens, or creates, the database file at path and returns a Store
// on it. path is a file name, not a URI. Call Migrate before using the
// store, and Close when done. An invalid option (a table prefix that is
// not a lower-case identifier, or begins with "sqlite_", a negative busy
// timeout, a notice interval that is not positive) is an error wrapping
// workers.ErrInvalidOption.
func Open(ctx context.Context, path string, opts ...Option) (*Store, error) {
	o := options{Config: sqlcore.Config{Prefix: sqlcore.DefaultPrefix}, busyTimeout: 5 * time.Second, notices: DefaultNoticeInterval}
	for _, opt := range opts {
		if opt != nil { // as the runtime's options: a nil one sets nothing
			opt(&o)
		}
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if strings.ToLower(o.Prefix) != o.Prefix {
		// SQLite's names ignore case, quoted or not: "A_" would name the
		// tables of "a_", another store's.
		return nil, fmt.Errorf("%w: sqlstore/sqlite: table prefix %q: SQLite's table names ignore case, so a prefix must be lower case", workers.ErrInvalidOption, o.Prefix)
	}
	if strings.HasPrefix(o.Prefix, "sqlite_") {
		return nil, fmt.Errorf("%w: sqlstore/sqlite: table prefix %q: SQLite keeps the names that begin with sqlite_ for its own tables", workers.ErrInvalidOption, o.Prefix)
	}
	if path == "" || path == ":memory:" || strings.HasPrefix(path, "file:") || strings.Contains(path, "?") {
		return nil, fmt.Errorf("sqlstore/sqlite: %q is not a database file name", path)
	}
	if o.busyTimeout < 0 {
		return nil, fmt.Errorf("%w: sqlstore/sqlite: negative busy timeout %v", workers.ErrInvalidOption, o.busyTimeout)
	}
	if o.notices <= 0 {
		return nil, fmt.Errorf("%w: sqlstore/sqlite: notice interval %v is not positive", workers.ErrInvalidOption, o.notices)
	}
	busy := strconv.FormatInt(busyMillis(o.busyTimeout), 10)

	// The writer comes first: it creates the file and switches it to WAL.
	// The switch is a statement under ctx, not a parameter of the
	// connection: a connection's parameters are applied as it is made,
	// deaf to ctx, and the switch of a file another connection reads
	// waits for it, up to the whole busy timeout. WAL is the file's mode
	// once set, so a connection made later needs no switch.
	write, err := open(ctx, path, 1, url.Values{
		"_busy_timeout": {busy},
		"_synchronous":  {"NORMAL"},
		"_foreign_keys": {"1"},
		"_txlock":       {"immediate"},
	})
	if err != nil {
		return nil, err
	}
	if err := switchToWAL(ctx, write, o.busyTimeout); err != nil {
		return nil, errors.Join(fmt.Errorf("sqlstore/sqlite: journal mode: %w", err), write.Close())
	}
	read, err := open(ctx, path, max(4, runtime.GOMAXPROCS(0)), url.Values{
		"_busy_timeout": {busy},
		"_query_only":   {"1"},
	})
	if err != nil {
		return nil, errors.Join(err, write.Close())
	}
	core, err := sqlcore.New(dialect, read, write, o.Config)
	if err != nil {
		return nil, errors.Join(err, read.Close(), write.Close())
	}
	changes := `"` + o.Prefix + `changes"`
	return &Store{
		core: core, read: read, write: write,
		notices:     o.notices,
		lastChange:  `SELECT seq, task_id, run_id, status FROM ` + changes + ` ORDER BY seq DESC LIMIT 1`,
		changesFrom: `SELECT seq, task_id, run_id, status FROM ` + changes + ` WHERE seq >= $1 ORDER BY seq LIMIT $2`,
	}, nil
}

// switchToWAL sets the file's journal mode to WAL. The switch reads the
// file, then takes its write lock: SQLite fails it at once with
// SQLITE_BUSY, without calling the busy handler, when another
// connection holds the write lock meanwhile (another process switching
// the same new file, or writing to it), since waiting while holding the
// read lock could deadlock. So the switch is tried again, the read lock
// let go between tries, for up to the busy timeout, as any other
// statement would wait.
func switchToWAL(ctx context.Context, db *sql.DB, busy time.Duration) error {
	deadline := time.Now().Add(busy)
	wait := time.Millisecond
	for {
		var mode string
		err := db.QueryRowContext(ctx, "PRAGMA journal_mode = WAL").Scan(&mode)
		se, ok := errors.AsType[*driver.Error](err)
		if err == nil || !ok || se.Code()&0xff != sqlite3.SQLITE_BUSY || !time.Now().Add(wait).Before(deadline) {
			return err
		}
		if !sqlcore.Sleep(ctx, wait) {
			return errors.Join(ctx.Err(), err)
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// open returns a handle of at most n connections to path, configured by
// the driver parameters params, that has answered.
func open(ctx context.Context, path string, n int, params url.Values) (*sql.DB, error) {
	db, err := sql.Open("sqlite", path+"?"+params.Encode())
	if err != nil {
		return nil, fmt.Errorf("sqlstore/sqlite: %w", err)
	}
	db.SetMaxOpenConns(n)
	db.SetMaxIdleConns(n)
	if err := db.PingContext(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("sqlstore/sqlite: open %s: %w", path, err), db.Close())
	}
	return db, nil
}

// Close closes the database. It does not wait for a runtime using the
// store: shut that down first.
func (s *Store) Close() error {
	return errors.Join(s.read.Close(), s.write.Close())
}

// Migrate creates the store's tables, or brings them up to date, and
// does nothing when they are current: call it before the store's first
// use (before it, a call that finds a table missing fails with an error
// saying to call Migrate). It runs in one transaction under the file's write lock, so that processes
// that start at once (a rolling deploy) apply each version once. Tables
// a newer release migrated are used as they are when that release
// recorded them as compatible with this one, and are otherwise refused
// with ErrSchemaTooNew, untouched; tables whose recorded migrations
// differ from this release's are refused with ErrSchemaMismatch.
func (s *Store) Migrate(ctx context.Context) error { return s.core.Migrate(ctx) }
