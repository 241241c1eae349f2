package workers

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Match them with [errors.Is]; the typed errors below wrap
// the matching sentinel, so errors.Is works on them too.
var (
	// ErrNoAuthority is returned by every task API called with a nil
	// TaskAuthority or a zero Owner. A missing identity is never a bypass:
	// use [System] to act unscoped.
	ErrNoAuthority = errors.New("workers: missing task authority")

	// ErrInvalidOwner reports an owner id that NewOwner refuses. The
	// returned error is a *ValidationError.
	ErrInvalidOwner = errors.New("workers: invalid owner id")

	// ErrInvalidKey reports a task key, task id or queue name that is
	// empty, too long, not valid UTF-8, contains control characters, or
	// (for a global-scope key) contains "::". The returned error is a
	// *ValidationError.
	ErrInvalidKey = errors.New("workers: invalid task key")

	// ErrNotFound reports a task that does not exist, or one the caller is
	// not allowed to see: the runtime answers both the same way, so a
	// caller who is not a watcher cannot learn that a task exists. Stores
	// return it for a missing id.
	ErrNotFound = errors.New("workers: task not found")

	// ErrInvalidCursor is returned by Runtime.ListPage for a cursor that is
	// not in the format its pages' cursors have (WithCursor), or that
	// names a time no store holds, or one its store cannot hold.
	ErrInvalidCursor = errors.New("workers: invalid list cursor")

	// ErrConflict is returned by Store.InsertTask when a record with the
	// same id exists, and by Store.ReplaceTask and Store.AddWatcher when
	// the record no longer belongs to the run the caller named. The
	// runtime retries such conflicts, and wraps ErrConflict only when the
	// record kept changing under a submission or cancel.
	ErrConflict = errors.New("workers: task record conflict")

	// ErrUnauthorized is wrapped by every *AuthorizationError.
	ErrUnauthorized = errors.New("workers: not authorized")

	// ErrFinished is returned by Runtime.Cancel for a task that has already
	// reached a terminal status, or that was re-run since Cancel read it.
	ErrFinished = errors.New("workers: task already finished")

	// ErrClosed is returned by submit calls and Runtime.Ready after
	// Runtime.Shutdown has begun, in the manner of http.ErrServerClosed,
	// and ends every Watch and Subscribe stream once Shutdown has ended
	// (returned, or passed its deadline's cutoff).
	ErrClosed = errors.New("workers: runtime closed")

	// ErrSkipped is yielded by a Subscribe stream that passed over
	// changes, and the stream goes on: its consumer fell more than 256
	// tasks behind, or the store's notices, which carry other
	// processes' changes, were interrupted or stood for more changes than
	// they named (a Reset that cleared a MemStore shared by several
	// runtimes, say, yields it on each of them). A task that began and ended
	// in the gap is never yielded; the snapshots that follow are a
	// fresh read of the live tasks. A view that keeps ended tasks reads
	// them again with List. It is the only error after which a stream
	// goes on: a consumer that returns on any error ends its stream
	// there, and may subscribe again.
	ErrSkipped = errors.New("workers: stream skipped changes")

	// ErrInvalidRunID is returned by a store asked for a fenced write with
	// an empty run id. Every fenced write names its run; there is no
	// wildcard.
	ErrInvalidRunID = errors.New("workers: missing run id")

	// ErrStarted is returned by a second call to Runtime.Start.
	ErrStarted = errors.New("workers: runtime already started")

	// ErrInvalidOption reports a submit option or Config value out of
	// range, such as a negative timeout, or a nil context, which every
	// Runtime method that takes one refuses before doing anything.
	ErrInvalidOption = errors.New("workers: invalid option")

	// ErrInvalidConfig is wrapped, beside ErrInvalidOption (ErrInvalidKey
	// for a queue's name), by the error of a runtime built with a Config
	// it cannot run with (see NewRuntime): the fault of whoever built the
	// runtime, not of a caller, which every call that needs the runtime
	// running returns. An HTTP handler answers it as a server error.
	ErrInvalidConfig = errors.New("workers: runtime misconfigured")

	// ErrUnavailable is wrapped by a store's error when the store could
	// not reach its database (a connection refused, lost or cut), or
	// the database refused a write for now, whatever its data: it is
	// read-only (a standby after a failover) or full. The same call may
	// succeed once the database is back, or takes writes again, so an
	// HTTP handler answers it as 503 with a Retry-After.
	ErrUnavailable = errors.New("workers: store unavailable")

	// ErrInvalidData reports a value a store cannot hold: text with a NUL
	// byte or invalid UTF-8, a value its column type refuses. A store
	// wraps its backend's refusal in it, so that the runtime knows that
	// retrying the same write can never succeed (see Store).
	ErrInvalidData = errors.New("workers: invalid data for the store")

	// ErrQuotaExceeded is wrapped by the *QuotaError a submission gets
	// when its owner, or the runtime, may not take on another waiting
	// task (see Limits). Nothing was written to the store.
	ErrQuotaExceeded = errors.New("workers: quota exceeded")

	// ErrResultEncoding is wrapped by the error recorded for a task whose
	// result cannot be encoded as JSON (errors.Is(snap.Err(),
	// ErrResultEncoding) tells it from the callback's own errors), and
	// returned by ResultAs when a stored result cannot be decoded into the
	// requested type.
	ErrResultEncoding = errors.New("workers: result encoding")
)

// Cancellation causes. The context a callback receives is cancelled with
// one of these as its cause ([context.Cause]): ErrCancelled, a
// *TimeoutError, ErrSuperseded or ErrShutdown from its own runtime, or
// ErrAbandoned when that runtime lost its instance lease; or
// ErrCancelled, ErrSuperseded or ErrAbandoned from the store's notices
// or the sync loop (Config.SyncInterval) when another process ended the
// run; or ErrDeleted when its record was found deleted. The first cause to land is the one that sticks and the one
// recorded.
var (
	// ErrCancelled is the cause of a cancellation requested through
	// Runtime.Cancel.
	ErrCancelled = errors.New("workers: cancelled by user")

	// ErrTimeout is matched by the *TimeoutError that ends a run whose
	// timeout expired.
	ErrTimeout = errors.New("workers: task timed out")

	// ErrSuperseded is the cause given to a run still executing when a
	// newer run of the same task id was submitted.
	ErrSuperseded = errors.New("workers: superseded by a newer run")

	// ErrDeleted is the cause given to a run whose record was deleted
	// while the run waited for its turn or executed: by a Reset of a
	// runtime over the same volatile store, by a cleanup of an end
	// written elsewhere, or by hand. No record is left to say how the
	// run ended, and none is written.
	ErrDeleted = errors.New("workers: task record deleted")

	// ErrShutdown is the cause given to every run in flight when
	// Runtime.Shutdown drains.
	ErrShutdown = errors.New("workers: cancelled by worker shutdown")

	// ErrAbandoned is the reason Runtime.RecoverZombies records for a
	// record whose run is no longer alive, the cause a runtime that lost
	// its instance lease gives its runs, and the cause the sync loop
	// gives a run that another process recovered as a zombie.
	ErrAbandoned = errors.New("workers: run abandoned")
)

// ValidationError describes a rejected owner id, task key, task id or
// queue name. It wraps ErrInvalidOwner or ErrInvalidKey.
type ValidationError struct {
	Field  string // "owner", "key", "task id" or "queue"
	Value  string // the rejected value, cut to at most 64 bytes at a rune boundary
	Reason string // why it was rejected
	err    error
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("workers: invalid %s %q: %s", e.Field, e.Value, e.Reason)
}

// Unwrap returns ErrInvalidOwner or ErrInvalidKey.
func (e *ValidationError) Unwrap() error { return e.err }

// AuthorizationError reports a call the caller is not allowed to make: a
// queue authorizer refused a submission, or a caller who is not a watcher
// tried to join or re-run an existing key. It wraps ErrUnauthorized.
//
// Reads and cancels of a task the caller may not see never return an
// AuthorizationError; they return ErrNotFound.
type AuthorizationError struct {
	Op     string // "submit", "queue status" or "stats"
	Queue  string // the queue asked about, for queue refusals
	TaskID string // the task id, for watch refusals
	UserID string // the caller
}

func (e *AuthorizationError) Error() string {
	if e.TaskID == "" && e.Queue == "" {
		return fmt.Sprintf("workers: %s: %q may not read them", e.Op, e.UserID)
	}
	if e.TaskID != "" {
		return fmt.Sprintf("workers: %s: %q may not join task %q", e.Op, e.UserID, e.TaskID)
	}
	return fmt.Sprintf("workers: %s: %q may not use queue %q", e.Op, e.UserID, e.Queue)
}

// Unwrap returns ErrUnauthorized.
func (e *AuthorizationError) Unwrap() error { return ErrUnauthorized }

// TimeoutError is the cause of a run's cancellation when its timeout
// expired; the record says "Timed out after" the timeout, and
// Snapshot.Err returns a *TimeoutError again. It matches ErrTimeout. A
// timed-out run is never retried.
type TimeoutError struct {
	Timeout time.Duration // the timeout that expired
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("workers: task timed out after %v", e.Timeout)
}

// Is reports whether target is ErrTimeout.
func (e *TimeoutError) Is(target error) bool { return target == ErrTimeout }

// PanicError is the error recorded for a callback that panicked. The
// runtime recovers the panic, ends the run FAILED, and keeps working.
type PanicError struct {
	Value any    // the value passed to panic
	Stack []byte // the goroutine's stack when it panicked
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("workers: task panicked: %v", e.Value)
}

// Unwrap returns Value when it is an error, so errors.Is sees through a
// panic(err).
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// QuotaError refuses a submission that would start a new run past a
// limit (see Limits): nothing was written to the store, and a submission
// that joins a live run is never refused. It wraps ErrQuotaExceeded. An
// HTTP service answers it with 429 Too Many Requests and a Retry-After
// of RetryAfter.
type QuotaError struct {
	Owner   string        // the submitting owner's id; "" for System
	Limit   string        // the limit reached: QuotaOwnerWaiting or QuotaRuntimeWaiting
	Max     int           // the limit
	Current int           // how many were waiting when the submission came
	Retry   time.Duration // the retry hint RetryAfter returns
}

// The limits a QuotaError names in its Limit field.
const (
	// QuotaOwnerWaiting is the owner's cap on its tasks waiting
	// (OwnerLimits.Waiting).
	QuotaOwnerWaiting = "owner waiting"
	// QuotaRuntimeWaiting is the runtime's cap on the tasks waiting
	// (Limits.MaxWaiting).
	QuotaRuntimeWaiting = "runtime waiting"
)

func (e *QuotaError) Error() string {
	return fmt.Sprintf("workers: quota exceeded: %s limit %d reached (%d waiting); retry after %v", e.Limit, e.Max, e.Current, e.Retry)
}

// Unwrap returns ErrQuotaExceeded.
func (e *QuotaError) Unwrap() error { return ErrQuotaExceeded }

// RetryAfter is a hint of when a new submission may be admitted: how long
// the tasks waiting ahead should take to drain at the recent pace,
// between one second and five minutes.
func (e *QuotaError) RetryAfter() time.Duration { return e.Retry }

// PermanentError marks a callback's error as final: the run ends FAILED
// at once, with CausePermanent, whatever its retry policy says. Make one
// with Permanent; match it with errors.As. The record's message is the
// wrapped error's text.
type PermanentError struct {
	Err error // the callback's error
}

func (e *PermanentError) Error() string { return e.Err.Error() }

// Unwrap returns the wrapped error.
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err so that the runtime does not retry it: a callback
// that returns Permanent(err), or an error wrapping one, ends its run
// FAILED at once with CausePermanent and err's text, even with attempts
// left (see WithRetry). Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// isPermanent reports whether err is, or wraps, a *PermanentError.
func isPermanent(err error) bool {
	var pe *PermanentError
	return err != nil && errors.As(err, &pe)
}
