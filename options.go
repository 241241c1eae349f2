package workers

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// SubmitOption configures one submission. Options apply only when the
// submission starts a new run; a submission that joins a live run leaves
// that run as it is.
type SubmitOption func(*submitOptions) error

type submitOptions struct {
	scope    Scope
	watchers []string
	timeout  time.Duration
	retry    RetryPolicy
}

// WithScope sets the id scope; ScopeUser is the default. System always
// submits into the global scope.
func WithScope(s Scope) SubmitOption {
	return func(o *submitOptions) error {
		if s != ScopeUser && s != ScopeGlobal {
			return fmt.Errorf("%w: unknown scope %v", ErrInvalidOption, s)
		}
		o.scope = s
		return nil
	}
}

// WithWatchers grants each owner read, list and cancel access to the run
// the submission starts, beside the submitter. No call grants access to
// a run after the fact, with one exception: a submission of a live
// global-scope key by a caller the store's WatchAuthorizer lets join
// makes that caller a watcher of the run. Re-running a finished
// key resets its watchers to the submitter and the owners granted then.
// A zero Owner among them makes the submission fail with ErrNoAuthority.
func WithWatchers(owners ...Owner) SubmitOption {
	return func(o *submitOptions) error {
		for _, w := range owners {
			if w.id == "" {
				return fmt.Errorf("%w: zero Owner in WithWatchers", ErrNoAuthority)
			}
			o.watchers = append(o.watchers, w.id)
		}
		o.watchers = distinct(o.watchers)
		return nil
	}
}

// WithTimeout bounds how long the runtime waits for each attempt. When it
// expires, the run's context is cancelled with a *TimeoutError cause and
// the task ends FAILED at once, without retry; the callback keeps running
// until it returns (the runtime cannot stop a goroutine), and whatever it
// then returns is discarded. Until it returns, the run keeps what it
// holds: its place in a sequential queue (the next item does not start
// before it), and its running slot under Config.Limits, for the runtime
// and for its owner. Runtime.Wait and Status report the FAILED record at
// once; Runtime.Stats and QueueStatus count the callback as running until
// it returns. Zero means no timeout.
func WithTimeout(d time.Duration) SubmitOption {
	return func(o *submitOptions) error {
		if d < 0 {
			return fmt.Errorf("%w: negative timeout %v", ErrInvalidOption, d)
		}
		o.timeout = d
		return nil
	}
}

// RetryPolicy retries a callback that returned an error or panicked, with
// exponential backoff. The backoff wait watches the run's context: a
// cancel during it ends the task CANCELLED with that cause.
type RetryPolicy struct {
	// MaxAttempts is the total number of attempts, the first included.
	// Zero or one means no retry.
	MaxAttempts int
	// InitialBackoff is the wait before the second attempt. Defaults to
	// 100ms.
	InitialBackoff time.Duration
	// MaxBackoff caps every wait. Defaults to 30s.
	MaxBackoff time.Duration
	// Multiplier grows the wait after each attempt. Defaults to 2.
	Multiplier float64
	// Jitter, up to 1, randomizes each wait by up to that fraction
	// either way, so that many failing tasks do not retry in step; a
	// wait at MaxBackoff, which no wait passes, by up to that fraction
	// below it. Defaults to DefaultJitter (0.1: each wait lands within
	// 10% of its nominal value); NoJitter (any negative value) asks for
	// none.
	Jitter float64
}

// Jitter values of a RetryPolicy.
const (
	// DefaultJitter is the jitter of a RetryPolicy that leaves Jitter
	// zero.
	DefaultJitter = 0.1
	// NoJitter makes a RetryPolicy wait exactly its nominal backoff.
	NoJitter = -1.0
)

// WithRetry sets the retry policy: a callback that returns an error, or
// panics, is called again after a backoff until it succeeds or
// MaxAttempts attempts have failed. An error made with Permanent is never
// retried: the run ends FAILED at once, with CausePermanent. A timeout
// (WithTimeout) and a cancellation are never retried either. Under
// Config.Limits the run keeps its running slot, and a queue item its
// queue's place, through each backoff (see Limits).
func WithRetry(p RetryPolicy) SubmitOption {
	return func(o *submitOptions) error {
		switch {
		case p.MaxAttempts < 0:
			return fmt.Errorf("%w: negative MaxAttempts %d", ErrInvalidOption, p.MaxAttempts)
		case p.InitialBackoff < 0 || p.MaxBackoff < 0:
			return fmt.Errorf("%w: negative backoff", ErrInvalidOption)
		case p.Multiplier != 0 && p.Multiplier < 1 || p.Multiplier != p.Multiplier:
			return fmt.Errorf("%w: Multiplier %v is not 1 or more", ErrInvalidOption, p.Multiplier)
		case p.Jitter > 1 || p.Jitter != p.Jitter:
			return fmt.Errorf("%w: Jitter %v above 1", ErrInvalidOption, p.Jitter)
		}
		// Defaults go into a copy: an option may be shared by
		// concurrent submissions, so it must not write what it captured.
		q := p
		switch {
		case q.Jitter == 0:
			q.Jitter = DefaultJitter
		case q.Jitter < 0:
			q.Jitter = 0
		}
		q.InitialBackoff = cmp.Or(q.InitialBackoff, 100*time.Millisecond)
		q.MaxBackoff = cmp.Or(q.MaxBackoff, 30*time.Second)
		q.Multiplier = cmp.Or(q.Multiplier, 2)
		o.retry = q
		return nil
	}
}

// backoff returns the wait after the given failed attempt (1-based).
func (p RetryPolicy) backoff(attempt int) time.Duration {
	d, most := float64(p.InitialBackoff), float64(p.MaxBackoff)
	for i := 1; i < attempt && d < most; i++ {
		d *= p.Multiplier
	}
	if p.Jitter > 0 {
		if d < most {
			d *= 1 + p.Jitter*(2*rand.Float64()-1)
		}
		if d >= most {
			// At the cap, or jittered past it: spread below it, or every
			// such wait would be the cap's, and the tasks that reached it
			// would retry in step.
			d = most * (1 - p.Jitter*rand.Float64())
		}
	}
	// Compared before the conversion: a wait past what a Duration holds
	// (a huge or infinite Multiplier) would convert to a negative one.
	if d >= most {
		return p.MaxBackoff
	}
	return time.Duration(math.Ceil(d)) // a cap of a few nanoseconds is not cut to none
}

// applyOptions returns the options opts set. Without any it allocates
// nothing: the options a call fills in escape, so they are made only when
// there are options to fill them.
func applyOptions(opts []SubmitOption) (submitOptions, error) {
	if len(opts) == 0 {
		return submitOptions{}, nil
	}
	o := new(submitOptions)
	for _, opt := range opts {
		if opt == nil {
			continue
		}
		if err := opt(o); err != nil {
			return *o, err
		}
	}
	return *o, nil
}

// ListOption narrows or orders Runtime.List and Runtime.ListPage.
type ListOption func(*listOptions)

type listOptions struct {
	f      Filter
	cursor string
}

// WithStatus keeps tasks in one of the given statuses; a status given
// more than once counts once, so the store is asked about five at most.
// A status that is none of the five makes the call fail with
// ErrInvalidOption.
func WithStatus(s ...Status) ListOption {
	return func(o *listOptions) {
		for _, st := range s {
			if !slices.Contains(o.f.Statuses, st) {
				o.f.Statuses = append(o.f.Statuses, st)
			}
			if !st.Valid() {
				return // the call fails on it: what follows does not matter
			}
		}
	}
}

// WithQueue keeps tasks of the named sequential queue. A name no queue
// could have (see SubmitSequential) makes the call fail with a
// *ValidationError (ErrInvalidKey). The empty name keeps every task, as
// if the option were not given.
func WithQueue(name string) ListOption {
	return func(o *listOptions) { o.f.Queue = name }
}

// WithLimit returns at most n tasks: the page size of ListPage. 0, the
// default, is no limit for List and DefaultPageSize for ListPage; a
// negative n makes the call fail with ErrInvalidOption.
func WithLimit(n int) ListOption {
	return func(o *listOptions) { o.f.Limit = n }
}

// WithOrder sets the order of the list: NewestFirst (the default) or
// OldestFirst.
func WithOrder(order Order) ListOption {
	return func(o *listOptions) { o.f.Order = order }
}

// WithCursor continues a listing after the page whose Page.Next is
// cursor; "" starts at the beginning. A cursor keeps its listing's order
// and overrides WithOrder; pass the same filters with it, or the pages do
// not fit together. A cursor that is not in ListPage's format is refused
// with ErrInvalidCursor. A cursor is not signed: it is the position of the
// last task of its page, and a made-up one only starts the listing
// elsewhere, which shows nothing the caller may not see.
func WithCursor(cursor string) ListOption {
	return func(o *listOptions) { o.cursor = cursor }
}
