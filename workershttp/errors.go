package workershttp

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/taskgate/workers"
)

// ErrBadRequest is wrapped by the errors the handler answers for a
// malformed request its own checks refuse: an unknown status filter, a
// bad limit, a cancel body that is not JSON, an event stream's request
// with a body. An application's route wraps it around its own input
// errors. WriteError answers it 400 with the code "invalid_input", the
// code of every malformed input of the caller's, the runtime's refusals
// (a bad key, owner id, option or cursor) included.
var ErrBadRequest = errors.New("workershttp: bad request")

// ErrUnauthenticated is the error written when the authenticate function
// fails: the request carries no identity the application accepts. An
// application's own route (a submission route, say) that authenticates
// its request wraps the failure with it,
//
//	WriteError(w, fmt.Errorf("%w: %w", workershttp.ErrUnauthenticated, err))
//
// so that it is answered 401, as Handler's routes answer, without its
// text: WriteError cannot tell an authentication failure from any other
// error, and writes one passed as it is by its own kind (an invalid
// owner id is 400, an unknown error 500).
var ErrUnauthenticated = errors.New("workershttp: unauthenticated")

// ErrTooManyStreams is the error written, as 429 Too Many Requests with
// a Retry-After, when an identity asks for an event stream with as many
// open as WithStreamLimit allows.
var ErrTooManyStreams = errors.New("workershttp: too many event streams open for this identity")

// retryAfterer is implemented by errors that know when a refused call may
// be tried again, such as a quota refusal.
type retryAfterer interface{ RetryAfter() time.Duration }

// statuses is the one table from an error to an HTTP status, a stable
// code, and what a client is told. The first row that matches wins. One
// kind of mistake has one code, whichever check found it: every
// malformed input of the caller's is "invalid_input".
var statuses = []struct {
	err     error
	status  int
	code    string
	message string // for a 4xx, what a client is told besides the code
}{
	// A runtime's Config error wraps ErrInvalidOption too, but it is the
	// server's fault, not the request's.
	{workers.ErrInvalidConfig, http.StatusInternalServerError, "internal", ""},
	{ErrUnauthenticated, http.StatusUnauthorized, "unauthenticated", "authentication required"},
	{workers.ErrNoAuthority, http.StatusUnauthorized, "unauthenticated", "authentication required"},
	{workers.ErrNotFound, http.StatusNotFound, "not_found", "task not found"},
	{workers.ErrUnauthorized, http.StatusForbidden, "forbidden", "not allowed"},
	{workers.ErrQuotaExceeded, http.StatusTooManyRequests, "too_many_requests", "quota exceeded; retry later"},
	{ErrTooManyStreams, http.StatusTooManyRequests, "too_many_streams", "too many event streams open; close one or retry later"},
	{workers.ErrFinished, http.StatusConflict, "finished", "task already finished"},
	{workers.ErrConflict, http.StatusServiceUnavailable, "conflict", ""},
	{workers.ErrClosed, http.StatusServiceUnavailable, "closed", ""},
	{workers.ErrUnavailable, http.StatusServiceUnavailable, "unavailable", ""},
	{workers.ErrInvalidKey, http.StatusBadRequest, "invalid_input", ""},
	{workers.ErrInvalidOwner, http.StatusBadRequest, "invalid_input", ""},
	{workers.ErrInvalidOption, http.StatusBadRequest, "invalid_input", ""},
	{workers.ErrInvalidCursor, http.StatusBadRequest, "invalid_input", "malformed cursor"},
	{ErrBadRequest, http.StatusBadRequest, "invalid_input", ""},
}

// conflictRetry is the Retry-After given with a conflict: the record was
// changing under the call, and a moment later it has settled.
const conflictRetry = time.Second

// StatusCode returns the HTTP status for an error a Runtime or this
// package returned: 401 unauthenticated (ErrUnauthenticated,
// workers.ErrNoAuthority), 404 workers.ErrNotFound (a task the caller
// may not see answers the same as a missing one), 403
// workers.ErrUnauthorized, 429 workers.ErrQuotaExceeded (a
// *workers.QuotaError), this package's ErrTooManyStreams and any other
// error with a retry hint (one that implements RetryAfter()
// time.Duration), 409
// workers.ErrFinished, 503 workers.ErrConflict, workers.ErrClosed and
// workers.ErrUnavailable (a store that could not reach its database, or
// whose database refuses writes for now: read-only, full),
// 400 invalid input (workers.ErrInvalidKey, ErrInvalidOwner,
// ErrInvalidOption, ErrInvalidCursor, and this package's ErrBadRequest),
// except the runtime's own misconfiguration (workers.ErrInvalidConfig),
// which is 500,
// 413 a body over its bound (an *http.MaxBytesError),
// 499 when the client went away (context.Canceled), 504 for
// context.DeadlineExceeded (a deadline passed before the store answered:
// the request's, or one of the driver's, such as a connect timeout), and
// 500 for anything else. A nil error is 200.
func StatusCode(err error) int {
	status, _, _ := classify(err)
	return status
}

// RetryAfter returns how long a client should wait before retrying the
// call that failed with err, and whether the status StatusCode gives it
// carries a Retry-After header.
func RetryAfter(err error) (time.Duration, bool) {
	var ra retryAfterer
	if errors.As(err, &ra) {
		return max(ra.RetryAfter(), time.Second), true
	}
	if errors.Is(err, workers.ErrConflict) {
		return conflictRetry, true
	}
	if errors.Is(err, workers.ErrUnavailable) {
		return unavailableRetry, true
	}
	if errors.Is(err, workers.ErrClosed) {
		return closedRetry, true
	}
	if errors.Is(err, ErrTooManyStreams) {
		return streamsRetry, true
	}
	return 0, false
}

// closedRetry is the Retry-After given by a runtime shut down, or a
// stream asked for as the server shuts down: in a rolling deploy, another
// replica, or this one restarted, serves the retry.
const closedRetry = time.Second

// streamsRetry is the Retry-After given with ErrTooManyStreams: a page
// closed or reloaded ends its streams within moments.
const streamsRetry = 5 * time.Second

// unavailableRetry is the Retry-After given when the store could not
// reach its database: a restart or a failover takes seconds.
const unavailableRetry = 5 * time.Second

func classify(err error) (status int, code, message string) {
	if err == nil {
		return http.StatusOK, "", ""
	}
	if tooLarge := new(http.MaxBytesError); errors.As(err, &tooLarge) {
		return http.StatusRequestEntityTooLarge, "too_large", "request body too large"
	}
	if ra := retryAfterer(nil); errors.As(err, &ra) {
		err = workers.ErrQuotaExceeded // any refusal with a retry hint of its own
	}
	for _, row := range statuses {
		if errors.Is(err, row.err) {
			msg := row.message
			if msg == "" && row.status < 500 {
				msg = err.Error() // invalid input: the caller's own value, said back
			}
			if row.status >= 500 {
				msg = http.StatusText(row.status)
			}
			return row.status, row.code, msg
		}
	}
	if errors.Is(err, context.Canceled) {
		return 499, "client_closed", "request cancelled"
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return http.StatusGatewayTimeout, "timeout", http.StatusText(http.StatusGatewayTimeout)
	}
	return http.StatusInternalServerError, "internal", http.StatusText(http.StatusInternalServerError)
}

// errorBody is the JSON body of every error response.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// WriteError writes err as a JSON error response with the status
// StatusCode gives it, and a Retry-After header when RetryAfter has one.
// The body of a 5xx never carries the error's text, which may describe
// internals; only its stable code and the status text. A nil err, a
// mistake of the caller's, is answered as an internal error (500), never
// as a success. An error of the application's own authentication is
// answered 401 only when it wraps ErrUnauthenticated (see there).
func WriteError(w http.ResponseWriter, err error) {
	if err == nil {
		err = errors.New("workershttp: WriteError with a nil error")
	}
	status, code, msg := classify(err)
	if d, ok := RetryAfter(err); ok {
		w.Header().Set("Retry-After", strconv.FormatInt(seconds(d), 10))
	}
	writeJSON(w, status, errorBody{errorDetail{Code: code, Message: msg}})
}

// seconds is d in whole seconds, rounded up, for a Retry-After header;
// the rounding cannot overflow, even for a hint of "never"
// (math.MaxInt64, as golang.org/x/time/rate gives).
func seconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second > 0 {
		s++
	}
	return s
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
