package workers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var ctx = context.Background()

func TestEveryTaskAPIRefusesAMissingAuthority(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	sub, err := rt.Submit(ctx, "k", noop, alice)
	require.NoError(t, err)
	settled(t, rt, sub.ID)

	var nilOwner *Owner
	for _, auth := range []TaskAuthority{nil, Owner{}, &Owner{}, nilOwner} {
		_, err := rt.Submit(ctx, "k2", noop, auth)
		assert.ErrorIs(t, err, ErrNoAuthority)
		_, err = rt.SubmitSequential(ctx, "q", "k2", noop, auth)
		assert.ErrorIs(t, err, ErrNoAuthority)
		_, err = rt.Status(ctx, sub.ID, auth)
		assert.ErrorIs(t, err, ErrNoAuthority)
		_, err = rt.List(ctx, auth)
		assert.ErrorIs(t, err, ErrNoAuthority)
		assert.ErrorIs(t, rt.Cancel(ctx, sub.ID, auth), ErrNoAuthority)
		_, err = rt.QueueStatus(ctx, "q", auth)
		assert.ErrorIs(t, err, ErrNoAuthority)
	}
	_, err = rt.Submit(ctx, "k3", noop, alice, WithWatchers(Owner{}))
	assert.ErrorIs(t, err, ErrNoAuthority, "a zero Owner is no watcher either")
	list, err := rt.List(ctx, System)
	require.NoError(t, err)
	assert.Len(t, list, 1, "no refused call created a task")
}

func TestSubmitValidatesInput(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	_, err := rt.Submit(ctx, "", noop, alice)
	assert.ErrorIs(t, err, ErrInvalidKey)
	_, err = rt.Submit(ctx, "a::b", noop, alice, WithScope(ScopeGlobal))
	assert.ErrorIs(t, err, ErrInvalidKey)
	_, err = rt.Submit(ctx, "k", nil, alice)
	assert.ErrorIs(t, err, ErrInvalidOption)
	_, err = rt.Submit(ctx, "k", noop, alice, WithTimeout(-1))
	assert.ErrorIs(t, err, ErrInvalidOption)
	_, err = rt.Submit(ctx, "k", noop, alice, WithScope(Scope(7)))
	assert.ErrorIs(t, err, ErrInvalidOption)
	_, err = rt.Submit(ctx, "k", noop, alice, WithRetry(RetryPolicy{Jitter: 2}))
	assert.ErrorIs(t, err, ErrInvalidOption)
	_, err = rt.SubmitSequential(ctx, "", "k", noop, alice)
	assert.ErrorIs(t, err, ErrInvalidKey)
	_, err = rt.Status(ctx, "bad\x00id", alice)
	assert.ErrorIs(t, err, ErrInvalidKey)
}

func TestSubmitReturnsScopedIDAndTellsStartFromJoin(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	g := newGate()
	first, err := rt.Submit(ctx, "report", g.fn, alice)
	require.NoError(t, err)
	assert.Equal(t, "alice::report", first.ID)
	assert.False(t, first.Joined)
	assert.NotEmpty(t, first.RunID)

	var calls atomic.Int32
	second, err := rt.Submit(ctx, "report", func(context.Context, *Task) (any, error) {
		calls.Add(1)
		return nil, nil
	}, alice)
	require.NoError(t, err)
	assert.True(t, second.Joined, "a live key the caller watches is joined")
	assert.Equal(t, first.ID, second.ID)
	assert.Equal(t, first.RunID, second.RunID)

	other, err := rt.Submit(ctx, "report", noop, bob)
	require.NoError(t, err)
	assert.Equal(t, "bob::report", other.ID, "user scope keeps owners apart")
	assert.False(t, other.Joined)

	g.open()
	snap := settled(t, rt, first.ID)
	assert.Equal(t, StatusCompleted, snap.Status)
	assert.Zero(t, calls.Load(), "a joiner's callback never runs")
}

func TestQueueAuthorizerIsAskedWithDefaultQueueOnTheAsyncPath(t *testing.T) {
	t.Parallel()
	s := NewMemStore()
	logger, logs := bufferLogger()
	rt := newRuntime(t, s, Config{Logger: logger})
	var asked []string
	var mu sync.Mutex
	s.SetQueueAuthorizer(func(queue, user string) bool {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, queue+"/"+user)
		return user == "alice"
	})
	_, err := rt.Submit(ctx, "k", noop, alice)
	require.NoError(t, err)
	_, err = rt.SubmitSequential(ctx, "reports", "k2", noop, alice)
	require.NoError(t, err)
	_, err = rt.Submit(ctx, "k", noop, bob)
	var ae *AuthorizationError
	require.ErrorAs(t, err, &ae)
	assert.ErrorIs(t, err, ErrUnauthorized)
	assert.Equal(t, DefaultQueue, ae.Queue)
	_, err = rt.Submit(ctx, "sys", noop, System)
	require.NoError(t, err, "System is not asked")
	mu.Lock()
	assert.Equal(t, []string{"default/alice", "reports/alice", "default/bob"}, asked)
	mu.Unlock()

	assert.Empty(t, logs.String())
	s.SetQueueAuthorizer(func(string, string) bool { panic("boom") })
	_, err = rt.Submit(ctx, "k3", noop, alice)
	assert.ErrorIs(t, err, ErrUnauthorized, "a panicking authorizer denies")
	assert.Contains(t, logs.String(), "the queue authorizer panicked", "and is logged")
	assert.Contains(t, logs.String(), "panic=boom")
	assert.Contains(t, logs.String(), "runtime_test.go", "with its stack")
}

func TestForeignJoinOfGlobalKeyNeedsWatchAuthorizer(t *testing.T) {
	t.Parallel()
	s := NewMemStore()
	logger, logs := bufferLogger()
	rt := newRuntime(t, s, Config{Logger: logger})
	g := newGate()
	sub, err := rt.Submit(ctx, "warm-cache", g.fn, alice, WithScope(ScopeGlobal))
	require.NoError(t, err)
	assert.Equal(t, "warm-cache", sub.ID)

	_, err = rt.Submit(ctx, "warm-cache", noop, bob, WithScope(ScopeGlobal))
	assert.ErrorIs(t, err, ErrUnauthorized, "nil watch authorizer denies every cross-user join")
	_, err = rt.Status(ctx, sub.ID, bob)
	assert.ErrorIs(t, err, ErrNotFound)

	s.SetWatchAuthorizer(func(string, []string, string) bool { panic("boom") })
	_, err = rt.Submit(ctx, "warm-cache", noop, bob, WithScope(ScopeGlobal))
	assert.ErrorIs(t, err, ErrUnauthorized, "a panicking watch authorizer denies")
	assert.Contains(t, logs.String(), "the watch authorizer panicked", "and is logged")
	assert.Contains(t, logs.String(), "panic=boom")

	var seen []string
	s.SetWatchAuthorizer(func(id string, watchers []string, user string) bool {
		seen = append(seen, fmt.Sprintf("%s %v %s", id, watchers, user))
		watchers[0] = "tampered" // a copy: must not reach the store
		return user == "bob"
	})
	joined, err := rt.Submit(ctx, "warm-cache", noop, bob, WithScope(ScopeGlobal))
	require.NoError(t, err)
	assert.True(t, joined.Joined)
	assert.Equal(t, []string{"warm-cache [alice] bob"}, seen)
	snap, err := rt.Status(ctx, sub.ID, bob)
	require.NoError(t, err, "an authorized joiner becomes a watcher")
	assert.Equal(t, 2, snap.WatcherCount)
	rec, err := s.GetTask(ctx, sub.ID)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"alice", "bob"}, rec.Watchers)

	_, err = rt.Submit(ctx, "warm-cache", noop, carol, WithScope(ScopeGlobal))
	assert.ErrorIs(t, err, ErrUnauthorized)
	g.open()
	settled(t, rt, sub.ID)
}

func TestFinishedGlobalKeyIsRefusedToNonWatchers(t *testing.T) {
	t.Parallel()
	s := NewMemStore()
	rt := newRuntime(t, s, Config{})
	sub, err := rt.Submit(ctx, "shared", returns("alice's result", nil), alice, WithScope(ScopeGlobal))
	require.NoError(t, err)
	settled(t, rt, sub.ID)

	_, err = rt.Submit(ctx, "shared", returns("bob's", nil), bob, WithScope(ScopeGlobal))
	require.ErrorIs(t, err, ErrUnauthorized, "re-running would discard the owner's result")
	snap, err := rt.Status(ctx, sub.ID, alice)
	require.NoError(t, err)
	got, err := ResultAs[string](snap)
	require.NoError(t, err)
	assert.Equal(t, "alice's result", got)

	s.SetWatchAuthorizer(func(_ string, _ []string, user string) bool { return user == "bob" })
	rerun, err := rt.Submit(ctx, "shared", returns("bob's", nil), bob, WithScope(ScopeGlobal))
	require.NoError(t, err)
	assert.False(t, rerun.Joined)
	settled(t, rt, sub.ID)
	_, err = rt.Status(ctx, sub.ID, alice)
	assert.ErrorIs(t, err, ErrNotFound, "a re-run resets the watchers to its submitter")
}

func TestRerunReplacesRecordAndResetsWatchers(t *testing.T) {
	t.Parallel()
	s := NewMemStore()
	rt := newRuntime(t, s, Config{})
	first, err := rt.Submit(ctx, "k", returns(1, nil), alice, WithWatchers(bob))
	require.NoError(t, err)
	settled(t, rt, first.ID)
	_, err = rt.Status(ctx, first.ID, bob)
	require.NoError(t, err, "a grant at submit lets bob read")

	second, err := rt.Submit(ctx, "k", returns(2, nil), alice, WithWatchers(carol))
	require.NoError(t, err)
	assert.False(t, second.Joined)
	assert.NotEqual(t, first.RunID, second.RunID)
	snap := settled(t, rt, first.ID)
	assert.Equal(t, second.RunID, snap.RunID)
	n, err := ResultAs[int](snap)
	require.NoError(t, err)
	assert.Equal(t, 2, n)

	rec, err := s.GetTask(ctx, first.ID)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"alice", "carol"}, rec.Watchers)
	_, err = rt.Status(ctx, first.ID, bob)
	assert.ErrorIs(t, err, ErrNotFound, "earlier grants are not carried over")
	_, err = rt.Status(ctx, first.ID, carol)
	assert.NoError(t, err)
}

// A predecessor still executing when its key is re-run is cancelled with
// ErrSuperseded, and its late write never lands on its successor's record.
func TestSupersededRunLateWriteNeverLands(t *testing.T) {
	t.Parallel()
	s := NewMemStore()
	rt := newRuntime(t, s, Config{})
	first, old, oldTask := runMarkedFinished(t, s, rt)

	fresh := newGate()
	second, err := rt.Submit(ctx, "k", fresh.fn, alice)
	require.NoError(t, err)
	require.False(t, second.Joined)
	wait(t, fresh.started, "the re-run to start: it is not stranded at PENDING")
	assert.ErrorIs(t, oldTask.CancelCause(), ErrSuperseded)

	old.open()
	wait(t, old.ran, "first callback to return")
	snap, err := rt.Status(ctx, first.ID, alice)
	require.NoError(t, err)
	assert.Equal(t, second.RunID, snap.RunID)
	assert.Equal(t, StatusRunning, snap.Status, "the superseded run's COMPLETED write was fenced out")

	fresh.open()
	snap = settled(t, rt, first.ID)
	assert.Equal(t, StatusCompleted, snap.Status)
	assert.Equal(t, second.RunID, snap.RunID)
}

// runMarkedFinished starts a stubborn run of "k" for alice, then records
// it FAILED while its callback still executes, as another process or an
// operator might. It returns the submission, the run's gate and the run.
func runMarkedFinished[S Store](t *testing.T, s S, rt *Runtime[S]) (Submission, *gate, *Task) {
	t.Helper()
	old := stubbornGate()
	first, err := rt.Submit(ctx, "k", old.fn, alice)
	require.NoError(t, err)
	wait(t, old.started, "first run")
	rec, err := s.GetTask(ctx, first.ID)
	require.NoError(t, err)
	rec.Status, rec.Error, rec.CompletedAt = StatusFailed, "marked failed elsewhere", now()
	require.NoError(t, s.SetTask(ctx, rec))
	return first, old, old.task.Load()
}

func TestNonWatcherCannotLearnThatATaskExists(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	g := newGate()
	sub, err := rt.Submit(ctx, "secret", g.fn, alice, WithScope(ScopeGlobal))
	require.NoError(t, err)
	wait(t, g.started, "callback")

	_, missingStatus := rt.Status(ctx, "no-such-task", bob)
	_, foreignStatus := rt.Status(ctx, sub.ID, bob)
	assert.ErrorIs(t, foreignStatus, ErrNotFound)
	assert.Equal(t, missingStatus, foreignStatus)

	missingCancel := rt.Cancel(ctx, "no-such-task", bob)
	foreignCancel := rt.Cancel(ctx, sub.ID, bob)
	assert.ErrorIs(t, foreignCancel, ErrNotFound)
	assert.Equal(t, missingCancel, foreignCancel)

	list, err := rt.List(ctx, bob)
	require.NoError(t, err)
	assert.Empty(t, list)

	snap, err := rt.Status(ctx, sub.ID, alice)
	require.NoError(t, err)
	assert.Equal(t, StatusRunning, snap.Status, "bob's cancel did nothing")
	g.open()
	settled(t, rt, sub.ID)
}

func TestWatchersGrantedAtSubmitMayReadListAndCancel(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	g := newGate()
	sub, err := rt.Submit(ctx, "k", g.fn, alice, WithWatchers(bob, bob, alice))
	require.NoError(t, err)
	snap, err := rt.Status(ctx, sub.ID, bob)
	require.NoError(t, err)
	assert.Equal(t, 2, snap.WatcherCount, "duplicates and the submitter are not listed twice")
	list, err := rt.List(ctx, bob)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, sub.ID, list[0].ID)
	require.NoError(t, rt.Cancel(ctx, sub.ID, bob))
	snap = settled(t, rt, sub.ID)
	assert.Equal(t, StatusCancelled, snap.Status)
}

func TestListShowsOwnTasksAndSystemSeesAll(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	var ids []string
	for i, who := range []Owner{alice, bob, alice} {
		sub, err := rt.Submit(ctx, fmt.Sprint("k", i), noop, who)
		require.NoError(t, err)
		ids = append(ids, sub.ID)
		settled(t, rt, sub.ID)
	}
	fails, err := rt.Submit(ctx, "fails", returns(nil, errors.New("nope")), alice)
	require.NoError(t, err)
	settled(t, rt, fails.ID)

	mine, err := rt.List(ctx, alice)
	require.NoError(t, err)
	assert.Equal(t, []string{fails.ID, ids[2], ids[0]}, snapshotIDs(mine), "newest first")
	mine, err = rt.List(ctx, alice, WithOrder(OldestFirst))
	require.NoError(t, err)
	assert.Equal(t, []string{ids[0], ids[2], fails.ID}, snapshotIDs(mine), "creation order")
	all, err := rt.List(ctx, System)
	require.NoError(t, err)
	assert.Len(t, all, 4)
	failed, err := rt.List(ctx, alice, WithStatus(StatusFailed))
	require.NoError(t, err)
	assert.Equal(t, []string{fails.ID}, snapshotIDs(failed))
	limited, err := rt.List(ctx, System, WithLimit(2))
	require.NoError(t, err)
	assert.Len(t, limited, 2)
	queued, err := rt.SubmitSequential(ctx, "reports", "queued", noop, alice)
	require.NoError(t, err)
	settled(t, rt, queued.ID)
	inQueue, err := rt.List(ctx, alice, WithQueue("reports"))
	require.NoError(t, err)
	assert.Equal(t, []string{queued.ID}, snapshotIDs(inQueue))
}

func snapshotIDs(s []Snapshot) []string {
	ids := make([]string, len(s))
	for i := range s {
		ids[i] = s[i].ID
	}
	return ids
}

// Cancel claims CANCELLED in the store before it cancels the context, so
// a callback that looks at its record on ctx.Done already sees the claim.
func TestCancelClaimsTheRecordBeforeCancellingTheContext(t *testing.T) {
	t.Parallel()
	s := NewMemStore()
	rt := newRuntime(t, s, Config{})
	started := make(chan struct{})
	seen := make(chan Status, 1)
	var reason error
	sub, err := rt.Submit(ctx, "k", func(ctx context.Context, tk *Task) (any, error) {
		close(started)
		<-ctx.Done()
		reason = tk.CancelCause()
		rec, err := s.GetTask(context.Background(), tk.ID())
		if err != nil {
			return nil, err
		}
		seen <- rec.Status
		return "ignored late result", nil
	}, alice)
	require.NoError(t, err)
	wait(t, started, "callback")
	require.NoError(t, rt.Cancel(ctx, sub.ID, alice))
	assert.Equal(t, StatusCancelled, <-seen)

	snap := settled(t, rt, sub.ID)
	assert.Equal(t, StatusCancelled, snap.Status)
	assert.Equal(t, "Cancelled by user", snap.Error)
	assert.Nil(t, snap.Result, "the callback's result after the claim is discarded")
	assert.ErrorIs(t, snap.Err(), ErrCancelled)
	assert.ErrorIs(t, reason, ErrCancelled)
	var te *TaskError
	require.ErrorAs(t, snap.Err(), &te)
	assert.Equal(t, StatusCancelled, te.Status)

	assert.ErrorIs(t, rt.Cancel(ctx, sub.ID, alice), ErrFinished)
}

func TestCancelPendingSequentialTaskNeverRunsIt(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	head := newGate()
	_, err := rt.SubmitSequential(ctx, "q", "head", head.fn, alice)
	require.NoError(t, err)
	wait(t, head.started, "head of queue")
	var ran atomic.Bool
	queued, err := rt.SubmitSequential(ctx, "q", "queued", func(context.Context, *Task) (any, error) {
		ran.Store(true)
		return nil, nil
	}, alice)
	require.NoError(t, err)
	require.NoError(t, rt.Cancel(ctx, queued.ID, alice))
	head.open()
	snap := settled(t, rt, queued.ID)
	assert.Equal(t, StatusCancelled, snap.Status)
	assert.Equal(t, "Cancelled by user", snap.Error, "same message on the sequential path")
	after, err := rt.SubmitSequential(ctx, "q", "after", noop, alice)
	require.NoError(t, err)
	settled(t, rt, after.ID)
	assert.False(t, ran.Load(), "a cancelled pending item is skipped")
}

func TestProgressIsLiveAndClamped(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	step := make(chan int)
	acked := make(chan struct{})
	sub, err := rt.Submit(ctx, "k", func(ctx context.Context, tk *Task) (any, error) {
		for p := range step {
			tk.SetProgress(p)
			acked <- struct{}{}
		}
		return nil, nil
	}, alice)
	require.NoError(t, err)
	for _, c := range []struct{ set, want int }{{10, 10}, {55, 55}, {150, 100}, {-3, 0}, {70, 70}} {
		step <- c.set
		<-acked
		snap, err := rt.Status(ctx, sub.ID, alice)
		require.NoError(t, err)
		assert.Equal(t, c.want, snap.Progress)
		assert.Equal(t, 1, snap.Attempt)
	}
	close(step)
	snap := settled(t, rt, sub.ID)
	assert.Equal(t, 70, snap.Progress, "the terminal record keeps the last progress")
}

func TestSnapshotCarriesTimesQueueAndWatchers(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	sub, err := rt.SubmitSequential(ctx, "reports", "k", returns(map[string]int{"rows": 3}, nil), alice, WithWatchers(bob))
	require.NoError(t, err)
	snap := settled(t, rt, sub.ID)
	assert.Equal(t, StatusCompleted, snap.Status)
	assert.Equal(t, "reports", snap.Queue)
	assert.Equal(t, 2, snap.WatcherCount)
	assert.False(t, snap.CreatedAt.IsZero())
	assert.False(t, snap.StartedAt.Before(snap.CreatedAt))
	assert.False(t, snap.CompletedAt.Before(snap.StartedAt))
	assert.JSONEq(t, `{"rows":3}`, string(snap.Result))
	assert.NoError(t, snap.Err())
	type rows struct{ Rows int }
	r, err := ResultAs[rows](snap)
	require.NoError(t, err)
	assert.Equal(t, 3, r.Rows)
	_, err = ResultAs[[]string](snap)
	assert.ErrorIs(t, err, ErrResultEncoding)
}

func TestPanicFailsTheTaskAndTheRuntimeKeepsWorking(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	for _, queue := range []string{"", "q"} {
		boom := func(context.Context, *Task) (any, error) { panic("boom") }
		sub, err := submitOn(rt, queue, "panics-"+queue, boom, alice)
		require.NoError(t, err)
		snap := settled(t, rt, sub.ID)
		assert.Equal(t, StatusFailed, snap.Status)
		assert.Contains(t, snap.Error, "boom")
		assert.Contains(t, snap.Error, "panicked")
	}
	ok, err := rt.SubmitSequential(ctx, "q", "after", returns("fine", nil), alice)
	require.NoError(t, err)
	assert.Equal(t, StatusCompleted, settled(t, rt, ok.ID).Status)
}

// A result that some store could not hold fails the run with
// ErrResultEncoding in every store alike; a deep one that every store
// holds, and brackets inside strings, do not.
func TestUnencodableResultFailsTheRun(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	nested := func(n int) json.RawMessage {
		return json.RawMessage(strings.Repeat(`{"a":[`, n) + "1" + strings.Repeat("]}", n))
	}
	for _, c := range []struct {
		name   string
		result any
		ok     bool
	}{
		{"a channel", make(chan int), false},
		{"raw JSON that is not UTF-8", json.RawMessage("\"\xff\""), false},
		{"nested 1002 deep", nested(501), false},
		{"nested 1000 deep", nested(500), true},
		{"brackets in strings", []string{strings.Repeat("[{", 2000), `\"[`}, true},
	} {
		sub, err := rt.Submit(ctx, c.name, returns(c.result, nil), alice)
		require.NoError(t, err)
		snap := settled(t, rt, sub.ID)
		if c.ok {
			assert.Equal(t, StatusCompleted, snap.Status, c.name)
			continue
		}
		assert.Equal(t, StatusFailed, snap.Status, c.name)
		assert.Contains(t, snap.Error, "result encoding", c.name)
		assert.Equal(t, 1, strings.Count(snap.Error, "result encoding"), "said once: %s", snap.Error)
		assert.ErrorIs(t, snap.Err(), ErrResultEncoding, c.name)
		assert.Nil(t, snap.Result)
		_, err = ResultAs[int](snap)
		var te *TaskError
		assert.ErrorAs(t, err, &te, "ResultAs of a failed task is its failure")
	}
}

// ResultAs of a task that did not complete says why it has no result:
// its failure, or that it has not finished.
func TestResultAsOfATaskWithoutAResult(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	sub, err := rt.Submit(ctx, "fails", returns(nil, errors.New("disk full")), alice)
	require.NoError(t, err)
	_, err = ResultAs[int](settled(t, rt, sub.ID))
	var te *TaskError
	require.ErrorAs(t, err, &te)
	assert.Equal(t, StatusFailed, te.Status)
	assert.Contains(t, te.Error(), "disk full")
	assert.NotErrorIs(t, err, ErrResultEncoding, "the callback's own failure")

	_, err = ResultAs[int](Snapshot{ID: "alice::live", Status: StatusRunning})
	assert.ErrorIs(t, err, ErrResultEncoding)
	assert.Contains(t, err.Error(), "has not finished")
}

func TestCallbackErrorFailsTheTask(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	sub, err := rt.Submit(ctx, "k", returns(nil, errors.New("disk full")), alice)
	require.NoError(t, err)
	snap := settled(t, rt, sub.ID)
	assert.Equal(t, StatusFailed, snap.Status)
	assert.Equal(t, "disk full", snap.Error)
	assert.EqualError(t, snap.Err(), `workers: task "alice::k" failed: disk full`)
	assert.Nil(t, errors.Unwrap(snap.Err()))
}

// A callback's error is recorded up to MaxErrorLen bytes, cut at a
// character's start.
func TestALongCallbackErrorIsTruncated(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	long := "x" + strings.Repeat("é", MaxErrorLen) // two bytes each, after one: MaxErrorLen falls inside an é
	sub, err := rt.Submit(ctx, "k", returns(nil, errors.New(long)), alice)
	require.NoError(t, err)
	snap := settled(t, rt, sub.ID)
	assert.Equal(t, StatusFailed, snap.Status)
	assert.Equal(t, long[:MaxErrorLen-1], snap.Error)
}

// Many callers joining one global key at once: every grant survives.
func TestConcurrentJoinsLoseNoWatcher(t *testing.T) {
	t.Parallel()
	s := NewMemStore()
	rt := newRuntime(t, s, Config{})
	s.SetWatchAuthorizer(func(string, []string, string) bool { return true })
	g := newGate()
	sub, err := rt.Submit(ctx, "shared", g.fn, alice, WithScope(ScopeGlobal))
	require.NoError(t, err)
	const n = 32
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, err := rt.Submit(ctx, "shared", noop, MustOwner(fmt.Sprint("user", i)), WithScope(ScopeGlobal))
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	rec, err := s.GetTask(ctx, sub.ID)
	require.NoError(t, err)
	assert.Len(t, rec.Watchers, n+1)
	assert.True(t, slices.Contains(rec.Watchers, "user7"))
	g.open()
	settled(t, rt, sub.ID)
}

// The ctx passed to a call bounds its store calls: a done one fails the
// call, as it would against a SQL store, and the run never depends on it.
func TestCallerContextBoundsOnlyTheCall(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	done, cancel := context.WithCancel(ctx)
	cancel()
	_, err := rt.Submit(done, "k", noop, alice)
	assert.ErrorIs(t, err, context.Canceled)
	list, err := rt.List(ctx, System)
	require.NoError(t, err)
	assert.Empty(t, list, "a failed submission created nothing")

	callCtx, cancelCall := context.WithCancel(ctx)
	g := newGate()
	sub, err := rt.Submit(callCtx, "k", g.fn, alice)
	require.NoError(t, err)
	cancelCall() // the request that submitted it is gone
	wait(t, g.started, "callback")
	g.open()
	assert.Equal(t, StatusCompleted, settled(t, rt, sub.ID).Status, "the run outlives the submitting context")
}

func TestWaitReturnsTheFinalSnapshot(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	g := newGate()
	sub, err := rt.Submit(ctx, "k", g.fn, alice)
	require.NoError(t, err)

	_, err = rt.Wait(ctx, sub.ID, bob)
	assert.ErrorIs(t, err, ErrNotFound, "a non-watcher cannot wait either")
	short, cancel := context.WithCancel(ctx)
	cancel()
	_, err = rt.Wait(short, sub.ID, alice)
	assert.ErrorIs(t, err, context.Canceled)

	got := make(chan Snapshot)
	go func() {
		snap, err := rt.Wait(ctx, sub.ID, alice)
		assert.NoError(t, err)
		got <- snap
	}()
	g.open()
	snap := <-got
	assert.Equal(t, StatusCompleted, snap.Status)
	assert.JSONEq(t, `"released"`, string(snap.Result))
}

func TestWaitFollowsATaskAnotherRuntimeRuns(t *testing.T) {
	t.Parallel()
	s := NewMemStore()
	runner := newRuntime(t, s, Config{})
	watcher := newRuntime(t, s, Config{})
	g := newGate()
	sub, err := runner.Submit(ctx, "k", g.fn, alice)
	require.NoError(t, err)
	wait(t, g.started, "callback")
	got := make(chan Snapshot)
	go func() {
		snap, err := watcher.Wait(ctx, sub.ID, alice)
		assert.NoError(t, err)
		got <- snap
	}()
	g.open()
	select {
	case snap := <-got:
		assert.Equal(t, StatusCompleted, snap.Status)
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not see the other runtime's task end")
	}
}

// A SubmitOption is a value a service builds once and passes to
// concurrent submissions: applying it must not write what it captured.
func TestSubmitOptionsMayBeSharedAcrossGoroutines(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	shared := []SubmitOption{WithRetry(RetryPolicy{MaxAttempts: 2}), WithTimeout(time.Minute), WithWatchers(bob), WithScope(ScopeUser)}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			sub, err := rt.Submit(ctx, fmt.Sprint("k", i), noop, alice, shared...)
			assert.NoError(t, err)
			settled(t, rt, sub.ID)
		})
	}
	wg.Wait()
}

// Status never reports a run's attempt below its record's: a run
// registered RUNNING is in attempt 1 even before its goroutine begins it.
// (A live attempt behind the record made Watch yield a second RUNNING
// snapshot at the same progress once the run began.)
func TestStatusOfARunRegisteredRunningSaysItsFirstAttempt(t *testing.T) {
	rt := memRuntime(t)
	g := newGate()
	defer g.open()
	for i := range 200 {
		sub, err := rt.Submit(ctx, fmt.Sprint("k", i), g.fn, alice)
		require.NoError(t, err)
		snap, err := rt.Status(ctx, sub.ID, alice)
		require.NoError(t, err)
		require.Equal(t, StatusRunning, snap.Status)
		require.Equal(t, 1, snap.Attempt, "submission %d", i)
	}
}

// A run is registered as of its submission, over a MemStore (whose
// records the runtime builds) and over any other store (which is given a
// Record): its record's CreatedAt, and the start of an async run, which
// starts as it is registered, fall within the Submit call.
func TestARunIsRegisteredAsOfItsSubmission(t *testing.T) {
	type otherStore struct{ Store }
	for name, store := range map[string]Store{"MemStore": NewMemStore(), "another store": otherStore{NewMemStore()}} {
		t.Run(name, func(t *testing.T) {
			rt := newRuntime(t, store, Config{})
			for _, queue := range []string{"", "q"} {
				before := time.Now().Truncate(time.Microsecond)
				sub, err := submitOn(rt, queue, "k-"+queue, noop, alice)
				require.NoError(t, err)
				after := time.Now()
				rec, err := store.GetTask(ctx, sub.ID)
				require.NoError(t, err)
				assert.False(t, rec.CreatedAt.Before(before) || rec.CreatedAt.After(after),
					"%s: created %v, submitted between %v and %v", sub.ID, rec.CreatedAt, before, after)
				if queue == "" {
					assert.Equal(t, rec.CreatedAt, rec.StartedAt, "an async run starts as it is registered")
				}
				settled(t, rt, sub.ID)
			}
		})
	}
}

// A run's registration time is read once the submission may go ahead:
// after admission asked for the owner's limits, which may take a while,
// so that an async run's start and duration leave that wait out.
func TestARunIsRegisteredAfterItsAdmission(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var asked time.Time
		rt := newRuntime(t, NewMemStore(), Config{Limits: Limits{OwnerLimits: func(context.Context, Owner) (OwnerLimits, error) {
			time.Sleep(time.Second) // a slow lookup of the owner's plan
			asked = time.Now()
			return OwnerLimits{}, nil
		}}})
		sub, err := rt.Submit(ctx, "k", noop, alice)
		require.NoError(t, err)
		rec, err := rt.Store().GetTask(ctx, sub.ID)
		require.NoError(t, err)
		assert.False(t, rec.CreatedAt.Before(asked.Truncate(time.Microsecond)), "created %v, before admission answered at %v", rec.CreatedAt, asked)
		assert.Equal(t, rec.CreatedAt, rec.StartedAt)
		settled(t, rt, sub.ID)
	})
}

// A run's registering write over a MemStore fails before it lands when
// the submission's ctx ends after the lease check: nothing is stored,
// the callback never runs, and the retired run settles.
func TestRegisteringWriteOverAMemStoreFailsBeforeLanding(t *testing.T) {
	rt := memRuntime(t)
	sub, err := rt.Submit(ctx, "warm", noop, alice) // the lease is taken
	require.NoError(t, err)
	settled(t, rt, sub.ID)

	call, cancel := context.WithCancel(ctx)
	rt.hooks.Store(&hooks{leaseRead: cancel}) // the lease was live; the call ends now
	var ran atomic.Bool
	_, err = rt.Submit(call, "k", func(context.Context, *Task) (any, error) { ran.Store(true); return nil, nil }, alice)
	rt.hooks.Store(nil)
	require.ErrorIs(t, err, context.Canceled)
	_, err = rt.Store().GetTask(ctx, "alice::k")
	require.ErrorIs(t, err, ErrNotFound, "the failed insert stored nothing")
	eventually(t, func() bool { return rt.runs.len() == 0 }, "the retired run to settle")
	assert.False(t, ran.Load(), "the callback never ran")
}

// A submission whose context has ended says so, and nothing of the
// instance lease it could not take, over any store.
func TestASubmissionWithAnEndedContextSaysSo(t *testing.T) {
	t.Parallel()
	rt := newRuntime(t, NewMemStore(), Config{})
	done, cancel := context.WithCancel(ctx)
	cancel()
	_, err := rt.Submit(done, "k", noop, alice)
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, context.Canceled.Error(), err.Error())
}
