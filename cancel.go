package workers

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// reasons is the one table from a cancellation cause to what a run records
// for it. No call site writes its own message: each one renders the cause
// through causeOutcome, so two paths can never record different text for one
// event. A new cause gets a sentinel in errors.go and a row here.
var reasons = [...]struct {
	cause   error
	status  Status
	message string
}{
	{ErrCancelled, StatusCancelled, "Cancelled by user"},
	{ErrTimeout, StatusFailed, "Timed out"},
	{ErrSuperseded, StatusCancelled, "Superseded by a newer run"},
	{ErrShutdown, StatusCancelled, "Cancelled by worker shutdown"},
	{ErrAbandoned, StatusFailed, "Abandoned: no live run (recovered as a zombie)"},
}

// causeOutcome returns the terminal status and message a run records when
// its context was cancelled with cause.
func causeOutcome(cause error) (Status, string) {
	for _, r := range reasons {
		if errors.Is(cause, r.cause) {
			var te *TimeoutError
			if errors.As(cause, &te) {
				return r.status, fmt.Sprintf("%s after %v", r.message, te.Timeout)
			}
			return r.status, r.message
		}
	}
	return StatusCancelled, cause.Error()
}

// causeFromRecord maps a recorded status and message back to the cause
// that produced it, or nil if the message is not one of the table's. A
// timeout comes back as the *TimeoutError it was recorded from.
func causeFromRecord(status Status, message string) error {
	for _, r := range reasons {
		if r.status != status {
			continue
		}
		if message == r.message {
			return r.cause
		}
		if d, ok := strings.CutPrefix(message, r.message+" after "); ok && r.cause == ErrTimeout {
			if timeout, err := time.ParseDuration(d); err == nil {
				return &TimeoutError{Timeout: timeout}
			}
		}
	}
	return nil
}

// TaskError is the error a Snapshot of a FAILED or CANCELLED task reports
// through Snapshot.Err. When the message is one the runtime records for a
// cancellation cause, it unwraps to that cause, so
// errors.Is(snap.Err(), ErrShutdown) tells a deploy from a person's
// cancel.
type TaskError struct {
	ID      string // the task id
	Status  Status // FAILED or CANCELLED
	Message string // the recorded message
	cause   error
}

func (e *TaskError) Error() string {
	return fmt.Sprintf("workers: task %q %s: %s", e.ID, e.Status, e.Message)
}

// Unwrap returns the cancellation cause the message records, or nil.
func (e *TaskError) Unwrap() error { return e.cause }
