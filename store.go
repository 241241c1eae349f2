package workers

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"runtime/debug"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// Status is the lifecycle state of a task record.
type Status string

// The statuses a record moves through. PENDING and RUNNING are live;
// the other three are terminal, and a run never leaves a terminal status
// (only a new run, through Store.ReplaceTask, writes a new PENDING).
const (
	StatusPending   Status = "pending"
	StatusRunning   Status = "running"
	StatusCompleted Status = "completed"
	StatusFailed    Status = "failed"
	StatusCancelled Status = "cancelled"
)

// Terminal reports whether s is COMPLETED, FAILED or CANCELLED.
func (s Status) Terminal() bool {
	return s == StatusCompleted || s == StatusFailed || s == StatusCancelled
}

// Valid reports whether s is one of the five statuses.
func (s Status) Valid() bool {
	return s == StatusPending || s == StatusRunning || s.Terminal()
}

// State is the volatile part of a record: what a run writes as it
// progresses. Store.SetTask and Store.TransitionTask write exactly these
// fields and nothing else.
type State struct {
	Status   Status // the lifecycle state
	Progress int    // 0 to 100
	Attempt  int    // 1 for the first attempt; 0 before the run starts

	// Result is the JSON encoding of the callback's result; nil when the
	// callback returned nil or the run did not complete. Decode it with
	// ResultAs.
	Result json.RawMessage

	// Error is the recorded message of a FAILED or CANCELLED run: the
	// runtime keeps at most the first MaxErrorLen bytes of a longer one,
	// cut at a rune boundary.
	Error string

	StartedAt   time.Time // zero until RUNNING
	CompletedAt time.Time // zero until terminal; set on every terminal record

	// Cause is the code of how the run ended, beside the human message in
	// Error; empty while the record is live. Snapshot.Err reads the
	// code, and the message only for a timeout's duration and for a
	// result that could not be encoded (see Snapshot.Err).
	Cause Cause

	// CancelledBy is who cancelled a CANCELLED-by-user run: the user id of
	// the Owner who called Runtime.Cancel, or "" for System and for every
	// other ending. CancelReason is the reason the canceller gave, if any.
	CancelledBy  string
	CancelReason string

	// Stack is the stack of a callback that panicked, truncated to
	// MaxStackLen bytes; empty otherwise. Runtime reads show it to
	// System only.
	Stack string
}

// Cause is the code a terminal record keeps for how its run ended.
type Cause string

// The causes a run can end with. A store keeps the code verbatim; it need
// not know what each means.
const (
	CauseNone       Cause = ""           // the record is live
	CauseCompleted  Cause = "completed"  // the callback returned a result
	CauseFailed     Cause = "failed"     // the callback failed, with no attempt left
	CausePermanent  Cause = "permanent"  // the callback failed with a permanent error: no retry
	CausePanicked   Cause = "panicked"   // the callback panicked on its last attempt
	CauseTimeout    Cause = "timeout"    // an attempt outlived WithTimeout
	CauseCancelled  Cause = "cancelled"  // Runtime.Cancel
	CauseShutdown   Cause = "shutdown"   // Runtime.Shutdown ended it, or it never started
	CauseSuperseded Cause = "superseded" // a newer run of the same id replaced it
	CauseAbandoned  Cause = "abandoned"  // its runtime died or lost its lease; recovery ended it
	CauseDeleted    Cause = "deleted"    // its record was deleted before it ended; no record keeps this code
	CauseStore      Cause = "store"      // the store refused the run's outcome for good (ErrInvalidData)
)

// MaxStackLen bounds State.Stack: a longer stack keeps at most its
// first MaxStackLen bytes, cut at a rune boundary.
const MaxStackLen = 16 << 10

// MaxErrorLen bounds the message the runtime records in State.Error: a
// callback's longer error keeps at most its first MaxErrorLen bytes, cut
// at a rune boundary so that the message stays valid UTF-8. Every
// status read, listing and event carries the message, so one callback's
// error the size of its input would weigh on them all.
const MaxErrorLen = 16 << 10

// cleanKept is the most of a text that any record keeps (see cleanText).
const cleanKept = max(MaxErrorLen, MaxStackLen)

// Record is what a store holds for one task id. The identity fields (ID,
// RunID, Queue, Watchers, CreatedAt) are written only by InsertTask,
// ReplaceTask and AddWatcher; State is written by SetTask and
// TransitionTask.
type Record struct {
	ID    string // the scoped task id
	RunID string // the run that owns the record now; unique across processes
	Queue string // the sequential queue's name, or "" for the async path

	// Watchers are the user ids allowed to read, list and cancel the task:
	// a set, whose order stores need not keep: a watcher InsertTask or
	// ReplaceTask is given twice is kept once. The owner of a user-scoped
	// id is also allowed, whether listed or not.
	Watchers []string

	CreatedAt time.Time // when the run was submitted

	State
}

// Clone returns a deep copy of r: nothing in the copy aliases r.
func (r Record) Clone() Record {
	r.detach()
	return r
}

// detach replaces r's slices with copies of their own.
func (r *Record) detach() {
	r.Watchers = slices.Clone(r.Watchers)
	if r.Result != nil {
		r.Result = slices.Clone(r.Result)
	}
}

// Filter selects records for Store.ListTasks. Zero fields select
// everything.
type Filter struct {
	// VisibleTo, when set, keeps the records that user id may see: those
	// listing it among their Watchers, and those whose id it owns
	// (OwnerOf(id) is that user).
	VisibleTo string
	// Statuses, when non-empty, keeps records in one of these statuses.
	Statuses []Status
	// Queue, when set, keeps records of that sequential queue.
	Queue string
	// Limit, when positive, returns at most that many records.
	Limit int
	// Order is the order of the result: OldestFirst (the zero value) as
	// CompareRecords orders records, or NewestFirst, its exact reverse.
	Order Order
	// After, when set, keeps the records that come strictly after that
	// position in Order: the next page after a record at After. Its
	// time may be one no store holds (year 300,000, say): it compares
	// with the stored times as any other, and is no error. A time before
	// the zero time is the exception: whether the records without a
	// CreatedAt come after it is the store's (a MemStore's do, as
	// CompareRecords says; the SQL stores' do not, as their order, which
	// puts those records first, says for the rows with such times that
	// releases before these rules could store).
	After *Position
}

// Order is the order ListTasks returns records in.
type Order uint8

// The two orders. Both sort by CreatedAt, then ID; a record without a
// CreatedAt sorts as the oldest.
const (
	OldestFirst Order = iota // ascending, as CompareRecords orders records
	NewestFirst              // descending: the exact reverse
)

// Position is a place in a listing: the CreatedAt and ID of the record a
// page ended at.
type Position struct {
	CreatedAt time.Time // the record's CreatedAt
	ID        string    // the record's ID
}

// PositionOf returns r's position, for Filter.After.
func PositionOf(r *Record) *Position { return &Position{CreatedAt: r.CreatedAt, ID: r.ID} }

// Compare orders a and b as a listing with f's Order returns them.
func (f Filter) Compare(a, b *Record) int {
	if f.Order == NewestFirst {
		return CompareRecords(b, a)
	}
	return CompareRecords(a, b)
}

// Match reports whether r passes f (ignoring Limit): its fields, and
// After. Stores that filter in memory use it; SQL stores must select
// exactly the same records.
func (f Filter) Match(r *Record) bool {
	if f.After != nil && f.Compare(r, &Record{ID: f.After.ID, CreatedAt: f.After.CreatedAt}) <= 0 {
		return false
	}
	if f.VisibleTo != "" && !visibleTo(r.ID, r.Watchers, f.VisibleTo) {
		return false
	}
	if len(f.Statuses) > 0 && !slices.Contains(f.Statuses, r.Status) {
		return false
	}
	if f.Queue != "" && r.Queue != f.Queue {
		return false
	}
	return true
}

// visibleTo is the one read-access rule: a listed watcher, or the owner
// derived from the id.
func visibleTo(id string, watchers []string, userID string) bool {
	if slices.Contains(watchers, userID) {
		return true
	}
	o, ok := OwnerOf(id)
	return ok && o.id == userID
}

// CompareRecords orders records as ListTasks returns them: by CreatedAt,
// then by ID.
func CompareRecords(a, b *Record) int {
	return compareKeys(a.CreatedAt, a.ID, b.CreatedAt, b.ID)
}

// compareKeys orders (created, id) pairs: by creation time, then by id.
func compareKeys(aCreated time.Time, aID string, bCreated time.Time, bID string) int {
	if c := aCreated.Compare(bCreated); c != 0 {
		return c
	}
	return strings.Compare(aID, bID)
}

// QueueAuthorizer decides whether userID may submit into queue. The async
// path asks it with DefaultQueue. It must be a pure, fast predicate: it is
// called on every submission by an Owner (never for System). A panic in it
// denies the submission, and is logged with Config.Logger.
type QueueAuthorizer func(queue, userID string) bool

// WatchAuthorizer decides whether userID may join, or re-run, the existing
// task taskID that it does not already watch. watchers is a copy of the
// record's watcher list.
//
// It runs while the runtime holds the task's lock (a process-local lock per
// task id), so it must be a pure in-memory predicate: no store calls, no
// I/O, nothing that waits on another submission of the same id, or it
// deadlocks. A panic in it denies, and is logged with Config.Logger.
type WatchAuthorizer func(taskID string, watchers []string, userID string) bool

// Store is the durable side of the library: what the record says. It holds
// data and policy, and nothing that runs: no goroutine, no queue, no
// scheduler. Everything that executes lives on Runtime, so a store has no
// teardown to get wrong.
//
// Implementations must be safe for concurrent use by multiple goroutines.
// A store shared by several processes (a SQL database) must make every
// write below a single atomic operation in the database: the runtime never
// builds a read-modify-write out of GetTask and a write, and neither may a
// store. Methods must not retain slices they are passed, and must return
// records that alias nothing the store keeps.
//
// Methods taking a context must honour its cancellation where they block;
// errors from the backend are wrapped, and the sentinels below are
// returned so that callers can match them with errors.Is (a store that
// could not reach its database, or whose database refuses writes for
// now, read-only or full, wraps ErrUnavailable). The package
// storetest checks all of this; run it against any new implementation.
type Store interface {
	// GetTask returns the record stored for id: a durable read, never a
	// cached live object. It returns ErrNotFound if there is none, as
	// every method does for an id holding a NUL byte or invalid UTF-8,
	// which no record holds (see CheckRecord).
	GetTask(ctx context.Context, id string) (Record, error)

	// InsertTask stores a new record. It returns ErrConflict, and writes
	// nothing, if a record with rec.ID exists. It refuses a record that
	// fails CheckRecord with CheckRecord's error (an empty RunID is
	// ErrInvalidRunID).
	InsertTask(ctx context.Context, rec Record) error

	// SetTask writes rec.State to the record rec.ID, unconditionally, once
	// it passes CheckState. It
	// must never write the identity fields: RunID, Watchers, Queue and
	// CreatedAt keep their stored values whatever rec holds, because
	// carrying them on a state write is how concurrent grants and newer
	// runs get clobbered. It returns ErrNotFound if there is no record.
	//
	// SetTask is not fenced, so the runtime never writes a run's outcome
	// with it; it exists for tools that edit records administratively.
	SetTask(ctx context.Context, rec Record) error

	// ReplaceTask writes the whole of rec over the record rec.ID if, and
	// only if, that record's RunID is prevRunID; otherwise it returns
	// ErrConflict and writes nothing (ErrNotFound if there is no record).
	// A prevRunID holding a NUL byte or invalid UTF-8, as no RunID does
	// (see CheckRecord), matches no record, and is no error of its own.
	// Like InsertTask it refuses a record that fails CheckRecord.
	// Its one caller is the re-run of a finished key, which by design
	// resets the watcher list and publishes the new run's id.
	ReplaceTask(ctx context.Context, rec Record, prevRunID string) error

	// TransitionTask writes next to the record id if its RunID is runID
	// and its Status is one of from, as one atomic step, and reports
	// whether it did. A wrong run id or status is not an error: it returns
	// false. A status of from that is not a known one (Status.Valid
	// reports false) matches no record, whatever it spells
	// ("completed,failed" is none of completed and failed). Only next is
	// written, once it passes CheckState, which it must pass even when
	// from is empty and nothing can be written; identity fields never
	// change.
	// runID is required (ErrInvalidRunID): every write of a run's outcome
	// names the run, so a superseded run's late write cannot land; one
	// holding a NUL byte or invalid UTF-8, as no RunID does (see
	// CheckRecord), matches no record. It returns ErrNotFound if there is
	// no record.
	TransitionTask(ctx context.Context, id, runID string, from []Status, next State) (bool, error)

	// AddWatcher appends watcher to the record id's watcher list if its
	// RunID is runID, as one compare-and-set, and reports whether the
	// list changed: appending a watcher already present is a no-op that
	// reports false. Concurrent appends of distinct watchers must all
	// survive. It returns ErrConflict if the record belongs to another
	// run (as it does for a runID holding a NUL byte or invalid UTF-8,
	// which no RunID holds), ErrNotFound if there is none. It refuses a
	// watcher CheckWatcher refuses (one that holds a NUL byte or invalid
	// UTF-8, or is longer than a user id) with its error, as CheckRecord
	// does, before it reads the record. It performs no authorization.
	AddWatcher(ctx context.Context, id, runID, watcher string) (bool, error)

	// ListTasks returns the records f selects, in f.Order (see
	// Filter.Compare), starting after f.After and at most f.Limit of them.
	// An empty result is not an error. A page should cost in proportion
	// to its size, not to the user's history: the runtime pages through a
	// user's tasks with it.
	ListTasks(ctx context.Context, f Filter) ([]Record, error)

	// DeleteFinished deletes terminal records whose CompletedAt is before
	// cutoff (one without a CompletedAt as if at the zero time) and
	// returns how many it deleted. PENDING and RUNNING records are never
	// deleted. A cutoff beyond every time the store holds is no error.
	// With an error, the count is what was deleted before it, which may
	// be 0 even when some were.
	DeleteFinished(ctx context.Context, cutoff time.Time) (int, error)

	// QueueAuthorizer returns the queue authorizer; nil means no queue
	// check.
	QueueAuthorizer() QueueAuthorizer
	// SetQueueAuthorizer replaces the queue authorizer; nil removes it.
	SetQueueAuthorizer(QueueAuthorizer)

	// WatchAuthorizer returns the watch authorizer; nil means every
	// cross-user join is denied.
	WatchAuthorizer() WatchAuthorizer
	// SetWatchAuthorizer replaces the watch authorizer; nil removes it.
	SetWatchAuthorizer(WatchAuthorizer)
}

// RecordClearer is implemented by volatile stores, whose records live no
// longer than the process. Runtime.Reset calls ClearRecords when the store
// implements it; a durable store must not, so a reset can never delete
// durable rows.
type RecordClearer interface {
	// ClearRecords deletes every record. A store that is also a
	// Notifier then sends every listener a Change whose Resync is set,
	// so that a runtime sharing it finds its runs' records gone, and
	// ends those waiting for their turn (ErrDeleted) at once.
	ClearRecords(ctx context.Context) error
}

// Authorizers holds a store's two authorizer slots behind atomic pointers.
// Embed it in a Store implementation to get the four authorizer methods
// with the documented nil semantics; its zero value holds none.
type Authorizers struct {
	queue atomicFunc[QueueAuthorizer]
	watch atomicFunc[WatchAuthorizer]
}

// QueueAuthorizer returns the queue authorizer, or nil.
func (a *Authorizers) QueueAuthorizer() QueueAuthorizer { return a.queue.load() }

// SetQueueAuthorizer replaces the queue authorizer; nil removes it.
func (a *Authorizers) SetQueueAuthorizer(f QueueAuthorizer) { a.queue.store(f) }

// WatchAuthorizer returns the watch authorizer, or nil.
func (a *Authorizers) WatchAuthorizer() WatchAuthorizer { return a.watch.load() }

// SetWatchAuthorizer replaces the watch authorizer; nil removes it.
func (a *Authorizers) SetWatchAuthorizer(f WatchAuthorizer) { a.watch.store(f) }

// allowQueue asks the store's queue authorizer, failing closed on a
// panic, which it logs with its stack.
func allowQueue(s Store, log *slog.Logger, queue, userID string) (ok bool) {
	f := s.QueueAuthorizer()
	if f == nil {
		return true
	}
	defer func() {
		if r := recover(); r != nil {
			ok = false
			log.Error("workers: the queue authorizer panicked; the submission is denied",
				"queue", queue, "user", userID, "panic", r, "stack", string(debug.Stack()))
		}
	}()
	return f(queue, userID)
}

// allowWatch asks the store's watch authorizer, failing closed on nil and
// on a panic, which it logs with its stack.
func allowWatch(s Store, log *slog.Logger, id string, watchers []string, userID string) (ok bool) {
	f := s.WatchAuthorizer()
	if f == nil {
		return false
	}
	defer func() {
		if r := recover(); r != nil {
			ok = false
			log.Error("workers: the watch authorizer panicked; the submission is denied",
				"task", id, "user", userID, "panic", r, "stack", string(debug.Stack()))
		}
	}()
	return f(id, slices.Clone(watchers), userID)
}

// checkRecord reports the first problem with a record about to be
// written, so that every store refuses the same bad input.
func checkRecord(rec *Record) error {
	if err := validateID(rec.ID); err != nil {
		return err
	}
	if rec.RunID == "" {
		return ErrInvalidRunID
	}
	if !storableText(rec.RunID) {
		return fmt.Errorf("%w: RunID holds a NUL byte or invalid UTF-8", ErrInvalidData)
	}
	if !storableText(rec.Queue) {
		return fmt.Errorf("%w: Queue holds a NUL byte or invalid UTF-8", ErrInvalidData)
	}
	for _, w := range rec.Watchers {
		if err := CheckWatcher(w); err != nil {
			return err
		}
	}
	if err := checkDated("CreatedAt", rec.CreatedAt); err != nil {
		return err
	}
	if err := checkState(&rec.State); err != nil {
		return err
	}
	if rec.Status.Terminal() && rec.CompletedAt.IsZero() {
		return fmt.Errorf("%w: %s record without CompletedAt", ErrInvalidOption, rec.Status)
	}
	return nil
}

// CheckWatcher validates a watcher before AddWatcher, or InsertTask and
// ReplaceTask in a record's Watchers, writes it: a watcher is a user id,
// valid UTF-8 without NUL bytes and at most MaxOwnerIDLen bytes long
// (ErrInvalidData: every store holds such a one, in its indexes too).
// Stores call it so that all of them refuse the same watchers.
func CheckWatcher(w string) error {
	if !storableText(w) {
		return fmt.Errorf("%w: a watcher holds a NUL byte or invalid UTF-8", ErrInvalidData)
	}
	if len(w) > MaxOwnerIDLen {
		return fmt.Errorf("%w: a watcher of %d bytes, over the %d of a user id", ErrInvalidData, len(w), MaxOwnerIDLen)
	}
	return nil
}

// checkState reports the first problem with a state about to be written.
func checkState(st *State) error {
	if !st.Status.Valid() {
		return fmt.Errorf("%w: unknown status %q", ErrInvalidOption, st.Status)
	}
	if st.Error != "" || st.CancelledBy != "" || st.CancelReason != "" || st.Stack != "" || (st.Cause != CauseNone && st.Cause != CauseCompleted) {
		if err := checkStateText(st); err != nil {
			return err
		}
	}
	if err := checkDated("StartedAt", st.StartedAt); err != nil {
		return err
	}
	if err := checkDated("CompletedAt", st.CompletedAt); err != nil {
		return err
	}
	if st.Progress < 0 || st.Progress > 100 {
		return fmt.Errorf("%w: progress %d outside 0 to 100", ErrInvalidData, st.Progress)
	}
	if st.Attempt < 0 || st.Attempt > math.MaxInt32 {
		return fmt.Errorf("%w: attempt %d outside 0 to %d", ErrInvalidData, st.Attempt, math.MaxInt32)
	}
	if st.Result != nil {
		return checkResult(st.Result)
	}
	return nil
}

// checkDated refuses, with ErrInvalidData, a time before the zero time:
// the zero time is a record's "undated", which sorts before every stored
// time, and no stored time sorts before it. So it does a time within the
// zero time's first microsecond that is not the zero time: stores keep
// times to the microsecond, where it would read back undated.
func checkDated(field string, t time.Time) error {
	if !t.Before(firstDated) || t.IsZero() {
		return nil
	}
	if t.Before(time.Time{}) {
		return fmt.Errorf("%w: %s %v is before the zero time (year 1)", ErrInvalidData, field, t)
	}
	return fmt.Errorf("%w: %s %v is within the zero time's microsecond, which a store keeps as undated", ErrInvalidData, field, t)
}

// firstDated is the first time a store keeps dated: the zero time's
// next microsecond.
var firstDated = time.Time{}.Add(time.Microsecond)

// maxResultDepth is how deeply a result's arrays and objects may nest:
// the most that every store holds (SQLite's JSON functions refuse more,
// where encoding/json and PostgreSQL accept up to 10000).
const maxResultDepth = 1000

// checkResult reports, wrapping ErrResultEncoding, what would keep some
// store from holding result: JSON that is not valid, not valid UTF-8
// (which encoding/json lets through a json.RawMessage, and PostgreSQL
// refuses), or nested more than maxResultDepth deep.
func checkResult(result []byte) error {
	switch {
	case !json.Valid(result):
		return fmt.Errorf("%w: result is not valid JSON", ErrResultEncoding)
	case !utf8.Valid(result):
		return fmt.Errorf("%w: result is not valid UTF-8", ErrResultEncoding)
	case !shallowJSON(result, maxResultDepth):
		return fmt.Errorf("%w: result nests arrays and objects more than %d deep", ErrResultEncoding, maxResultDepth)
	}
	return nil
}

// shallowJSON reports whether the arrays and objects of b, valid JSON,
// nest at most max deep.
func shallowJSON(b []byte, max int) bool {
	depth, inString := 0, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inString {
			switch c {
			case '\\':
				i++ // the escaped byte
			case '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '[', '{':
			if depth++; depth > max {
				return false
			}
		case ']', '}':
			depth--
		}
	}
	return true
}

// checkStateText is checkState's check of the text fields. A run's
// start and a plain completion, its common writes, have no text but the
// cause CauseCompleted, which is storable, and skip it.
func checkStateText(st *State) error {
	for _, f := range [...]struct{ name, text string }{
		{"Error", st.Error}, {"CancelledBy", st.CancelledBy}, {"CancelReason", st.CancelReason},
		{"Stack", st.Stack}, {"Cause", string(st.Cause)},
	} {
		if !storableText(f.text) {
			return fmt.Errorf("%w: %s holds a NUL byte or invalid UTF-8", ErrInvalidData, f.name)
		}
	}
	return nil
}

// CheckRecord validates a record before InsertTask or ReplaceTask writes
// it: a valid id (ErrInvalidKey), a run id (ErrInvalidRunID), a RunID, a
// Queue that are valid UTF-8 without NUL bytes, as CheckState's text
// fields are, and Watchers that CheckWatcher passes (ErrInvalidData), a
// CreatedAt not before the zero time, nor within its first microsecond
// unless it is the zero time (ErrInvalidData: the zero time itself says
// undated), a state that passes CheckState, and a CompletedAt on a
// terminal record (ErrInvalidOption). Stores call it so that all of them
// refuse the same input with the same errors.
func CheckRecord(rec Record) error { return checkRecord(&rec) }

// CheckState validates a state before SetTask or TransitionTask writes
// it: a known status (ErrInvalidOption), text fields that are valid UTF-8
// without NUL bytes (ErrInvalidData: no store need hold what PostgreSQL's
// text type refuses; the runtime cleans what it writes with the same
// rule), a StartedAt and a CompletedAt not before the zero time, nor
// within its first microsecond unless they are the zero time
// (ErrInvalidData: the zero time itself says undated, and sorts before
// every stored time), a Progress from 0 to 100 and an Attempt from 0 to
// math.MaxInt32 (ErrInvalidData: the runtime writes nothing else, and
// every store can hold them), and a Result that is nil or valid JSON, in
// valid UTF-8, whose arrays and objects nest at most 1000 deep
// (ErrResultEncoding: the most every store holds).
// A Result is stored byte for byte, escapes such as \u0000 included.
func CheckState(st State) error { return checkState(&st) }

// atomicFunc is a function value behind an atomic pointer.
type atomicFunc[F any] struct{ p atomic.Pointer[F] }

func (a *atomicFunc[F]) load() F {
	if p := a.p.Load(); p != nil {
		return *p
	}
	var zero F
	return zero
}

func (a *atomicFunc[F]) store(f F) { a.p.Store(&f) }

// truncateText returns s cut to at most n bytes, at a rune boundary.
func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// storableText reports whether every store can hold s verbatim: valid
// UTF-8 without NUL bytes.
func storableText(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// cleanText is the one rule by which the runtime makes text storable:
// invalid UTF-8 and NUL bytes each become U+FFFD. Storable text is
// returned unchanged, without allocating. Other text is cleaned only as
// far as any record keeps it: each byte cleans to one or more, so the
// first cleanKept bytes of the text make at least the first cleanKept of
// the result, which every caller then cuts to its bound (MaxErrorLen,
// MaxStackLen).
func cleanText(s string) string {
	if storableText(s) {
		return s
	}
	s = s[:min(len(s), cleanKept)]
	var b strings.Builder
	b.Grow(len(s) + 2*utf8.UTFMax)
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		if r == 0 || r == utf8.RuneError && n == 1 {
			b.WriteRune(utf8.RuneError) // one for each byte: a run of them is not one
		} else {
			b.WriteString(s[:n])
		}
		s = s[n:]
	}
	return b.String()
}
