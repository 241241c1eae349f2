package workers

import (
	"context"
	"errors"
	"log/slog"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Wait returns when the record ends, not when the callback does: a
// timed-out or cancelled run whose callback ignores its context is
// terminal in the store at once, and so is Wait's answer.
func TestWaitReturnsWhenTheRecordEnds(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		opts  []SubmitOption
		end   func(rt *Runtime[*MemStore], id string) error
		cause error
	}{
		{"Timeout", []SubmitOption{WithTimeout(time.Millisecond)}, func(*Runtime[*MemStore], string) error { return nil }, ErrTimeout},
		{"Cancel", nil, func(rt *Runtime[*MemStore], id string) error { return rt.Cancel(ctx, id, alice) }, ErrCancelled},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rt := memRuntime(t)
			g := stubbornGate()
			defer g.open()
			sub, err := rt.Submit(ctx, "k", g.fn, alice, c.opts...)
			require.NoError(t, err)
			wait(t, g.started, "the callback")

			waited := make(chan Snapshot, 1)
			go func() {
				snap, err := rt.Wait(ctx, sub.ID, alice)
				assert.NoError(t, err)
				waited <- snap
			}()
			require.NoError(t, c.end(rt, sub.ID))
			select {
			case snap := <-waited:
				assert.True(t, snap.Status.Terminal())
				assert.ErrorIs(t, snap.Err(), c.cause)
			case <-time.After(10 * time.Second):
				t.Fatal("Wait did not return while the callback still ran")
			}
			select {
			case <-g.ran:
				t.Fatal("the stubborn callback returned before it was released")
			default:
			}
		})
	}
}

// The cause is read from the record's code, never parsed from its text: a
// callback error that reads like a timeout is a plain failure.
func TestErrUsesTheCauseCodeNotTheMessage(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	sub, err := rt.Submit(ctx, "k", returns(nil, errors.New("Timed out after 5s")), alice)
	require.NoError(t, err)
	snap, err := rt.Wait(ctx, sub.ID, alice)
	require.NoError(t, err)
	assert.Equal(t, CauseFailed, snap.Cause)
	assert.NotErrorIs(t, snap.Err(), ErrTimeout)

	g := stubbornGate()
	defer g.open()
	sub, err = rt.Submit(ctx, "t", g.fn, alice, WithTimeout(time.Millisecond))
	require.NoError(t, err)
	snap, err = rt.Wait(ctx, sub.ID, alice)
	require.NoError(t, err)
	var te *TimeoutError
	require.ErrorAs(t, snap.Err(), &te)
	assert.Equal(t, time.Millisecond, te.Timeout)
	assert.Equal(t, CauseTimeout, snap.Cause)
}

// Each way a run ends leaves its code on the record.
func TestEveryEndingRecordsItsCode(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	end := func(key string, fn Func, opts ...SubmitOption) Snapshot {
		t.Helper()
		sub, err := rt.Submit(ctx, key, fn, alice, opts...)
		require.NoError(t, err)
		snap, err := rt.Wait(ctx, sub.ID, alice)
		require.NoError(t, err)
		return snap
	}
	assert.Equal(t, CauseCompleted, end("ok", returns(1, nil)).Cause)
	assert.Equal(t, CauseFailed, end("fail", returns(nil, errors.New("no"))).Cause)
	assert.Equal(t, CausePanicked, end("panic", func(context.Context, *Task) (any, error) { panic("boom") }).Cause)
	assert.Equal(t, CauseFailed, end("encode", returns(func() {}, nil)).Cause)

	g := newGate()
	sub, err := rt.Submit(ctx, "cancel", g.fn, alice)
	require.NoError(t, err)
	wait(t, g.started, "the callback")
	require.NoError(t, rt.Cancel(ctx, sub.ID, alice))
	snap, err := rt.Wait(ctx, sub.ID, alice)
	require.NoError(t, err)
	assert.Equal(t, CauseCancelled, snap.Cause)
	assert.ErrorIs(t, snap.Err(), ErrCancelled)
}

type ctxKey struct{}

// The callback's context carries the submission context's values, and
// neither its cancellation nor its deadline.
func TestRunContextKeepsSubmissionValuesOnly(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	subCtx, cancel := context.WithTimeout(context.WithValue(ctx, ctxKey{}, "req-7"), time.Hour)
	type seen struct {
		value       any
		hasDeadline bool
	}
	got := make(chan seen, 1)
	release := make(chan struct{})
	sub, err := rt.Submit(subCtx, "k", func(ctx context.Context, _ *Task) (any, error) {
		_, dl := ctx.Deadline()
		got <- seen{ctx.Value(ctxKey{}), dl}
		<-release
		return nil, ctx.Err()
	}, alice)
	require.NoError(t, err)
	s := <-got
	assert.Equal(t, "req-7", s.value)
	assert.False(t, s.hasDeadline)
	cancel() // the submitter's request ends: the run must not
	close(release)
	snap, err := rt.Wait(ctx, sub.ID, alice)
	require.NoError(t, err)
	assert.Equal(t, StatusCompleted, snap.Status)
}

// A live record of this runtime whose run it no longer holds is dead:
// a submission replaces it instead of joining it.
func TestSubmitNeverJoinsADeadRunOfItsOwn(t *testing.T) {
	t.Parallel()
	s := NewMemStore()
	rt := newRuntime(t, s, Config{})
	dead := rt.instance + ".dead"
	require.NoError(t, s.InsertTask(ctx, Record{ID: "alice::k", RunID: dead, Watchers: []string{"alice"}, CreatedAt: now(), State: State{Status: StatusRunning}}))
	sub, err := rt.Submit(ctx, "k", returns("fresh", nil), alice)
	require.NoError(t, err)
	assert.False(t, sub.Joined)
	assert.NotEqual(t, dead, sub.RunID)
	snap, err := rt.Wait(ctx, sub.ID, alice)
	require.NoError(t, err)
	assert.Equal(t, StatusCompleted, snap.Status)
}

// A live record of another instance whose lease has ended is dead the
// moment the store says so: a submission replaces it, though a recovery
// pass read that lease live less than a LeaseInterval before.
func TestSubmitNeverJoinsARunWhoseLeaseEndedSinceTheLastRecovery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewMemStore()
		// Another instance's lease, never renewed: it ends at 2.5 s.
		_, err := s.RenewLease(ctx, "gone", 2500*time.Millisecond)
		require.NoError(t, err)
		require.NoError(t, s.InsertTask(ctx, Record{ID: "alice::k", RunID: "gone.1", Watchers: []string{"alice"}, CreatedAt: now(),
			State: State{Status: StatusRunning, Attempt: 1, StartedAt: now()}}))
		rt := NewRuntime(s, Config{LeaseInterval: time.Second, LeaseTTL: 3 * time.Second, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, rt.Start(ctx)) // recovery passes at 1 s, 2 s, 3 s...
		time.Sleep(2700 * time.Millisecond)
		sub, err := rt.Submit(ctx, "k", returns("fresh", nil), alice)
		require.NoError(t, err)
		assert.False(t, sub.Joined, "joined run %s, whose instance's lease ended 0.2 s before", sub.RunID)
		snap, err := rt.Wait(ctx, sub.ID, alice)
		require.NoError(t, err)
		assert.Equal(t, StatusCompleted, snap.Status)
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// Shutdown lets a short callback finish within the grace period instead
// of cancelling it, and cancels one that outlives it.
func TestShutdownDrainsSoftlyWithinTheGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := NewRuntime(NewMemStore(), Config{})
		work := func(d time.Duration) Func {
			return func(ctx context.Context, _ *Task) (any, error) {
				select {
				case <-time.After(d):
					return "done", nil
				case <-ctx.Done():
					return nil, context.Cause(ctx)
				}
			}
		}
		short, err := rt.Submit(ctx, "short", work(200*time.Millisecond), alice)
		require.NoError(t, err)
		long, err := rt.Submit(ctx, "long", work(time.Minute), alice)
		require.NoError(t, err)
		synctest.Wait()

		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		start := time.Now()
		require.NoError(t, rt.Shutdown(sctx))
		// The long one is cancelled at the grace point: 3/4 of 5s.
		assert.Equal(t, 3750*time.Millisecond, time.Since(start))
		s, err := rt.Status(ctx, short.ID, alice)
		require.NoError(t, err)
		assert.Equal(t, StatusCompleted, s.Status)
		l, err := rt.Status(ctx, long.ID, alice)
		require.NoError(t, err)
		assert.Equal(t, CauseShutdown, l.Cause)
	})
}

// ShutdownGrace, when set, is the grace period; a negative one cancels
// at once.
func TestShutdownGraceConfigured(t *testing.T) {
	for _, c := range []struct {
		grace time.Duration
		want  time.Duration
	}{{time.Second, time.Second}, {-1, 0}, {time.Hour, 5 * time.Second}} {
		synctest.Test(t, func(t *testing.T) {
			rt := NewRuntime(NewMemStore(), Config{ShutdownGrace: c.grace})
			_, err := rt.Submit(ctx, "k", func(ctx context.Context, _ *Task) (any, error) {
				<-ctx.Done()
				return nil, ctx.Err()
			}, alice)
			require.NoError(t, err)
			synctest.Wait()
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			start := time.Now()
			err = rt.Shutdown(sctx)
			assert.Equal(t, c.want, time.Since(start), "grace %v", c.grace)
			if c.want < 5*time.Second {
				assert.NoError(t, err)
			}
		})
	}
}

// A runtime that finds its lease lost cancels its runs with ErrAbandoned,
// and a callback that returns a result after that records the abandon,
// never the late result, even where no recoverer ended the record first.
func TestLostLeaseFencesTheLateResult(t *testing.T) {
	t.Parallel()
	s, lapsed := lapsing()
	rt := newRuntime(t, s, Config{LeaseInterval: time.Millisecond})
	g := newGate()
	started, ended := make(chan struct{}), make(chan struct{})
	sub, err := rt.Submit(ctx, "k", func(ctx context.Context, tk *Task) (any, error) {
		go func() { <-ctx.Done(); close(ended) }()
		close(started)
		<-g.release // the result comes only after the abandon
		return "late", nil
	}, alice)
	require.NoError(t, err)
	// The callback runs before the lease lapses: a run abandoned before
	// its callback starts never calls it.
	wait(t, started, "the callback to start")
	lapsed.Store(true)
	wait(t, ended, "the run's context to end")
	g.open()
	snap := settled(t, rt, sub.ID)
	assert.Equal(t, StatusFailed, snap.Status)
	assert.Equal(t, CauseAbandoned, snap.Cause)
	assert.ErrorIs(t, snap.Err(), ErrAbandoned)
}

// A renewal that hangs is cut off when the lease runs out, not one
// LeaseInterval later: the runs are abandoned by the lease's end even
// when the interval is longer than what is left of the lease.
func TestHungRenewalAbandonsRunsByTheLeasesEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := hangingAfterFirst()
		rt := NewRuntime(s, Config{LeaseInterval: 3 * time.Second, LeaseTTL: 4 * time.Second})
		start := time.Now()
		abandoned := make(chan time.Duration, 1)
		_, err := rt.Submit(ctx, "k", func(ctx context.Context, _ *Task) (any, error) {
			<-ctx.Done()
			abandoned <- time.Since(start)
			return nil, context.Cause(ctx)
		}, alice)
		require.NoError(t, err)
		assert.Equal(t, 4*time.Second, <-abandoned)
		shutdownWithin(t, rt, time.Second)
	})
}

// A submission whose renewal of a lost lease hangs fails once the
// renewal's bound passes, with an error that says so and is not the
// caller's own deadline.
func TestAHungRenewalFailsTheSubmissionWithItsOwnError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := hangingAfterFirst()
		rt, _ := leasedRuntime(t, s)
		time.Sleep(3500 * time.Millisecond) // the lease ran out: lost
		start := time.Now()
		_, err := rt.Submit(ctx, "later", untilCancelled, alice)
		require.Error(t, err)
		assert.NotErrorIs(t, err, context.DeadlineExceeded, "the caller's context did not end")
		assert.ErrorContains(t, err, "did not answer a lease renewal within 1s")
		assert.LessOrEqual(t, time.Since(start), 2*time.Second, "one interval, after any renewal in flight")
		shutdownWithin(t, rt, time.Second)
	})
}

// A renewal cut off by what was left of the lease says how long it had,
// to the millisecond, not to the nanosecond of a clock's reading.
func TestARenewalCutOffSaysItsBoundRounded(t *testing.T) {
	for _, c := range []struct {
		bound time.Duration
		want  string
	}{
		{2765432198 * time.Nanosecond, "within 2.765s (context deadline exceeded)"},
		{time.Second, "within 1s ("},
		{1499999 * time.Nanosecond, "within 1ms ("},
		{312345 * time.Nanosecond, "within 312µs ("},
	} {
		assert.ErrorContains(t, renewalCutOff(c.bound, context.DeadlineExceeded), c.want)
	}
}

// A submission waiting for a renewal in flight stops waiting when
// Shutdown begins (ErrClosed), so Shutdown is not held up by the hung
// store for as long as the renewal's bound.
func TestShutdownEndsASubmissionsWaitForTheLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := hangingAfterFirst()
		rt := NewRuntime(s, Config{LeaseInterval: 10 * time.Second, LeaseTTL: 30 * time.Second})
		_, err := rt.Submit(ctx, "first", untilCancelled, alice)
		require.NoError(t, err)
		// The renewal sent at 10 s is cut off at 30 s, the lease's end:
		// lost. The next, sent at 30 s, hangs until 40 s.
		time.Sleep(31 * time.Second)
		submitted := make(chan error, 1)
		go func() {
			_, err := rt.Submit(ctx, "later", untilCancelled, alice)
			submitted <- err
		}()
		time.Sleep(time.Second) // the submission waits for the renewal
		start := time.Now()
		require.NoError(t, rt.Shutdown(ctx))
		assert.Zero(t, time.Since(start), "Shutdown did not wait for the renewal")
		assert.Equal(t, ErrClosed, <-submitted, "ErrClosed itself, as for any submission after Shutdown")
	})
}

// A submission that wins the lease's turn only after Shutdown has begun
// (its select may pick the turn over Shutdown's start) sends no renewal:
// it returns ErrClosed without calling the store.
func TestNoRenewalIsSentOnceShutdownBegan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _, calls := failingRenewals()
		rt, _ := leasedRuntime(t, s)
		rt.gate.close() // Shutdown's first step
		before := calls.Load()
		assert.Equal(t, ErrClosed, rt.renewUnlessShut(ctx, s, time.Time{}))
		assert.Equal(t, before, calls.Load(), "no call to cut off")
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// hangingAfterFirst returns a store whose first renewal, which takes
// the lease, succeeds, and every later one hangs until its context ends.
func hangingAfterFirst() *renewing {
	var calls atomic.Int32
	return &renewing{MemStore: NewMemStore(), renew: func(ctx context.Context) (bool, error) {
		if calls.Add(1) == 1 {
			return true, nil
		}
		<-ctx.Done()
		return false, ctx.Err()
	}}
}

// shutdownWithin shuts rt down and requires it to settle within d.
func shutdownWithin[S Store](t *testing.T, rt *Runtime[S], d time.Duration) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	require.NoError(t, rt.Shutdown(sctx))
}

// untilCancelled is a callback that runs until its context ends.
func untilCancelled(ctx context.Context, _ *Task) (any, error) {
	<-ctx.Done()
	return nil, context.Cause(ctx)
}

// leasedRuntime returns a runtime over s that renews its lease every
// second with a TTL of three, and the submission of a first run, which
// took the lease and runs until cancelled. Call it inside a bubble.
func leasedRuntime[S Store](t *testing.T, s S) (*Runtime[S], Submission) {
	t.Helper()
	rt := NewRuntime(s, Config{LeaseInterval: time.Second, LeaseTTL: 3 * time.Second})
	first, err := rt.Submit(ctx, "first", untilCancelled, alice)
	require.NoError(t, err)
	return rt, first
}

// failingRenewals returns a store whose renewals fail, as a database out
// of reach would, while failing is set, and calls, which counts them.
func failingRenewals() (s *renewing, failing *atomic.Bool, calls *atomic.Int32) {
	failing, calls = new(atomic.Bool), new(atomic.Int32)
	s = &renewing{MemStore: NewMemStore(), renew: func(context.Context) (bool, error) {
		calls.Add(1)
		if failing.Load() {
			return false, errors.New("connection refused")
		}
		return true, nil
	}}
	return s, failing, calls
}

// lapseOnce lets a lapsing store's next renewal, one second away in the
// bubble, find the lease expired.
func lapseOnce(lapsed *atomic.Bool) {
	lapsed.Store(true)
	time.Sleep(time.Second)
	synctest.Wait()
	lapsed.Store(false)
}

// assertAbandoned asserts that id's record ended FAILED as abandoned.
func assertAbandoned[S Store](t *testing.T, rt *Runtime[S], id, msg string) {
	t.Helper()
	snap := mustStatus(t, rt, id)
	assert.Equal(t, StatusFailed, snap.Status, msg)
	assert.Equal(t, CauseAbandoned, snap.Cause, msg)
}

// Once the lease is lost, a submission registers nothing on it: it
// renews the lease first and fails with the renewal's error, and once
// the store heals it renews and runs at once, without waiting for the
// renewal loop's next tick.
func TestSubmitRenewsALostLeaseBeforeRegistering(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, failing, calls := failingRenewals()
		rt, first := leasedRuntime(t, s)
		failing.Store(true)
		time.Sleep(3500 * time.Millisecond) // past the lease's end
		synctest.Wait()
		assert.Equal(t, CauseAbandoned, mustStatus(t, rt, first.ID).Cause, "the run of the lost lease")

		before := calls.Load()
		_, err := rt.Submit(ctx, "later", untilCancelled, alice)
		assert.ErrorContains(t, err, "connection refused")
		assert.Equal(t, before+1, calls.Load(), "the submission renewed the lease itself")
		_, err = rt.Status(ctx, "later", alice)
		assert.ErrorIs(t, err, ErrNotFound, "nothing registered on a lost lease")

		failing.Store(false)
		healed, err := rt.Submit(ctx, "healed", untilCancelled, alice)
		require.NoError(t, err)
		time.Sleep(5 * time.Second) // renewals succeed again
		synctest.Wait()
		assert.Equal(t, StatusRunning, mustStatus(t, rt, healed.ID).Status, "a run on the renewed lease")
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// Submissions that find the lease lost while a renewal is in flight wait
// for it and share its answer: a store that is down costs them one call.
func TestSubmissionsShareALeaseRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			healthy = iota
			down
			hanging // down, and each renewal waits for answer
		)
		var mode, calls atomic.Int32
		answer := make(chan struct{})
		s := &renewing{MemStore: NewMemStore(), renew: func(context.Context) (bool, error) {
			switch mode.Load() {
			case healthy:
				return true, nil
			case hanging:
				calls.Add(1)
				<-answer
			}
			return false, errors.New("connection refused")
		}}
		rt, _ := leasedRuntime(t, s)
		mode.Store(down)
		time.Sleep(3500 * time.Millisecond) // past the lease's end
		synctest.Wait()
		mode.Store(hanging)
		errs := make(chan error, 3)
		for _, key := range []string{"a", "b", "c"} {
			go func() {
				_, err := rt.Submit(ctx, key, untilCancelled, alice)
				errs <- err
			}()
		}
		synctest.Wait() // one renewal hangs; two submissions wait for it
		close(answer)
		for range 3 {
			assert.ErrorContains(t, <-errs, "connection refused")
		}
		assert.Equal(t, int32(1), calls.Load(), "one renewal for three submissions")
		mode.Store(healthy)
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// insertHeld is a lapsing store whose inserts of the ids that start with
// held wait for release, whatever their context says: a submission
// caught between its lease check and its handle.
type insertHeld struct {
	*renewing
	held    string
	release chan struct{}
}

func (s *insertHeld) InsertTask(ctx context.Context, rec Record) error {
	if strings.HasPrefix(rec.ID, s.held) {
		<-s.release
	}
	return s.renewing.InsertTask(ctx, rec)
}

// racerHeldInItsInsert returns a runtime over a lapsing store with a
// first run, and the submission of the key "racer" waiting in its insert
// for s.release: it has passed its lease check and is not yet published.
// Its Submission arrives on submitted. Call it inside a bubble.
func racerHeldInItsInsert(t *testing.T) (rt *Runtime[*insertHeld], s *insertHeld, lapsed *atomic.Bool, first Submission, submitted chan Submission) {
	inner, lapsed := lapsing()
	s = &insertHeld{renewing: inner, held: "alice::racer", release: make(chan struct{})}
	rt, first = leasedRuntime(t, s)
	submitted = make(chan Submission, 1)
	go func() {
		sub, err := rt.Submit(ctx, "racer", untilCancelled, alice)
		assert.NoError(t, err)
		submitted <- sub
	}()
	synctest.Wait() // the racer's insert waits
	return rt, s, lapsed, first, submitted
}

// A run that registers while the lease is found lost, too late for the
// sweep that abandons the runs, is abandoned as it is dispatched.
func TestARunRegisteringAsTheLeaseIsLostIsAbandoned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt, s, lapsed, first, submitted := racerHeldInItsInsert(t)
		lapseOnce(lapsed)
		assert.Equal(t, CauseAbandoned, mustStatus(t, rt, first.ID).Cause, "swept")
		close(s.release)
		racer := <-submitted
		synctest.Wait()
		assertAbandoned(t, rt, racer.ID, "registered as the lease was lost")
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// A submission whose goroutine stalls between its reads of the lease's
// epoch and of its end, while a loss is declared, sees the loss: it
// renews the lease, and fails with the renewal's error, registering
// nothing on the lost lease.
func TestASubmissionStalledAcrossALossRegistersNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, failing, _ := failingRenewals()
		rt, _ := leasedRuntime(t, s)
		stalled, resume := make(chan struct{}), make(chan struct{})
		rt.hooks.Store(&hooks{leaseRead: func() { close(stalled); <-resume }})
		submitted := make(chan error, 1)
		go func() {
			_, err := rt.Submit(ctx, "stalled", untilCancelled, alice)
			submitted <- err
		}()
		<-stalled
		failing.Store(true)
		time.Sleep(3500 * time.Millisecond) // the loop declares the lease lost
		synctest.Wait()
		rt.hooks.Store(nil)
		close(resume)
		assert.ErrorContains(t, <-submitted, "connection refused")
		_, err := rt.Status(ctx, "stalled", alice)
		assert.ErrorIs(t, err, ErrNotFound, "nothing registered on the lost lease")
		failing.Store(false)
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// A run that passed its lease check before a loss, and is published and
// dispatched while the loss is declared, is abandoned whether or not the
// sweep of the runs lists it: the epoch moves before the sweep.
func TestARunDispatchedDuringALossIsAbandoned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt, s, lapsed, _, submitted := racerHeldInItsInsert(t)
		var racer Submission
		rt.hooks.Store(&hooks{leaseLost: func() {
			close(s.release)
			racer = <-submitted // published and dispatched
		}})
		lapseOnce(lapsed)
		rt.hooks.Store(nil)
		assertAbandoned(t, rt, racer.ID, "dispatched while the lease was found lost")
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// A run that waits for admission, cancelled by a lost lease between its
// dispatch's check and its joining the wait (the sweep then finds it in
// no wait list), is not left PENDING until a slot frees: it ends at once.
func TestARunCancelledBeforeItWaitsForASlotEndsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, lapsed := lapsing()
		rt := NewRuntime(s, Config{LeaseInterval: time.Second, LeaseTTL: 3 * time.Second, Limits: Limits{MaxRunning: 1}})
		release := make(chan struct{})
		_, err := rt.Submit(ctx, "holder", func(context.Context, *Task) (any, error) {
			<-release // holds the only slot, whatever its context says
			return nil, nil
		}, alice)
		require.NoError(t, err)
		sub := heldAtEnqueue(t, rt, func() (Submission, error) { return rt.Submit(ctx, "waiter", untilCancelled, alice) },
			func() { lapseOnce(lapsed) })
		synctest.Wait()
		assertAbandoned(t, rt, sub.ID, "ended while the slot is still held")
		close(release)
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// A queue item cancelled by a lost lease between its dispatch's check and
// its push (the sweep then finds it in no queue) is not left PENDING
// behind a head that ignores its context: it ends at once, a submission
// of its key starts a new run, and its owner's waiting place is free.
func TestAQueueItemCancelledBeforeItIsQueuedEndsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, lapsed := lapsing()
		rt := NewRuntime(s, Config{LeaseInterval: time.Second, LeaseTTL: 3 * time.Second,
			Limits: Limits{Owner: OwnerLimits{Waiting: 1}}})
		head := stubbornGate()
		_, err := rt.SubmitSequential(ctx, "q", "head", head.fn, alice)
		require.NoError(t, err)
		<-head.started
		sub := heldAtEnqueue(t, rt, func() (Submission, error) { return rt.SubmitSequential(ctx, "q", "behind", noop, alice) },
			func() { lapseOnce(lapsed) })
		synctest.Wait()
		assertAbandoned(t, rt, sub.ID, "ended while the head still holds the queue")
		again, err := rt.SubmitSequential(ctx, "q", "behind", noop, alice)
		require.NoError(t, err, "alice's one waiting place is free")
		assert.False(t, again.Joined, "a new run, not the abandoned one")
		head.open()
		synctest.Wait()
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// heldAtEnqueue runs submit with its dispatch held just before the run
// joins its wait (for a slot, or in its queue), calls meanwhile, and
// returns the submission once it is through.
func heldAtEnqueue[S Store](t *testing.T, rt *Runtime[S], submit func() (Submission, error), meanwhile func()) Submission {
	t.Helper()
	waiting, resume := make(chan struct{}), make(chan struct{})
	rt.hooks.Store(&hooks{enqueue: func() { close(waiting); <-resume }})
	submitted := make(chan Submission, 1)
	go func() {
		sub, err := submit()
		assert.NoError(t, err)
		submitted <- sub
	}()
	<-waiting
	meanwhile()
	rt.hooks.Store(nil)
	close(resume)
	return <-submitted
}

// Items waiting in a sequential queue when the lease is lost end as
// abandoned at once, not when the queue reaches them: a callback ahead
// of them that ignores its context may hold the queue for good, and a
// submission of their keys must not join a run that will never start.
func TestLostLeaseEndsTheQueuesWaitingItems(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, lapsed := lapsing()
		rt := NewRuntime(s, Config{LeaseInterval: time.Second, LeaseTTL: 3 * time.Second})
		head := stubbornGate()
		_, err := rt.SubmitSequential(ctx, "q", "head", head.fn, alice)
		require.NoError(t, err)
		<-head.started
		behind, err := rt.SubmitSequential(ctx, "q", "behind", noop, alice)
		require.NoError(t, err)
		lapseOnce(lapsed)
		synctest.Wait()
		assertAbandoned(t, rt, behind.ID, "ended while the head still holds the queue")
		again, err := rt.SubmitSequential(ctx, "q", "behind", noop, alice)
		require.NoError(t, err)
		assert.False(t, again.Joined, "a new run, not the abandoned one")
		head.open()
		synctest.Wait()
		assert.Equal(t, StatusCompleted, mustStatus(t, rt, again.ID).Status, "the queue runs on")
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// The runs of a lease whose renewals fail are abandoned at its end; a
// submission after it renews the lease itself, and its run goes on, on
// the new lease.
func TestASubmissionThatFindsTheLeaseExpiredRunsOnTheNewOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int32
		var expired atomic.Bool
		s := &renewing{MemStore: NewMemStore(), renew: func(context.Context) (bool, error) {
			switch n := calls.Add(1); {
			case n == 2:
				time.Sleep(500 * time.Millisecond) // a slow renewal that lands
			case n > 2 && !expired.Load():
				return false, errors.New("connection refused")
			}
			return !expired.Load(), nil
		}}
		rt, first := leasedRuntime(t, s)
		// Renewals: 1 s, sent 1 s, landed 1.5 s (the lease ends at 4 s at
		// the earliest); 2.5 s and 3.5 s fail. At 4 s the loop declares
		// the lease lost, on time, though no renewal is due then.
		time.Sleep(3999 * time.Millisecond)
		synctest.Wait()
		require.Equal(t, StatusRunning, mustStatus(t, rt, first.ID).Status, "lost before the lease's end")
		time.Sleep(200 * time.Millisecond)
		synctest.Wait()
		assert.Equal(t, CauseAbandoned, mustStatus(t, rt, first.ID).Cause, "a run of the expired lease")
		expired.Store(true)
		before := calls.Load()
		later, err := rt.Submit(ctx, "later", untilCancelled, alice)
		require.NoError(t, err)
		assert.Equal(t, before+1, calls.Load(), "the submission renewed the lease")
		synctest.Wait()
		assert.Equal(t, StatusRunning, mustStatus(t, rt, later.ID).Status, "the run on the new lease")
		expired.Store(false)
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// The lease is trusted until a TTL after its last renewal was sent, not
// answered: a submission past that point waits for the renewal in
// flight, and registers on its answer without a renewal of its own.
func TestASubmissionWaitsForTheRenewalInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int32
		s := &renewing{MemStore: NewMemStore(), renew: func(context.Context) (bool, error) {
			if calls.Add(1) > 1 {
				time.Sleep(2 * time.Second) // slow, and within the TTL
			}
			return true, nil
		}}
		rt := NewRuntime(s, Config{LeaseInterval: 2500 * time.Millisecond, LeaseTTL: 3 * time.Second})
		_, err := rt.Submit(ctx, "first", untilCancelled, alice)
		require.NoError(t, err)
		// Renewals are sent at 2.5 s (landing at 4.5 s: trusted until
		// 5.5 s) and at 5 s (landing at 7 s; the next is sent at 7.5 s).
		time.Sleep(6 * time.Second)
		before, start := calls.Load(), time.Now()
		_, err = rt.Submit(ctx, "later", untilCancelled, alice)
		require.NoError(t, err)
		assert.Equal(t, time.Second, time.Since(start), "waited for the renewal sent at 5 s")
		assert.Equal(t, before, calls.Load(), "no renewal of its own")
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// The renewal that takes the lease gets a whole LeaseTTL, not one
// LeaseInterval: a store slow to answer the first call (a cold
// connection) does not fail the first submission. One that never
// answers fails it once the TTL has passed.
func TestTheFirstRenewalGetsAWholeTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int32
		s := &renewing{MemStore: NewMemStore(), renew: func(ctx context.Context) (bool, error) {
			if calls.Add(1) == 1 {
				<-ctx.Done() // the first never answers
				return false, ctx.Err()
			}
			select {
			case <-time.After(3 * time.Second): // the second is slow
			case <-ctx.Done():
				return false, ctx.Err()
			}
			return true, nil
		}}
		rt := NewRuntime(s, Config{LeaseInterval: time.Second, LeaseTTL: 5 * time.Second})
		start := time.Now()
		_, err := rt.Submit(ctx, "first", untilCancelled, alice)
		assert.ErrorContains(t, err, "did not answer a lease renewal within 5s")
		assert.Equal(t, 5*time.Second, time.Since(start))
		_, err = rt.Submit(ctx, "first", untilCancelled, alice)
		require.NoError(t, err)
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// Shutdown ends the submissions that wait to take the lease, or take it,
// from a store that does not answer (ErrClosed), and returns; none is
// left behind.
func TestShutdownEndsSubmissionsTakingTheLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &renewing{MemStore: NewMemStore(), renew: func(ctx context.Context) (bool, error) {
			<-ctx.Done() // never answers
			return false, ctx.Err()
		}}
		rt := NewRuntime(s, Config{})
		errs := make(chan error, 2)
		for _, key := range []string{"a", "b"} {
			go func() {
				_, err := rt.Submit(context.Background(), key, untilCancelled, alice)
				errs <- err
			}()
		}
		synctest.Wait() // one renews, the other waits for its turn
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		start := time.Now()
		require.NoError(t, rt.Shutdown(sctx))
		assert.Zero(t, time.Since(start))
		for range 2 {
			assert.Equal(t, ErrClosed, <-errs, "ErrClosed itself, as for any submission after Shutdown")
		}
	})
}

// Submissions still inside when Shutdown's deadline passes (in a store
// call that ignores its context) count as work left executing, each of
// them: Shutdown reports them instead of returning nil.
func TestShutdownCountsTheSubmissionsStillInside(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt, s, _, _, submitted := racerHeldInItsInsert(t)
		second := make(chan error, 1)
		go func() {
			_, err := rt.Submit(ctx, "racer2", untilCancelled, alice) // held in its insert too
			second <- err
		}()
		synctest.Wait()
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		err := rt.Shutdown(sctx)
		// The wait for the submissions took all of ctx. The two are
		// counted, and the first run too unless it settled in the instant
		// between its cancel, only then, and Shutdown's look at it.
		require.Error(t, err)
		m := regexp.MustCompile(`left (\d+) runs or goroutines executing`).FindStringSubmatch(err.Error())
		require.Len(t, m, 2, err.Error())
		assert.Contains(t, []string{"2", "3"}, m[1], "the two submissions, and perhaps the first run: %v", err)
		close(s.release)
		<-submitted
		<-second
		synctest.Wait()
	})
}

// flakyReads is a MemStore whose GetTask fails, as a dropped connection
// would, on the calls numbered from failFrom to failTo (counting from 1).
// It hides MemStore's notices, whose listener would read too.
type flakyReads struct {
	Store
	failFrom, failTo int32
	n                atomic.Int32
}

func (s *flakyReads) GetTask(ctx context.Context, id string) (Record, error) {
	if n := s.n.Add(1); n >= s.failFrom && n <= s.failTo {
		return Record{}, errors.New("connection reset by peer")
	}
	return s.Store.GetTask(ctx, id)
}

// Once Wait has read the record, a store error that may pass is retried:
// a blip does not end the Wait. A first read that fails still returns.
func TestWaitRidesOutStoreBlips(t *testing.T) {
	t.Parallel()
	s := &flakyReads{Store: NewMemStore(), failFrom: 2, failTo: 4}
	rt := newRuntime(t, s, Config{})
	g := newGate()
	sub, err := rt.Submit(ctx, "k", g.fn, alice)
	require.NoError(t, err)
	wait(t, g.started, "the callback")
	s.n.Store(0) // Wait's first read is call 1
	waited := make(chan error, 1)
	go func() {
		snap, err := rt.Wait(ctx, sub.ID, alice)
		if err == nil && snap.Status != StatusCompleted {
			err = errors.New("Wait returned " + string(snap.Status))
		}
		waited <- err
	}()
	eventually(t, func() bool { return s.n.Load() >= 1 }, "Wait's first read")
	g.open()
	select {
	case err := <-waited:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return")
	}
	assert.GreaterOrEqual(t, s.n.Load(), int32(5), "Wait read through the failures")

	s.n.Store(1) // the next read fails: it is Wait's first
	_, err = rt.Wait(ctx, sub.ID, alice)
	assert.ErrorContains(t, err, "connection reset")
}

// After a lease ran out while the store stalled, renewals get a whole
// interval again: a store that answers in 5ms renews it.
func TestRenewalsResumeAfterTheLeaseRanOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Renewals take 5ms, and hang until their context ends while
		// stalled is set.
		var stalled atomic.Bool
		var renewed atomic.Int32 // renewals that succeeded
		s := &renewing{MemStore: NewMemStore(), renew: func(ctx context.Context) (bool, error) {
			d := 5 * time.Millisecond
			if stalled.Load() {
				d = time.Hour
			}
			select {
			case <-time.After(d):
				renewed.Add(1)
				return true, nil
			case <-ctx.Done():
				return false, ctx.Err()
			}
		}}
		rt := NewRuntime(s, Config{LeaseInterval: time.Second, LeaseTTL: 3 * time.Second})
		_, err := rt.Submit(ctx, "k", noop, alice)
		require.NoError(t, err)
		stalled.Store(true)
		time.Sleep(5 * time.Second) // past the lease's end
		synctest.Wait()
		before := renewed.Load()
		stalled.Store(false)
		time.Sleep(3 * time.Second)
		assert.Greater(t, renewed.Load(), before, "no renewal succeeded once the store answered again")
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// renewing is a MemStore whose RenewLease is renew: how the lease tests
// lapse, hang or slow a lease. The rest of Leaser is MemStore's.
type renewing struct {
	*MemStore
	renew func(ctx context.Context) (bool, error)
}

func (s *renewing) RenewLease(ctx context.Context, _ string, _ time.Duration) (bool, error) {
	return s.renew(ctx)
}

// lapsing returns a store whose lease lapses once lapsed is set: every
// renewal then reports that it created a new lease.
func lapsing() (*renewing, *atomic.Bool) {
	lapsed := new(atomic.Bool)
	return &renewing{MemStore: NewMemStore(), renew: func(context.Context) (bool, error) { return !lapsed.Load(), nil }}, lapsed
}

// toMicro is UTC truncated to the microsecond, as Truncate gives it, for
// times before and after 1970, in other zones, and with a monotonic
// reading, which neither keeps.
func TestToMicroIsUTCTruncatedToTheMicrosecond(t *testing.T) {
	zone := time.FixedZone("UTC+5:30", 5*3600+1800)
	times := []time.Time{
		time.Now(),
		time.Date(2026, 12, 4, 23, 59, 59, 999_999_999, time.UTC),
		time.Date(2026, 12, 4, 10, 0, 0, 1_999, zone),
		time.Date(1969, 12, 31, 23, 59, 59, 999_999_001, time.UTC),
		time.Date(1, 1, 1, 0, 0, 0, 1_500, time.UTC),
		time.Unix(0, 0),
		time.Unix(-1, 999),
	}
	for i := range 1000 {
		times = append(times, time.Unix(int64(i)*7_919_173-3_000_000_000, int64(i)*999_983%1_000_000_000))
	}
	for _, tm := range times {
		want := tm.UTC().Truncate(time.Microsecond)
		got := toMicro(tm)
		require.True(t, got.Equal(want), "%v: got %v, want %v", tm, got, want)
		require.Equal(t, want, got, "%v: same location, no monotonic reading", tm)
	}
}

// While renewals fail at once, the lease is lost at the earliest end of
// the last renewal that landed (LeaseTTL after it was sent), when a peer
// may start recovering the runs, and not at the next interval after it.
func TestLeaseIsLostOnTimeWhileRenewalsFail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var refuse atomic.Bool
		var lastSent atomic.Int64 // when the last renewal that landed was sent, in Unix nanoseconds
		s := &renewing{MemStore: NewMemStore(), renew: func(ctx context.Context) (bool, error) {
			if refuse.Load() {
				return false, errors.New("connection refused")
			}
			sent := time.Now()
			time.Sleep(100 * time.Millisecond) // each renewal takes a while to land
			lastSent.Store(sent.UnixNano())
			return true, nil
		}}
		rt := NewRuntime(s, Config{LeaseInterval: time.Second, LeaseTTL: 3 * time.Second})
		g := newGate()
		sub, err := rt.Submit(ctx, "k", g.fn, alice)
		require.NoError(t, err)
		<-g.started
		time.Sleep(1500 * time.Millisecond) // one renewal by the loop has landed
		refuse.Store(true)
		<-g.task.Load().ctx.Done()
		end := time.Unix(0, lastSent.Load()).Add(3 * time.Second)
		assert.False(t, time.Now().After(end), "the runs were abandoned %v after the lease's earliest end", time.Since(end))
		assert.ErrorIs(t, context.Cause(g.task.Load().ctx), ErrAbandoned)
		g.open()
		_, _ = rt.Wait(ctx, sub.ID, alice)
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		_ = rt.Shutdown(sctx)
	})
}

// downStore is a renewing store whose run writes fail while down is set.
type downStore struct {
	*renewing
	down *atomic.Bool
}

func (s downStore) TransitionTask(ctx context.Context, id, runID string, from []Status, next State) (bool, error) {
	if s.down.Load() {
		return false, errors.New("connection refused")
	}
	return s.renewing.TransitionTask(ctx, id, runID, from, next)
}

// A submission never joins a run that this runtime's lost lease
// cancelled, though the run's record still says RUNNING (its abandon
// write could not land yet) and its callback still runs: it replaces it.
func TestASubmissionNeverJoinsARunItsLostLeaseCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		down := new(atomic.Bool)
		s := downStore{renewing: &renewing{MemStore: NewMemStore(), renew: func(context.Context) (bool, error) {
			if down.Load() {
				return false, errors.New("connection refused")
			}
			return true, nil
		}}, down: down}
		rt := NewRuntime(s, Config{LeaseInterval: time.Second, LeaseTTL: 3 * time.Second, Logger: slog.New(slog.DiscardHandler)})
		g := stubbornGate()
		first, err := rt.Submit(ctx, "k", g.fn, alice)
		require.NoError(t, err)
		<-g.started
		down.Store(true)
		time.Sleep(4 * time.Second) // the lease is lost; the run is abandoned, its record still RUNNING
		synctest.Wait()
		require.ErrorIs(t, g.task.Load().cause(), ErrAbandoned)
		down.Store(false)
		again, err := rt.Submit(ctx, "k", noop, alice)
		require.NoError(t, err)
		assert.False(t, again.Joined, "joined the run the lost lease cancelled")
		assert.NotEqual(t, first.RunID, again.RunID)
		g.open()
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		require.NoError(t, rt.Shutdown(sctx))
	})
}

// A callback that panics after its timeout has been recorded still has
// its panic logged with its stack: nothing else would ever report it.
func TestAPanicAfterTheTimeoutIsLogged(t *testing.T) {
	t.Parallel()
	logger, logs := bufferLogger()
	rt := newRuntime(t, NewMemStore(), Config{Logger: logger})
	release := make(chan struct{})
	ran := make(chan struct{})
	sub, err := rt.Submit(ctx, "late-panic", func(context.Context, *Task) (any, error) {
		defer close(ran)
		<-release // ignores its context
		panic("late boom")
	}, alice, WithTimeout(time.Millisecond))
	require.NoError(t, err)
	snap, err := rt.Wait(ctx, sub.ID, alice)
	require.NoError(t, err)
	require.Equal(t, CauseTimeout, snap.Cause)
	close(release)
	wait(t, ran, "the callback to panic")
	eventually(t, func() bool { return rt.runs.len() == 0 }, "the run to settle")
	assert.Contains(t, logs.String(), "task panicked")
	assert.Contains(t, logs.String(), "late boom")
}

// outcomeWritesDown fails a run's end writes, and once hanging is set,
// holds each until its context ends, as a store that went down does.
type outcomeWritesDown struct {
	Store
	hanging atomic.Bool
	hung    atomic.Int32 // end writes held now
}

func (s *outcomeWritesDown) TransitionTask(ctx context.Context, id, runID string, from []Status, next State) (bool, error) {
	if !next.Status.Terminal() {
		return s.Store.TransitionTask(ctx, id, runID, from, next)
	}
	if !s.hanging.Load() {
		return false, errors.New("connection reset")
	}
	s.hung.Add(1)
	defer s.hung.Add(-1)
	<-ctx.Done()
	return false, ctx.Err()
}

// A run's outcome write begun before Shutdown's cutoff, whose backoff
// ends just before it, gives up at its next try: the try carries the
// runtime's ended life, not the bound of its own that only a write begun
// after the cutoff (a late callback's outcome) gets, which would keep it
// in the store after Shutdown returned.
func TestAWriteBegunBeforeShutdownsCutoffIsNotTriedPastIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &outcomeWritesDown{Store: NewMemStore()}
		rt := NewRuntime(s, Config{Logger: slog.New(slog.DiscardHandler)})
		var once atomic.Bool
		rt.hooks.Store(&hooks{backedOff: func() {
			if once.CompareAndSwap(false, true) {
				s.hanging.Store(true)
				<-rt.life.Done() // the cutoff passes between the backoff and the next try
			}
		}})
		_, err := rt.Submit(context.Background(), "k", noop, alice)
		require.NoError(t, err)
		synctest.Wait() // the callback returned; its outcome write failed and backs off

		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		err = rt.Shutdown(ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		synctest.Wait()
		assert.Zero(t, s.hung.Load(), "a try of the outcome write outlived Shutdown: %v", err)
	})
}
