// Package sqlcore is the dialect-neutral half of the SQL stores: the store
// logic, its SQL text, record scanning, error mapping and the migration
// runner. The dialect packages (postgres, sqlite) supply a Dialect, their
// migration files and the database handles, and nothing else.
//
// It works over database/sql and imports no driver. SQL is written once,
// with PostgreSQL-style $n placeholders, which SQLite also accepts.
package sqlcore

import (
	"database/sql"
	"fmt"
	"hash/fnv"
	"io/fs"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/taskgate/workers"
)

// Dialect is everything that differs between two SQL backends.
type Dialect struct {
	// Name prefixes error messages: "postgres" or "sqlite".
	Name string

	// KeepsAnyText is set where the database keeps any Go string
	// verbatim (SQLite): an id or run id argument is then sent whatever
	// its bytes, and matches the row an earlier release stored with
	// them. Where it is not set (PostgreSQL refuses a NUL byte or
	// invalid UTF-8), such an argument, which no row holds, is not sent:
	// a read of the record alone answers.
	KeepsAnyText bool

	// Time encodes a non-zero time as a query argument. Zero times are
	// always written as NULL. Scanning accepts what the driver returns
	// for the column: a time.Time, or integer Unix microseconds.
	Time func(time.Time) any

	// JSONAgg is the aggregate that folds strings into a JSON array,
	// accepting an ORDER BY inside its parentheses: "json_agg" or
	// "json_group_array".
	JSONAgg string

	// RowShareLock is appended to the SELECT that fences AddWatcher on
	// its task row, so that a concurrent ReplaceTask (which updates the
	// row, then drops its watchers) waits for the append or makes it
	// miss: " FOR SHARE" where writers run concurrently, "" where the
	// database has a single writer.
	RowShareLock string

	// InsertWithWatchers, if set, is the single statement that inserts
	// a record and its watchers: $1 to $16 as the record's insert, $17
	// the watcher list as an array, which it inserts in order, each row
	// with the record's creation time ($15) as insertWatchers writes it,
	// and only if the record was inserted. Its affected rows are the watchers
	// inserted, so none means a conflict. It saves a transaction's three
	// round trips where the database is across a network; a dialect
	// without data-modifying WITH clauses leaves it empty, and the insert
	// takes a transaction.
	InsertWithWatchers string

	// Probes, if set, are statements Migrate runs after the column
	// probes, each failing when the schema lacks something else the
	// dialect's statements use (a function WriteMany calls). They read
	// no table and lock none.
	Probes []string

	// WriteMany, if set, is the statement of group commit: it inserts
	// records and transitions others, many rows in one statement, each on
	// its own condition, and returns the id of every row it wrote. Its
	// parameters are arrays, one per column, an element per row: $1 to
	// $16 the records to insert, as the single insert's columns (times
	// as timestamps, NULL for the zero time; the result as text); $17 and
	// $18 their watcher rows' task ids and user ids, in order; $19 the
	// ids to transition, $20 their run ids, $21 the statuses each may
	// move from, comma-separated, and $22 to $32 their State columns. It
	// inserts a record only if its id is free, and its watchers only if
	// it was inserted; it updates a row only if its run id and status
	// match. No id appears twice in one statement. Without it, each
	// write goes alone.
	WriteMany string

	// InsertMany, if set with WriteMany, is group commit's statement for
	// inserts, which then go in batches of their own: $1 to $18 as
	// WriteMany's, it inserts the records whose ids are free, and their
	// watchers, and returns the ids it inserted. It sends no notice of
	// them: the store sends one per row it inserted with Announce, in a
	// statement of its own once the insert has committed. A task's start
	// waits for its insert's commit, and PostgreSQL serializes the
	// commits that send notices.
	InsertMany string

	// Announce sends the notices of rows InsertMany inserted, $1 an
	// array of their ids: a notice for each, as the dialect's trigger
	// builds it, from the row as it is when the notice commits, so that it
	// names no run or status older than a notice sent before it. A row
	// that another transaction holds locked it skips, without waiting,
	// and returns its id, which the store announces again later. An empty
	// id sends an empty notice, which listeners take as "re-read
	// everything".
	Announce string

	// ConnLost, if set, reports whether err says the connection a
	// statement went on was gone: ended by the server (an operator, a
	// restart) or by the network. GetTask and ListTasks try such a read
	// again, on another connection, up to Config.ReadAttempts times.
	ConnLost func(err error) bool

	// ConnectFailed, if set, reports whether err, one ConnLost reports,
	// is a failure to open a connection (the database down, or starting
	// up), which says nothing of the connections the pool holds: a read
	// that failed so is made again only after a pause, twice at most,
	// after readPause and then twice as long (see Store.read).
	ConnectFailed func(err error) bool

	// Refused, if set, reports whether err is the database's answer that
	// a statement failed, so that nothing of it was committed; after any
	// other error (a connection lost on the way) it may have been. Group
	// commit makes each write of a refused batch again alone.
	Refused func(err error) bool

	// NullsFirst and NullsLast follow an ascending and a descending ORDER
	// BY term so that NULL sorts as the least value both ways: empty
	// where the dialect already does so, since SQLite reads an index in
	// order only for an ORDER BY without them.
	NullsFirst, NullsLast string

	// MigrationBegin, if set, is the first statement of the migration
	// transaction, before MigrationLock: it lifts, for the transaction,
	// the limits the role or the connection may set on statements and
	// lock waits for the application's sake (PostgreSQL's
	// statement_timeout and lock_timeout), which would otherwise cut off
	// a wait for a concurrent migration, or for a table, or an index
	// build. Its context still bounds every statement.
	MigrationBegin string

	// MigrationLock, if set, follows MigrationBegin in the migration
	// transaction, run with one int64 argument that names the store's
	// tables; it must block until no other migration of those tables is
	// in progress. A dialect without it must make BeginTx itself
	// exclusive (SQLite's BEGIN IMMEDIATE).
	MigrationLock string

	// MigrationLockWait, if set, runs after MigrationLock: it bounds how
	// long each statement of the migration may wait for a lock on the
	// tables (PostgreSQL's lock_timeout), since the other statements on
	// them queue behind a migration that waits for a table lock. LockBusy
	// reports an error that says such a wait ran out: Migrate then rolls
	// back and tries again, with backoff, until its context ends. A
	// WriteMany batch that fails so (its function bounds its own lock
	// waits) wrote nothing, and each of its writes is made alone.
	MigrationLockWait string
	LockBusy          func(error) bool

	// Deadlock, if set, reports whether err says the database cancelled
	// the statement to break a deadlock it was part of (a migration that
	// alters one table, then waits for another, which a replica's
	// transaction holds while it waits for the first): Migrate then rolls
	// back and tries again, as after LockBusy.
	Deadlock func(error) bool

	// MigrationTx, if set, are the options of the migration transaction.
	// Under MigrationLock it must read what another migration committed
	// while it waited for the lock: PostgreSQL's READ COMMITTED, whatever
	// isolation the database or role makes the default, not a snapshot
	// taken before the wait.
	MigrationTx *sql.TxOptions

	// DataError, if set, reports whether err is the database refusing
	// the data it was given (a value it cannot hold), as opposed to a
	// failure of the connection or the server, which may pass.
	DataError func(err error) bool

	// WritesRefused, if set, reports whether err is the database
	// refusing writes for now, whatever their data, while it may still
	// answer reads: it is read-only (a standby, after a failover) or its
	// storage is full. The same write may succeed once that passes, so
	// the store's error wraps workers.ErrUnavailable; the connection is
	// sound, and is kept.
	WritesRefused func(err error) bool

	// Missing, if set, reports whether err is the database not finding
	// a table, column or function a statement names, and returns the
	// name of that table or function as the error gives it (quoted or
	// qualified, perhaps), or "" when it names none (a column alone).
	// When the name is one of the store's own, or none is given, the
	// tables were not made, or not brought up to date, by Migrate, and
	// the store's error says to call Migrate; another name is the
	// application's (a trigger of its own on the store's tables, say),
	// which Migrate would not make.
	Missing func(err error) (name string, ok bool)

	// SchemaExists, if set, is a query of one row and one boolean column
	// saying whether the schema named by its one parameter exists. With
	// it, a store whose Config names a schema says so when that schema
	// does not exist (ErrNoSchema), where it would otherwise report a
	// missing table, or make Migrate fail on one.
	SchemaExists string

	// DeleteFinished, if set, replaces the shared statement of one batch
	// of DeleteFinished (sqlDeleteFinished), with the same parameters,
	// where the database plans the shared one badly.
	DeleteFinished string

	// MinTime and MaxTime, if set, bound the times the dialect's Time
	// encoding holds, both in the database's columns and on the way
	// there, through the driver: a write of a time outside them is
	// refused with workers.ErrInvalidData, before it is sent, instead of
	// storing another time.
	MinTime, MaxTime time.Time

	// Before and After encode a time before MinTime and one after
	// MaxTime, for comparisons only (a cutoff, a listing's position):
	// each compares beyond every time the columns can hold, so that a
	// far-off time given to a comparison is neither wrapped around nor
	// refused.
	Before, After any

	// Now is the database's clock in the representation of its time
	// columns, and Expiry is Now plus $2 microseconds: lease expiries are
	// computed and compared by these, never by a caller's clock.
	Now, Expiry string

	// Migrations holds the schema as files named migrations/NNNN_name.sql,
	// applied in version order. In their text, {schema} stands for the quoted
	// schema and a dot (or nothing) and {prefix} for the table prefix,
	// so a table is written {schema}"{prefix}tasks".
	Migrations fs.FS

	// CompatibleFrom maps the version of a migration that older code
	// can live with (it only adds what that code never uses: a
	// function, an index) to the oldest version whose code can still use
	// the tables once it is applied; a version not named here needs code
	// that knows it. Migrate records this beside each version, so that a
	// release that finds the database ahead of it (during a rollout, or
	// after a rollback) can tell whether it may go on. A record that
	// names an older version than the dialect does is raised to it, so
	// a release can correct an entry that claimed too much; one that
	// names a newer version is left, so that the releases of a rollout
	// never undo each other's.
	CompatibleFrom map[int]int
}

// Config names a store's tables.
type Config struct {
	// Schema, if set, qualifies every table name. The schema must exist.
	Schema string
	// Prefix begins every table and index name.
	Prefix string
	// ReadAttempts bounds the tries of a read whose connection was lost
	// (Dialect.ConnLost); 0 or 1 tries once. Each lost connection is
	// dropped from the pool, so one more than the pool's connections
	// reaches a new one however many the server ended.
	ReadAttempts int
	// Lost, if set, is called with the error of each statement that
	// found its connection lost (Dialect.ConnLost) other than by its
	// context's end, once per statement. A server that restarts or ends
	// every backend leaves each idle connection of the pool dead, found
	// out only when used: Lost can close them at once, so that the next
	// statement opens a new one instead of failing on the next dead one.
	// It is called from the failing statement's goroutine, concurrently,
	// and must not block.
	Lost func(err error)
	// Logger receives what the store does on its own, off any caller's
	// path (see announcer); nil is slog.Default().
	Logger *slog.Logger
	// LoneWrites, if positive, bounds the writes made alone at once after
	// their batch met a row held elsewhere (see writeGroup), each of
	// which holds a connection while it waits for its row, and, with one
	// more beside them, their tries on their own in the group statement
	// before that (see tryAlone): the rest of the pool stays free for the
	// store's other statements (the lease's renewals among them).
	LoneWrites int
}

// DefaultPrefix is the table prefix of a store configured with none.
const DefaultPrefix = "workers_"

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Validate reports whether c's names are plain SQL identifiers short
// enough that every derived table and index name fits PostgreSQL's
// 63-byte limit. Names are quoted as well, so validation is about
// predictability, not injection alone.
func (c Config) Validate() error {
	if c.Schema != "" && (len(c.Schema) > 63 || !identRE.MatchString(c.Schema)) {
		return fmt.Errorf("%w: sqlstore: schema name %q: want a letter or underscore, then letters, digits or underscores, at most 63 bytes", workers.ErrInvalidOption, c.Schema)
	}
	if c.Prefix != "" && (len(c.Prefix) > 32 || !identRE.MatchString(c.Prefix)) {
		return fmt.Errorf("%w: sqlstore: table prefix %q: want a letter or underscore, then letters, digits or underscores, at most 32 bytes", workers.ErrInvalidOption, c.Prefix)
	}
	return nil
}

// Channel is the name of the store's notification channel: one per set
// of tables, short enough for any schema and prefix.
func (c Config) Channel() string {
	h := fnv.New64a()
	h.Write([]byte(c.Schema + "." + c.Prefix))
	return fmt.Sprintf("workers_changes_%016x", h.Sum64())
}

// ownNames are the tables and functions the migrations make, less the
// prefix.
var ownNames = [...]string{
	"tasks", "watchers", "schema_version", "leases", "changes",
	"notify", "write_many", "insert_many", "announce", "watcher_created",
	"notify_delete",
}

// owns reports whether name, a table or function an error says is
// missing, is one of the store's own: its last part, unquoted, is the
// prefix and one of ownNames. A name with no such part (""), which the
// error did not give, counts as the store's.
func (c Config) owns(name string) bool {
	if name == "" {
		return true
	}
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		name = name[i+1:]
	}
	name = strings.Trim(name, `"`)
	base, ok := strings.CutPrefix(name, c.Prefix)
	return ok && slices.Contains(ownNames[:], base)
}

// expand replaces the {schema} and {prefix} placeholders of the shared
// and migration SQL.
func (c Config) expand(q string) string {
	schema := ""
	if c.Schema != "" {
		schema = `"` + c.Schema + `".`
	}
	return strings.NewReplacer(
		"{tasks}", schema+`"`+c.Prefix+`tasks"`,
		"{watchers}", schema+`"`+c.Prefix+`watchers"`,
		"{versions}", schema+`"`+c.Prefix+`schema_version"`,
		"{leases}", schema+`"`+c.Prefix+`leases"`,
		"{notify_fn}", schema+`"`+c.Prefix+`notify"`,
		"{channel}", c.Channel(),
		"{schema}", schema,
		"{prefix}", c.Prefix,
	).Replace(q)
}
