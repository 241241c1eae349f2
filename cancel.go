package workers

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
)

// reasons is the one table from a cancellation cause to what a run records
// for it: its status, its cause code and its message. No call site writes
// its own message: each one renders the cause through causeOutcome, so two
// paths can never record different text for one event. A new cause gets a
// sentinel in errors.go, a Cause code in store.go and a row here.
var reasons = [...]struct {
	cause   error
	status  Status
	code    Cause
	message string
}{
	{ErrCancelled, StatusCancelled, CauseCancelled, "Cancelled by user"},
	{ErrTimeout, StatusFailed, CauseTimeout, "Timed out"},
	{ErrSuperseded, StatusCancelled, CauseSuperseded, "Superseded by a newer run"},
	{ErrShutdown, StatusCancelled, CauseShutdown, "Cancelled by worker shutdown"},
	{ErrAbandoned, StatusFailed, CauseAbandoned, "Abandoned: its run is no longer alive"},
	{ErrDeleted, StatusCancelled, CauseDeleted, "Its record was deleted"},
}

// outcome is what a terminal record says about how its run ended.
type outcome struct {
	status  Status
	code    Cause
	message string
}

// causeOutcome returns what a run records when its context was cancelled
// with cause. A cause outside the table (none is ever given) records
// CANCELLED with its text.
func causeOutcome(cause error) outcome {
	for _, r := range reasons {
		if errors.Is(cause, r.cause) {
			var te *TimeoutError
			if errors.As(cause, &te) {
				return outcome{r.status, r.code, fmt.Sprintf("%s after %v", r.message, te.Timeout)}
			}
			return outcome{r.status, r.code, r.message}
		}
	}
	return outcome{StatusCancelled, CauseCancelled, cleanText(cause.Error())}
}

// endOfStored returns the state of a stored record ended with o at at
// and to be written back (by recovery, or a Cancel of a run this
// runtime does not hold). A StartedAt before the zero time, which a
// record written before CheckState refused one may hold, is written as
// none, so that the end passes CheckState and the record does not stay
// live for good. The record may have been created and started by
// another replica on a clock ahead of this one's: its completion time is
// at, or its start (its creation, unstarted) if that is later, so that
// no record completes before it began.
func endOfStored(rec *Record, o outcome, at time.Time) State {
	st := rec.State
	if st.StartedAt.Before(time.Time{}) {
		st.StartedAt = time.Time{}
	}
	if st.StartedAt.After(at) {
		at = st.StartedAt
	}
	if rec.CreatedAt.After(at) {
		at = rec.CreatedAt
	}
	o.apply(&st, at)
	return st
}

// apply writes o into st, with the completion time.
func (o outcome) apply(st *State, completed time.Time) {
	st.Status, st.Cause, st.Error, st.CompletedAt = o.status, o.code, truncateText(o.message, MaxErrorLen), completed
}

// causeOf maps a record's cause code back to the error it stands for, or
// nil for a code that names no cancellation (completed, failed, …) and for
// a record written before codes were kept. Only a timeout reads the
// message, for the duration the runtime wrote into it.
func causeOf(code Cause, message string) error {
	for _, r := range reasons {
		if r.code != code {
			continue
		}
		if r.cause == ErrTimeout {
			te := &TimeoutError{}
			if d, ok := strings.CutPrefix(message, r.message+" after "); ok {
				te.Timeout, _ = time.ParseDuration(d)
			}
			return te
		}
		return r.cause
	}
	return nil
}

// TaskError is the error a Snapshot of a FAILED or CANCELLED task reports
// through Snapshot.Err. When the record's cause code names a cancellation
// cause, it unwraps to that cause, so
// errors.Is(snap.Err(), ErrShutdown) tells a deploy from a person's
// cancel; a result that could not be encoded unwraps to
// ErrResultEncoding. Match it with errors.As.
type TaskError struct {
	ID      string // the task id
	Status  Status // FAILED or CANCELLED
	Message string // the recorded message
	cause   error
}

func (e *TaskError) Error() string {
	return fmt.Sprintf("workers: task %q %s: %s", e.ID, e.Status, e.Message)
}

// Unwrap returns the cancellation cause the record's code names,
// ErrResultEncoding for a result that could not be encoded, or nil.
func (e *TaskError) Unwrap() error { return e.cause }

// MaxReasonLen bounds a cancel reason, in bytes; WithReason cuts a longer
// one at a rune boundary.
const MaxReasonLen = 256

// CancelOption configures one Runtime.Cancel call.
type CancelOption func(*cancelOptions)

type cancelOptions struct {
	reason string
}

// WithReason records why the task is cancelled. The text is cleaned
// before it is stored: control characters become spaces, runs of space
// collapse, invalid UTF-8 is replaced, and it is cut to MaxReasonLen
// bytes. A reason that cleans to nothing records none.
func WithReason(reason string) CancelOption {
	return func(o *cancelOptions) { o.reason = cleanReason(reason) }
}

// cleanReason makes a free-text reason safe to store and show.
func cleanReason(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			return ' '
		}
		return r
	}, s)
	s = strings.Join(strings.Fields(s), " ")
	return truncateText(s, MaxReasonLen)
}
