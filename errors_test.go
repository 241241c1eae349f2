package workers

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every error the docs promise matches errors.Is with its sentinel and,
// for the typed ones, errors.As with its type, as a caller gets it from
// the API.
func TestDocumentedErrorsMatch(t *testing.T) {
	rt := newRuntime(t, NewMemStore(), Config{Logger: slog.New(slog.DiscardHandler), Limits: Limits{Owner: OwnerLimits{Running: 1, Waiting: 1}}})
	badConfig := newRuntime(t, NewMemStore(), Config{Limits: Limits{MaxRunning: -1}})
	rt.Store().SetQueueAuthorizer(func(queue, _ string) bool { return queue != "closed" })
	t.Cleanup(func() { rt.Store().SetQueueAuthorizer(nil) })
	noop := func(context.Context, *Task) (any, error) { return nil, nil }
	block := func(ctx context.Context, _ *Task) (any, error) { <-ctx.Done(); return nil, context.Cause(ctx) }

	// One run holds alice's running slot and one her waiting place, so
	// that a third submission is refused.
	held, err := rt.Submit(ctx, "held", block, alice)
	require.NoError(t, err)
	queued, err := rt.Submit(ctx, "queued", block, alice)
	require.NoError(t, err)
	_, quotaErr := rt.Submit(ctx, "refused", noop, alice)

	// Ended runs, for Snapshot.Err.
	ended := func(key string, fn Func, opts ...SubmitOption) Snapshot {
		t.Helper()
		sub, err := rt.Submit(ctx, key, fn, bob, opts...)
		require.NoError(t, err)
		snap, err := rt.Wait(ctx, sub.ID, bob)
		require.NoError(t, err)
		return snap
	}
	timedOut := ended("timeout", block, WithTimeout(time.Millisecond))
	panicked := ended("panic", func(context.Context, *Task) (any, error) { panic(errors.New("boom")) })
	badResult := ended("result", func(context.Context, *Task) (any, error) { return func() {}, nil })
	errDeclined := errors.New("declined")
	permanent := ended("permanent", func(context.Context, *Task) (any, error) { return nil, Permanent(errDeclined) })
	require.NoError(t, rt.Cancel(ctx, queued.ID, alice))
	cancelled, err := rt.Status(ctx, queued.ID, alice)
	require.NoError(t, err)
	_, resultErr := ResultAs[int](Snapshot{ID: "x", Status: StatusCompleted, Result: []byte(`"text"`)})

	_, ownerErr := NewOwner("a::b")
	_, keyErr := rt.Submit(ctx, "", noop, alice)
	_, scopeErr := rt.Submit(ctx, "a::b", noop, alice, WithScope(ScopeGlobal))
	_, queueErr := rt.SubmitSequential(ctx, "closed", "k", noop, alice)
	_, statsErr := rt.Stats(ctx, alice)
	_, notFound := rt.Status(ctx, "alice::missing", alice)
	_, foreign := rt.Status(ctx, held.ID, bob)
	_, noAuth := rt.Status(ctx, held.ID, nil)
	_, zeroOwner := rt.Status(ctx, held.ID, Owner{})
	_, zeroWatcher := rt.Submit(ctx, "w", noop, alice, WithWatchers(Owner{}))
	_, cursorErr := rt.ListPage(ctx, alice, WithCursor("not a cursor"))
	_, limitErr := rt.List(ctx, alice, WithLimit(-1))
	_, listQueueErr := rt.List(ctx, alice, WithQueue("a\x00b"))
	_, optionErr := rt.Submit(ctx, "k", noop, alice, WithTimeout(-1))
	finished := rt.Cancel(ctx, queued.ID, alice)
	_, configErr := badConfig.Submit(ctx, "k", noop, alice)

	var (
		validation    *ValidationError
		authorization *AuthorizationError
		quota         *QuotaError
		timeout       *TimeoutError
		panicErr      *PanicError
		taskErr       *TaskError
		permanentErr  *PermanentError
	)
	cases := []struct {
		name   string
		err    error
		is     []error
		as     any // a pointer to the type errors.As must find, or nil
		isNot  []error
		detail func(t *testing.T)
	}{
		{"NewOwner", ownerErr, []error{ErrInvalidOwner}, &validation, []error{ErrInvalidKey}, nil},
		{"empty key", keyErr, []error{ErrInvalidKey}, &validation, nil, nil},
		{"global key with ::", scopeErr, []error{ErrInvalidKey}, &validation, nil, nil},
		{"WithQueue", listQueueErr, []error{ErrInvalidKey}, &validation, nil, nil},
		{"queue authorizer", queueErr, []error{ErrUnauthorized}, &authorization, []error{ErrNotFound}, nil},
		{"Stats by an Owner", statsErr, []error{ErrUnauthorized}, &authorization, nil, nil},
		{"quota", quotaErr, []error{ErrQuotaExceeded}, &quota, nil, func(t *testing.T) {
			assert.Equal(t, QuotaOwnerWaiting, quota.Limit)
			assert.Positive(t, quota.RetryAfter())
		}},
		{"missing task", notFound, []error{ErrNotFound}, nil, nil, nil},
		{"another's task", foreign, []error{ErrNotFound}, nil, []error{ErrUnauthorized}, nil},
		{"nil authority", noAuth, []error{ErrNoAuthority}, nil, nil, nil},
		{"zero Owner", zeroOwner, []error{ErrNoAuthority}, nil, nil, nil},
		{"zero Owner in WithWatchers", zeroWatcher, []error{ErrNoAuthority}, nil, nil, nil},
		{"cursor", cursorErr, []error{ErrInvalidCursor}, nil, nil, nil},
		{"negative limit", limitErr, []error{ErrInvalidOption}, nil, nil, nil},
		{"negative timeout", optionErr, []error{ErrInvalidOption}, nil, []error{ErrInvalidConfig}, nil},
		{"cancel of an ended task", finished, []error{ErrFinished}, nil, nil, nil},
		{"misconfigured runtime", configErr, []error{ErrInvalidConfig, ErrInvalidOption}, nil, nil, nil},
		{"ResultAs", resultErr, []error{ErrResultEncoding}, nil, nil, nil},
		{"timed out", timedOut.Err(), []error{ErrTimeout}, &timeout, []error{ErrCancelled}, func(t *testing.T) {
			assert.Equal(t, time.Millisecond, timeout.Timeout)
			assert.Equal(t, CauseTimeout, timedOut.Cause)
		}},
		{"timed out, as a TaskError", timedOut.Err(), nil, &taskErr, nil, func(t *testing.T) {
			assert.Equal(t, StatusFailed, taskErr.Status)
		}},
		{"cancelled", cancelled.Err(), []error{ErrCancelled}, &taskErr, []error{ErrShutdown}, nil},
		{"panicked", panicked.Err(), nil, &taskErr, []error{ErrCancelled}, func(t *testing.T) {
			assert.Equal(t, CausePanicked, panicked.Cause)
		}},
		{"result not encodable", badResult.Err(), []error{ErrResultEncoding}, &taskErr, nil, nil},
		{"permanent, recorded", permanent.Err(), nil, &taskErr, []error{errDeclined}, func(t *testing.T) {
			assert.Equal(t, CausePermanent, permanent.Cause)
		}},
		{"Permanent", Permanent(errDeclined), []error{errDeclined}, &permanentErr, nil, nil},
		{"PanicError of an error", &PanicError{Value: errDeclined}, []error{errDeclined}, &panicErr, nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			require.Error(t, c.err)
			for _, target := range c.is {
				assert.ErrorIs(t, c.err, target)
			}
			for _, target := range c.isNot {
				assert.NotErrorIs(t, c.err, target)
			}
			if c.as != nil {
				require.ErrorAs(t, c.err, c.as)
			}
			if c.detail != nil {
				c.detail(t)
			}
		})
	}
	require.NoError(t, rt.Cancel(ctx, held.ID, alice))
}
