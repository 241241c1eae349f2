package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// handoverReplica returns a started runtime over a store of its own pool
// in sc's schema, as another process's would be, shut down in t's
// cleanup if the test did not.
func handoverReplica(t *testing.T, sc scratch, cfg workers.Config) *workers.Runtime[workers.Store] {
	t.Helper()
	var s workers.Store = sc.ownStore(t, nil)
	rt := workers.NewRuntime(s, cfg)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = rt.Shutdown(ctx)
	})
	if err := rt.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	return rt
}

// onCtx is a callback that counts its calls, closes started (once) and
// returns its context's cause when that ends.
func onCtx(calls *atomic.Int32, started chan struct{}) workers.Func {
	var once sync.Once
	return func(ctx context.Context, _ *workers.Task) (any, error) {
		calls.Add(1)
		once.Do(func() { close(started) })
		<-ctx.Done()
		return nil, context.Cause(ctx)
	}
}

// A rolling deploy over PostgreSQL: replica A shuts down within a bound
// while it runs async tasks, a sequential queue with one item running and
// others waiting, a task waiting out a retry backoff, a task B watches
// and waits on, and a task B cancels; B keeps submitting, and replica C
// starts after A. Every task ends once with the cause the README gives
// it, B's waits and watches end with the record's end, B's queue keeps
// its order, and A's Shutdown returns nil within its bound.
func TestRollingDeployHandsOverEveryKindOfRun(t *testing.T) {
	testDSN(t)
	t.Parallel()
	sc := newScratchT(t)
	sc.store(t) // migrated once
	cfg := workers.Config{LeaseInterval: 50 * time.Millisecond, LeaseTTL: 3 * time.Second, RecoverInterval: 50 * time.Millisecond}
	a := handoverReplica(t, sc, cfg)
	b := handoverReplica(t, sc, cfg)
	ctx, cancelAll := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancelAll()
	alice := workers.MustOwner("alice")

	type run struct {
		id      string
		calls   atomic.Int32
		started chan struct{}
	}
	newRun := func() *run { return &run{started: make(chan struct{})} }
	submitA := func(r *run, key string, fn workers.Func, opts ...workers.SubmitOption) {
		t.Helper()
		sub, err := a.Submit(ctx, key, fn, alice, opts...)
		if err != nil {
			t.Fatal(err)
		}
		r.id = sub.ID
	}

	// Finishes by itself once A's Shutdown has begun, inside the grace.
	finishing, finish := newRun(), make(chan struct{})
	submitA(finishing, "finishing", func(ctx context.Context, _ *workers.Task) (any, error) {
		finishing.calls.Add(1)
		close(finishing.started)
		<-finish
		return "finished", nil
	})
	// Runs until its context ends.
	plain := newRun()
	submitA(plain, "plain", onCtx(&plain.calls, plain.started))
	// Fails its first attempt and waits out a long backoff.
	backoff := newRun()
	var failedOnce sync.Once
	submitA(backoff, "backoff", func(ctx context.Context, _ *workers.Task) (any, error) {
		backoff.calls.Add(1)
		failedOnce.Do(func() { close(backoff.started) })
		return nil, errors.New("flaky")
	}, workers.WithRetry(workers.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Minute, Jitter: workers.NoJitter}))
	// B watches and waits on it.
	watched := newRun()
	submitA(watched, "watched", onCtx(&watched.calls, watched.started))
	// B cancels it while A shuts down.
	cancelled := newRun()
	causes := make(chan error, 1)
	submitA(cancelled, "cancelled", func(ctx context.Context, _ *workers.Task) (any, error) {
		cancelled.calls.Add(1)
		close(cancelled.started)
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return nil, context.Cause(ctx)
	})
	// A's sequential queue: one item running, three waiting.
	var seqCalls [4]atomic.Int32
	seqStarted := make(chan struct{})
	var seqIDs []string
	for i := range 4 {
		fn := func(ctx context.Context, _ *workers.Task) (any, error) {
			seqCalls[i].Add(1)
			if i == 0 {
				close(seqStarted)
			}
			<-ctx.Done()
			return nil, context.Cause(ctx)
		}
		sub, err := a.SubmitSequential(ctx, "q", fmt.Sprintf("q%d", i), fn, alice)
		if err != nil {
			t.Fatal(err)
		}
		seqIDs = append(seqIDs, sub.ID)
	}
	for _, r := range []*run{finishing, plain, backoff, watched, cancelled} {
		select {
		case <-r.started:
		case <-ctx.Done():
			t.Fatalf("%s never started", r.id)
		}
	}
	<-seqStarted
	// The backoff run is waiting out its backoff once its record says
	// attempt 1 failed and a retry is due: wait for attempt 1's end.
	waitFor(t, func() bool { return backoff.calls.Load() == 1 })

	// B joins plain, waits on watched and follows it.
	joined, err := b.Submit(ctx, "plain", func(context.Context, *workers.Task) (any, error) {
		t.Error("the join's callback ran")
		return nil, nil
	}, alice)
	if err != nil || !joined.Joined || joined.ID != plain.id {
		t.Fatalf("B's join of plain: %+v, %v", joined, err)
	}
	type waited struct {
		snap workers.Snapshot
		err  error
		at   time.Time
	}
	waits := map[string]chan waited{}
	for _, id := range []string{finishing.id, plain.id, backoff.id, watched.id, cancelled.id, seqIDs[0], seqIDs[1]} {
		ch := make(chan waited, 1)
		waits[id] = ch
		go func() {
			snap, err := b.Wait(ctx, id, alice)
			ch <- waited{snap, err, time.Now()}
		}()
	}
	watchDone := make(chan []workers.Snapshot, 1)
	watchReady := make(chan struct{})
	go func() {
		var seen []workers.Snapshot
		first := true
		for snap, err := range b.Watch(ctx, watched.id, alice) {
			if first {
				close(watchReady)
				first = false
			}
			if err != nil {
				t.Errorf("B's Watch: %v", err)
				break
			}
			seen = append(seen, snap)
		}
		watchDone <- seen
	}()
	<-watchReady

	// B keeps submitting to its own queue q while A shuts down and C
	// starts: its items run in their order.
	var bOrderMu sync.Mutex
	var bOrder []int
	bSubmitted := make(chan []string, 1)
	stopB := make(chan struct{})
	go func() {
		var ids []string
		defer func() { bSubmitted <- ids }()
		for i := 0; ; i++ {
			select {
			case <-stopB:
				return
			default:
			}
			sub, err := b.SubmitSequential(ctx, "q", fmt.Sprintf("b%d", i), func(context.Context, *workers.Task) (any, error) {
				bOrderMu.Lock()
				bOrder = append(bOrder, i)
				bOrderMu.Unlock()
				return i, nil
			}, alice)
			if err != nil {
				t.Errorf("B's submission %d: %v", i, err)
				return
			}
			ids = append(ids, sub.ID)
		}
	}()

	// A shuts down; B cancels one of its runs once it has begun.
	shutCtx, cancelShut := context.WithTimeout(ctx, 4*time.Second)
	defer cancelShut()
	shutErr := make(chan error, 1)
	begun := time.Now()
	go func() { shutErr <- a.Shutdown(shutCtx) }()
	waitFor(t, func() bool { return errors.Is(a.Ready(ctx), workers.ErrClosed) })
	close(finish)
	if err := b.Cancel(ctx, cancelled.id, alice, workers.WithReason("deploy test")); err != nil {
		t.Errorf("B's Cancel of A's run: %v", err)
	}
	var shutdownErr error
	select {
	case shutdownErr = <-shutErr:
	case <-time.After(6 * time.Second):
		t.Fatal("A's Shutdown did not return within its bound")
	}
	took := time.Since(begun)
	if shutdownErr != nil {
		t.Errorf("A's Shutdown: %v", shutdownErr)
	}
	if took > 4*time.Second+time.Second {
		t.Errorf("A's Shutdown took %v, bound 4s", took)
	}
	shutAt := time.Now()

	// C starts while B keeps submitting.
	c := handoverReplica(t, sc, cfg)
	post := make([]string, 0, 5)
	for i := range 5 {
		sub, err := c.Submit(ctx, fmt.Sprintf("post%d", i), func(context.Context, *workers.Task) (any, error) { return i, nil }, alice)
		if err != nil {
			t.Fatal(err)
		}
		post = append(post, sub.ID)
	}
	close(stopB)
	bIDs := <-bSubmitted

	want := map[string]struct {
		status workers.Status
		cause  workers.Cause
	}{
		finishing.id: {workers.StatusCompleted, workers.CauseCompleted},
		plain.id:     {workers.StatusCancelled, workers.CauseShutdown},
		backoff.id:   {workers.StatusCancelled, workers.CauseShutdown},
		watched.id:   {workers.StatusCancelled, workers.CauseShutdown},
		cancelled.id: {workers.StatusCancelled, workers.CauseCancelled},
	}
	for _, id := range seqIDs {
		want[id] = struct {
			status workers.Status
			cause  workers.Cause
		}{workers.StatusCancelled, workers.CauseShutdown}
	}
	for id, w := range want {
		snap, err := c.Status(ctx, id, alice)
		if err != nil {
			t.Errorf("%s: %v", id, err)
			continue
		}
		if snap.Status != w.status || snap.Cause != w.cause {
			t.Errorf("%s ended %s (%s, %q), want %s (%s)", id, snap.Status, snap.Cause, snap.Error, w.status, w.cause)
		}
	}
	for id, ch := range waits {
		select {
		case w := <-ch:
			if w.err != nil {
				t.Errorf("B's Wait on %s: %v", id, w.err)
				continue
			}
			if !w.snap.Status.Terminal() || w.snap.Cause != want[id].cause {
				t.Errorf("B's Wait on %s returned %s (%s), want %s", id, w.snap.Status, w.snap.Cause, want[id].cause)
			}
			t.Logf("B's Wait on %s returned %v after its record's end, %v after A's Shutdown returned", id, w.at.Sub(w.snap.CompletedAt), w.at.Sub(shutAt))
			if d := w.at.Sub(shutAt); d > 2*time.Second {
				t.Errorf("B's Wait on %s returned %v after A's Shutdown", id, d)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("B's Wait on %s did not return within 5s of A's Shutdown", id)
		}
	}
	select {
	case seen := <-watchDone:
		if len(seen) == 0 {
			t.Fatal("B's Watch saw nothing")
		}
		last := seen[len(seen)-1]
		if last.Status != workers.StatusCancelled || last.Cause != workers.CauseShutdown {
			t.Errorf("B's Watch ended on %s (%s), want CANCELLED (shutdown)", last.Status, last.Cause)
		}
		for _, s := range seen[:len(seen)-1] {
			if s.Status.Terminal() {
				t.Errorf("B's Watch saw a terminal snapshot before its last: %+v", seen)
			}
		}
	case <-time.After(5 * time.Second):
		t.Error("B's Watch did not end within 5s of A's Shutdown")
	}
	if cause := <-causes; !errors.Is(cause, workers.ErrCancelled) {
		t.Errorf("the run B cancelled saw %v, want ErrCancelled", cause)
	}
	for _, r := range []*run{finishing, plain, watched, cancelled} {
		if n := r.calls.Load(); n != 1 {
			t.Errorf("%s's callback ran %d times", r.id, n)
		}
	}
	if n := backoff.calls.Load(); n != 1 {
		t.Errorf("the backoff run's callback ran %d times, want 1 (no attempt after Shutdown)", n)
	}
	for i := range seqCalls {
		want := int32(0)
		if i == 0 {
			want = 1
		}
		if n := seqCalls[i].Load(); n != want {
			t.Errorf("queue item q%d ran %d times, want %d", i, n, want)
		}
	}
	for _, id := range append(slices.Clone(post), bIDs...) {
		snap, err := c.Wait(ctx, id, alice)
		if err != nil || snap.Status != workers.StatusCompleted {
			t.Errorf("%s: %s (%s), %v; want COMPLETED", id, snap.Status, snap.Error, err)
		}
	}
	bOrderMu.Lock()
	defer bOrderMu.Unlock()
	if len(bOrder) != len(bIDs) || !slices.IsSorted(bOrder) {
		t.Errorf("B's queue ran %v of %d items, want them once each in order", bOrder, len(bIDs))
	}
}

// A rolling deploy whose Shutdown runs out of time: A's async run and
// queue item ignore their contexts. Shutdown returns within its bound
// and names them; the items waiting behind in A's queue, and a run in
// its backoff, end CANCELLED (shutdown) at once; once A's unreleased
// lease expires, the recovery of a replica (C, started after A) ends
// the stubborn records FAILED (abandoned), B's Wait and Watch on them
// end with that, and the callbacks' late results do not land.
func TestRollingDeployOutOfTimeLeavesRecordsToRecovery(t *testing.T) {
	testDSN(t)
	t.Parallel()
	sc := newScratchT(t)
	sc.store(t)
	cfg := workers.Config{LeaseInterval: 50 * time.Millisecond, LeaseTTL: time.Second, RecoverInterval: 50 * time.Millisecond}
	a := handoverReplica(t, sc, cfg)
	b := handoverReplica(t, sc, cfg)
	ctx, cancelAll := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancelAll()
	alice := workers.MustOwner("alice")

	release := make(chan struct{})
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	var stubbornCalls, seqCalls, backoffCalls atomic.Int32
	stubbornStarted, seqStarted := make(chan struct{}), make(chan struct{})
	stubborn, err := a.Submit(ctx, "stubborn", func(ctx context.Context, _ *workers.Task) (any, error) {
		stubbornCalls.Add(1)
		close(stubbornStarted)
		<-release
		return "late", nil
	}, alice)
	if err != nil {
		t.Fatal(err)
	}
	backoff, err := a.Submit(ctx, "backoff", func(context.Context, *workers.Task) (any, error) {
		backoffCalls.Add(1)
		return nil, errors.New("flaky")
	}, alice, workers.WithRetry(workers.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Minute, Jitter: workers.NoJitter}))
	if err != nil {
		t.Fatal(err)
	}
	var seqIDs []string
	for i := range 3 {
		sub, err := a.SubmitSequential(ctx, "q", fmt.Sprintf("q%d", i), func(ctx context.Context, _ *workers.Task) (any, error) {
			seqCalls.Add(1)
			if i == 0 {
				close(seqStarted)
				<-release
				return "late", nil
			}
			return "ran", nil
		}, alice)
		if err != nil {
			t.Fatal(err)
		}
		seqIDs = append(seqIDs, sub.ID)
	}
	<-stubbornStarted
	<-seqStarted
	waitFor(t, func() bool { return backoffCalls.Load() == 1 })

	type waited struct {
		snap workers.Snapshot
		err  error
	}
	waits := map[string]chan waited{}
	for _, id := range []string{stubborn.ID, backoff.ID, seqIDs[0], seqIDs[1], seqIDs[2]} {
		ch := make(chan waited, 1)
		waits[id] = ch
		go func() {
			snap, err := b.Wait(ctx, id, alice)
			ch <- waited{snap, err}
		}()
	}
	watchDone := make(chan []workers.Snapshot, 1)
	go func() {
		var seen []workers.Snapshot
		for snap, err := range b.Watch(ctx, seqIDs[0], alice) {
			if err != nil {
				t.Errorf("B's Watch: %v", err)
				break
			}
			seen = append(seen, snap)
		}
		watchDone <- seen
	}()

	shutCtx, cancelShut := context.WithTimeout(ctx, 600*time.Millisecond)
	defer cancelShut()
	begun := time.Now()
	shutErr := a.Shutdown(shutCtx)
	if took := time.Since(begun); took > 600*time.Millisecond+500*time.Millisecond {
		t.Errorf("A's Shutdown took %v, bound 600ms", took)
	}
	var se *workers.ShutdownError
	if !errors.As(shutErr, &se) || !errors.Is(shutErr, context.DeadlineExceeded) {
		t.Fatalf("A's Shutdown: %v, want a *ShutdownError wrapping context.DeadlineExceeded", shutErr)
	}
	if se.Executing != 2 || !slices.Equal(se.ExecutingIDs, []string{seqIDs[0], stubborn.ID}) || se.Unwritten != 0 {
		t.Errorf("A's Shutdown left %d executing %v, %d unwritten %v; want the two stubborn runs executing",
			se.Executing, se.ExecutingIDs, se.Unwritten, se.UnwrittenIDs)
	}
	// The queue's backlog and the backoff run were recorded as A began.
	for _, id := range []string{backoff.ID, seqIDs[1], seqIDs[2]} {
		snap, err := b.Status(ctx, id, alice)
		if err != nil || snap.Status != workers.StatusCancelled || snap.Cause != workers.CauseShutdown {
			t.Errorf("%s after A's Shutdown: %s (%s), %v; want CANCELLED (shutdown)", id, snap.Status, snap.Cause, err)
		}
	}

	c := handoverReplica(t, sc, cfg)
	for _, id := range []string{stubborn.ID, seqIDs[0]} {
		snap := endedIn(t, c, id)
		if snap.Status != workers.StatusFailed || snap.Cause != workers.CauseAbandoned {
			t.Errorf("%s once A's lease expired: %s (%s); want FAILED (abandoned)", id, snap.Status, snap.Cause)
		}
	}
	for id, ch := range waits {
		select {
		case w := <-ch:
			snap, err := c.Status(ctx, id, alice)
			if w.err != nil || err != nil || w.snap.Status != snap.Status || w.snap.Cause != snap.Cause {
				t.Errorf("B's Wait on %s: %s (%s), %v; the record says %s (%s)", id, w.snap.Status, w.snap.Cause, w.err, snap.Status, snap.Cause)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("B's Wait on %s did not return within 5s of its record's end", id)
		}
	}
	select {
	case seen := <-watchDone:
		if len(seen) == 0 || seen[len(seen)-1].Cause != workers.CauseAbandoned {
			t.Errorf("B's Watch of the stubborn queue item saw %+v, want it to end abandoned", seen)
		}
	case <-time.After(5 * time.Second):
		t.Error("B's Watch did not end within 5s of its record's end")
	}

	// The callbacks return: their results are fenced out, and the
	// runtime, asked again, lets them go.
	close(release)
	released = true
	again, cancelAgain := context.WithTimeout(ctx, 10*time.Second)
	defer cancelAgain()
	if err := a.Shutdown(again); err != nil {
		t.Errorf("A's second Shutdown, the callbacks returned: %v", err)
	}
	for _, id := range []string{stubborn.ID, seqIDs[0]} {
		snap, err := c.Status(ctx, id, alice)
		if err != nil || snap.Status != workers.StatusFailed || snap.Cause != workers.CauseAbandoned {
			t.Errorf("%s after its callback returned: %s (%s), %v; want FAILED (abandoned) kept", id, snap.Status, snap.Cause, err)
		}
	}
	if n := seqCalls.Load(); n != 1 {
		t.Errorf("A's queue ran %d items, want 1: the backlog never starts", n)
	}
	if n := backoffCalls.Load(); n != 1 {
		t.Errorf("the backoff run made %d attempts, want 1", n)
	}
	// The keys run again on C.
	for _, key := range []string{"stubborn", "q0"} {
		sub, err := c.Submit(ctx, key, func(context.Context, *workers.Task) (any, error) { return "again", nil }, alice)
		if err != nil || sub.Joined {
			t.Fatalf("C's re-run of %s: %+v, %v", key, sub, err)
		}
		if snap, err := c.Wait(ctx, sub.ID, alice); err != nil || snap.Status != workers.StatusCompleted {
			t.Errorf("C's re-run of %s: %s, %v", key, snap.Status, err)
		}
	}
}

// endedIn waits until id's record is terminal and returns it.
func endedIn(t *testing.T, rt *workers.Runtime[workers.Store], id string) workers.Snapshot {
	t.Helper()
	var snap workers.Snapshot
	waitFor(t, func() bool {
		var err error
		snap, err = rt.Status(t.Context(), id, workers.System)
		if err != nil {
			t.Fatal(err)
		}
		return snap.Status.Terminal()
	})
	return snap
}

// A deploy told not to wait (an ended ctx), over a queue whose running
// item waits out a retry backoff, with items behind it that B cancels or
// joins, and async runs that answer their cancel at once: Shutdown
// returns at once, and each record ends with its own cause: the user's
// cancel where B's came first, the shutdown's everywhere else, never
// abandoned, even once A's unreleased lease expires.
func TestRollingDeployNotWaitingRecordsEachRunsOwnCause(t *testing.T) {
	testDSN(t)
	t.Parallel()
	sc := newScratchT(t)
	sc.store(t)
	cfg := workers.Config{LeaseInterval: 50 * time.Millisecond, LeaseTTL: time.Second, RecoverInterval: 50 * time.Millisecond}
	a := handoverReplica(t, sc, cfg)
	b := handoverReplica(t, sc, cfg)
	ctx, cancelAll := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancelAll()
	alice := workers.MustOwner("alice")

	var first atomic.Int32
	var later atomic.Int32
	head, err := a.SubmitSequential(ctx, "q", "head", func(ctx context.Context, _ *workers.Task) (any, error) {
		first.Add(1)
		return nil, errors.New("flaky")
	}, alice, workers.WithRetry(workers.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Minute, Jitter: workers.NoJitter}))
	if err != nil {
		t.Fatal(err)
	}
	var behind []string
	for i := range 4 {
		sub, err := a.SubmitSequential(ctx, "q", fmt.Sprintf("behind%d", i), func(context.Context, *workers.Task) (any, error) {
			later.Add(1)
			return "ran", nil
		}, alice)
		if err != nil {
			t.Fatal(err)
		}
		behind = append(behind, sub.ID)
	}
	var async []string
	var asyncStarted sync.WaitGroup
	for i := range 3 {
		asyncStarted.Add(1)
		sub, err := a.Submit(ctx, fmt.Sprintf("async%d", i), func(ctx context.Context, _ *workers.Task) (any, error) {
			asyncStarted.Done()
			<-ctx.Done()
			return nil, context.Cause(ctx)
		}, alice)
		if err != nil {
			t.Fatal(err)
		}
		async = append(async, sub.ID)
	}
	asyncStarted.Wait()
	waitFor(t, func() bool { return first.Load() == 1 })
	// B joins one waiting item and cancels another, before A shuts down.
	join, err := b.SubmitSequential(ctx, "q", "behind1", func(context.Context, *workers.Task) (any, error) {
		t.Error("the join's callback ran")
		return nil, nil
	}, alice)
	if err != nil || !join.Joined {
		t.Fatalf("B's join of a waiting item: %+v, %v", join, err)
	}
	if err := b.Cancel(ctx, behind[2], alice); err != nil {
		t.Fatal(err)
	}
	joinWait := make(chan workers.Snapshot, 1)
	go func() {
		snap, err := b.Wait(ctx, join.ID, alice)
		if err != nil {
			t.Errorf("B's Wait on the joined item: %v", err)
		}
		joinWait <- snap
	}()

	done, stop := context.WithCancel(ctx)
	stop()
	begun := time.Now()
	shutErr := a.Shutdown(done)
	if took := time.Since(begun); took > 500*time.Millisecond {
		t.Errorf("A's Shutdown, told not to wait, took %v", took)
	}
	t.Logf("A's Shutdown: %v", shutErr)

	c := handoverReplica(t, sc, cfg)
	want := map[string]workers.Cause{head.ID: workers.CauseShutdown, behind[0]: workers.CauseShutdown,
		behind[1]: workers.CauseShutdown, behind[2]: workers.CauseCancelled, behind[3]: workers.CauseShutdown}
	for _, id := range async {
		want[id] = workers.CauseShutdown
	}
	for id := range want {
		endedIn(t, c, id)
	}
	// Once A's lease is over, a record it left live would be recovered:
	// a pass of C's recovery then finds none.
	instanceA := workers.InstanceOf(head.RunID)
	waitFor(t, func() bool {
		live, err := c.Store().(workers.Leaser).LiveInstances(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return !slices.Contains(live, instanceA)
	})
	if n, err := c.RecoverZombies(ctx); err != nil || n != 0 {
		t.Errorf("C's recovery past A's lease ended %d records (%v), want none: A left none live", n, err)
	}
	for id, cause := range want {
		snap, err := c.Status(ctx, id, alice)
		if err != nil || snap.Cause != cause {
			t.Errorf("%s: %s (%s, %q), %v; want %s", id, snap.Status, snap.Cause, snap.Error, err, cause)
		}
	}
	select {
	case snap := <-joinWait:
		if snap.Cause != workers.CauseShutdown {
			t.Errorf("B's Wait on the item it joined: %s (%s), want CANCELLED (shutdown)", snap.Status, snap.Cause)
		}
	case <-time.After(5 * time.Second):
		t.Error("B's Wait on the item it joined did not return")
	}
	if n := first.Load(); n != 1 {
		t.Errorf("the head of the queue made %d attempts, want 1", n)
	}
	if n := later.Load(); n != 0 {
		t.Errorf("%d items behind the head ran after A's Shutdown", n)
	}
}

// A rolling deploy of many runs of every kind at once, B cancelling some
// of A's while A shuts down: each record ends once, with the cause its
// run's fate gives it, each queue of A runs its items in order, B's
// waits end with the records, and A's Shutdown names exactly the runs
// whose callbacks outlived it.
func TestRollingDeployMixed(t *testing.T) {
	testDSN(t)
	t.Parallel()
	sc := newScratchT(t)
	sc.store(t)
	cfg := workers.Config{LeaseInterval: 50 * time.Millisecond, LeaseTTL: time.Second, RecoverInterval: 50 * time.Millisecond,
		ShutdownGrace: 200 * time.Millisecond}
	a := handoverReplica(t, sc, cfg)
	b := handoverReplica(t, sc, cfg)
	ctx, cancelAll := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancelAll()
	alice := workers.MustOwner("alice")

	const (
		responsive = iota // returns on its context's end
		stubborn          // returns only once released
		quick             // returns a result within the grace
		retrying          // fails, then waits out a long backoff
	)
	type task struct {
		id, key   string
		kind      int
		queue     string
		seq       int
		calls     atomic.Int32
		cancelled bool // by B, and its Cancel returned nil
	}
	release := make(chan struct{})
	var releaseOnce sync.Once
	defer releaseOnce.Do(func() { close(release) })
	var orderMu sync.Mutex
	order := map[string][]int{}
	fnOf := func(tk *task) workers.Func {
		return func(ctx context.Context, _ *workers.Task) (any, error) {
			tk.calls.Add(1)
			if tk.queue != "" {
				orderMu.Lock()
				order[tk.queue] = append(order[tk.queue], tk.seq)
				orderMu.Unlock()
			}
			switch tk.kind {
			case responsive:
				<-ctx.Done()
				return nil, context.Cause(ctx)
			case stubborn:
				<-release
				return "late", nil
			case quick:
				return "quick", nil
			default:
				return nil, errors.New("flaky")
			}
		}
	}
	var tasks []*task
	retry := workers.WithRetry(workers.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Minute, Jitter: workers.NoJitter})
	for i := range 24 {
		tk := &task{key: fmt.Sprintf("a%d", i), kind: i % 4}
		sub, err := a.Submit(ctx, tk.key, fnOf(tk), alice, retry)
		if err != nil {
			t.Fatal(err)
		}
		tk.id = sub.ID
		tasks = append(tasks, tk)
	}
	for qi := range 4 {
		q := fmt.Sprintf("q%d", qi)
		for i := range 6 {
			kind := responsive
			switch {
			case i == 0 && qi%2 == 1:
				kind = stubborn
			case i == 0 && qi == 2:
				kind = retrying
			case i < 2:
				kind = quick
			}
			tk := &task{key: fmt.Sprintf("%s-%d", q, i), kind: kind, queue: q, seq: i}
			sub, err := a.SubmitSequential(ctx, q, tk.key, fnOf(tk), alice, retry)
			if err != nil {
				t.Fatal(err)
			}
			tk.id = sub.ID
			tasks = append(tasks, tk)
		}
	}
	// Every async run, and each queue's head, has begun.
	waitFor(t, func() bool {
		for _, tk := range tasks {
			if (tk.queue == "" || tk.seq == 0) && tk.calls.Load() == 0 {
				return false
			}
		}
		return true
	})

	type waited struct {
		snap workers.Snapshot
		err  error
	}
	waits := make([]chan waited, len(tasks))
	for i, tk := range tasks {
		waits[i] = make(chan waited, 1)
		go func() {
			snap, err := b.Wait(ctx, tk.id, alice)
			waits[i] <- waited{snap, err}
		}()
	}

	shutCtx, cancelShut := context.WithTimeout(ctx, 800*time.Millisecond)
	defer cancelShut()
	shutErr := make(chan error, 1)
	begun := time.Now()
	go func() { shutErr <- a.Shutdown(shutCtx) }()
	// B cancels every third task as A shuts down.
	var cancels sync.WaitGroup
	for i, tk := range tasks {
		if i%3 != 0 {
			continue
		}
		cancels.Go(func() {
			err := b.Cancel(ctx, tk.id, alice)
			switch {
			case err == nil:
				tk.cancelled = true
			case errors.Is(err, workers.ErrFinished):
			default:
				t.Errorf("B's Cancel of %s: %v", tk.id, err)
			}
		})
	}
	err := <-shutErr
	took := time.Since(begun)
	cancels.Wait()
	if took > 800*time.Millisecond+500*time.Millisecond {
		t.Errorf("A's Shutdown took %v, bound 800ms", took)
	}
	var stubbornIDs []string
	for _, tk := range tasks {
		if tk.kind == stubborn && tk.calls.Load() > 0 {
			stubbornIDs = append(stubbornIDs, tk.id)
		}
	}
	slices.Sort(stubbornIDs)
	var se *workers.ShutdownError
	if !errors.As(err, &se) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("A's Shutdown: %v, want a *ShutdownError", err)
	}
	if !slices.Equal(se.ExecutingIDs, stubbornIDs) || se.Executing != len(stubbornIDs) || se.Unwritten != 0 {
		t.Errorf("A's Shutdown named %d executing %v and %d unwritten %v; want the stubborn runs %v",
			se.Executing, se.ExecutingIDs, se.Unwritten, se.UnwrittenIDs, stubbornIDs)
	}

	c := handoverReplica(t, sc, cfg)
	for _, tk := range tasks {
		endedIn(t, c, tk.id)
	}
	releaseOnce.Do(func() { close(release) })
	again, cancelAgain := context.WithTimeout(ctx, 10*time.Second)
	defer cancelAgain()
	if err := a.Shutdown(again); err != nil {
		t.Errorf("A's second Shutdown: %v", err)
	}
	for i, tk := range tasks {
		snap, err := c.Status(ctx, tk.id, alice)
		if err != nil {
			t.Fatal(err)
		}
		ran := tk.calls.Load()
		var want workers.Cause
		switch {
		case tk.cancelled:
			want = workers.CauseCancelled
		case ran == 0:
			want = workers.CauseShutdown
		case tk.kind == quick:
			want = workers.CauseCompleted
		case tk.kind == stubborn:
			want = workers.CauseAbandoned
		default:
			want = workers.CauseShutdown
		}
		if snap.Cause != want {
			t.Errorf("%s (kind %d, ran %d, cancelled %v): %s (%s, %q), want %s", tk.id, tk.kind, ran, tk.cancelled, snap.Status, snap.Cause, snap.Error, want)
		}
		if ran > 1 {
			t.Errorf("%s ran %d times", tk.id, ran)
		}
		select {
		case w := <-waits[i]:
			if w.err != nil || w.snap.Cause != snap.Cause || !w.snap.CompletedAt.Equal(snap.CompletedAt) {
				t.Errorf("B's Wait on %s: %s (%s), %v; the record: %s (%s)", tk.id, w.snap.Status, w.snap.Cause, w.err, snap.Status, snap.Cause)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("B's Wait on %s did not return", tk.id)
		}
	}
	orderMu.Lock()
	defer orderMu.Unlock()
	for q, ran := range order {
		if !slices.IsSorted(ran) || len(slices.Compact(slices.Clone(ran))) != len(ran) {
			t.Errorf("queue %s ran %v, want its items once each, in order", q, ran)
		}
	}
}

// A deploy whose Shutdown cannot record a long queue backlog within its
// bound names every record it leaves live: each PENDING record of A's
// after it returns is counted and named in its error.
func TestRollingDeployNamesTheBacklogItLeaves(t *testing.T) {
	testDSN(t)
	t.Parallel()
	sc := newScratchT(t)
	sc.store(t)
	cfg := workers.Config{LeaseInterval: 50 * time.Millisecond, LeaseTTL: 5 * time.Second, RecoverInterval: time.Hour}
	b := handoverReplica(t, sc, cfg)
	cfg.Logger = slog.New(slog.DiscardHandler) // a line per item left
	a := handoverReplica(t, sc, cfg)
	ctx, cancelAll := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancelAll()
	alice := workers.MustOwner("alice")
	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	const queues, items = 4, 500
	var subs sync.WaitGroup
	for qi := range queues {
		subs.Go(func() {
			q := fmt.Sprintf("q%d", qi)
			for i := range items {
				_, err := a.SubmitSequential(ctx, q, fmt.Sprintf("%s-%d", q, i), func(ctx context.Context, _ *workers.Task) (any, error) {
					<-release
					return nil, nil
				}, alice)
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	subs.Wait()
	shutCtx, cancelShut := context.WithTimeout(ctx, 150*time.Millisecond)
	defer cancelShut()
	begun := time.Now()
	err := a.Shutdown(shutCtx)
	took := time.Since(begun)
	once.Do(func() { close(release) })
	// The heads' callbacks wait for release, which comes only after
	// Shutdown returns: a Shutdown that waited for them would take the
	// test's whole 90 s. The bound itself is checked on a fake clock in
	// the root package's fault tests; here, under -race on a loaded
	// machine, the 2,000 records' bookkeeping alone has taken 900 ms.
	if took > 150*time.Millisecond+2*time.Second {
		t.Errorf("A's Shutdown took %v, bound 150ms", took)
	}
	var se *workers.ShutdownError
	if !errors.As(err, &se) {
		t.Fatalf("A's Shutdown: %v", err)
	}
	t.Logf("A's Shutdown in %v: %d executing, %d unwritten", took, se.Executing, se.Unwritten)
	live, err := b.List(ctx, workers.System, workers.WithStatus(workers.StatusPending, workers.StatusRunning))
	if err != nil {
		t.Fatal(err)
	}
	named := map[string]bool{}
	for _, id := range se.ExecutingIDs {
		named[id] = true
	}
	for _, id := range se.UnwrittenIDs {
		named[id] = true
	}
	pending := 0
	for _, s := range live {
		if s.Status == workers.StatusPending {
			pending++
		}
		if !named[s.ID] && len(se.UnwrittenIDs) < 1000 {
			t.Errorf("%s left %s by A's Shutdown, and not named in its error", s.ID, s.Status)
		}
	}
	// The store honours its calls' contexts: what executes is the
	// queues' heads, and every item left PENDING is counted unwritten
	// (an item counted so may have been written all the same, by a
	// statement that committed as its context ended).
	if se.Executing != queues || pending > se.Unwritten {
		t.Errorf("A's Shutdown left %d records PENDING, and counted %d unwritten, %d executing (%d named, %d named unwritten); want the %d heads executing",
			pending, se.Unwritten, se.Executing, len(se.ExecutingIDs), len(se.UnwrittenIDs), queues)
	}
	// Let A's late writes end before the test does.
	again, cancelAgain := context.WithTimeout(ctx, 20*time.Second)
	defer cancelAgain()
	if err := a.Shutdown(again); !errors.As(err, &se) || se.Executing != 0 || se.Unwritten < pending {
		t.Errorf("A's second Shutdown: %v; want the %d items left PENDING counted again", err, pending)
	}
}

// Submissions racing A's Shutdown, async and sequential: each one that
// returned a Submission ends in a terminal record by the time Shutdown
// returns nil, and each refused with ErrClosed left no record.
func TestRollingDeploySubmissionsRacingShutdown(t *testing.T) {
	testDSN(t)
	t.Parallel()
	sc := newScratchT(t)
	sc.store(t)
	cfg := workers.Config{LeaseInterval: 50 * time.Millisecond, LeaseTTL: 3 * time.Second}
	a := handoverReplica(t, sc, cfg)
	b := handoverReplica(t, sc, cfg)
	ctx, cancelAll := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancelAll()
	alice := workers.MustOwner("alice")
	type result struct {
		key string
		err error
	}
	results := make(chan result, 10000)
	stop := make(chan struct{})
	var subs sync.WaitGroup
	for g := range 8 {
		subs.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("g%d-%d", g, i)
				fn := func(ctx context.Context, _ *workers.Task) (any, error) {
					<-ctx.Done()
					return nil, context.Cause(ctx)
				}
				var err error
				if g%2 == 0 {
					_, err = a.Submit(ctx, key, fn, alice)
				} else {
					_, err = a.SubmitSequential(ctx, fmt.Sprintf("q%d", g), key, fn, alice)
				}
				results <- result{key, err}
				if errors.Is(err, workers.ErrClosed) {
					return
				}
			}
		})
	}
	waitFor(t, func() bool { return len(results) > 40 })
	shutCtx, cancelShut := context.WithTimeout(ctx, 5*time.Second)
	defer cancelShut()
	if err := a.Shutdown(shutCtx); err != nil {
		t.Errorf("A's Shutdown: %v", err)
	}
	close(stop)
	subs.Wait()
	close(results)
	n := 0
	for r := range results {
		n++
		id, err := workers.ScopedTaskKey(r.key, alice)
		if err != nil {
			t.Fatal(err)
		}
		snap, err := b.Status(ctx, id, alice)
		switch {
		case r.err == nil && (err != nil || !snap.Status.Terminal()):
			t.Errorf("%s, submitted, after A's Shutdown: %s, %v", r.key, snap.Status, err)
		case errors.Is(r.err, workers.ErrClosed) && !errors.Is(err, workers.ErrNotFound):
			t.Errorf("%s, refused with ErrClosed, left %s (%s)", r.key, snap.Status, snap.Cause)
		case r.err != nil && !errors.Is(r.err, workers.ErrClosed):
			t.Errorf("%s: Submit: %v", r.key, r.err)
		}
	}
	t.Logf("%d submissions", n)
}

// A deploy of a replica with limits: runs waiting for a slot, a queue
// running two items at once with items behind, one of its running items
// ignoring its context. B cancels one waiting run and waits on all.
// Shutdown names the stubborn item alone; the waiting runs and items end
// CANCELLED with the shutdown's cause (B's with its own), never started.
func TestRollingDeployUnderLimits(t *testing.T) {
	testDSN(t)
	t.Parallel()
	sc := newScratchT(t)
	sc.store(t)
	cfg := workers.Config{LeaseInterval: 50 * time.Millisecond, LeaseTTL: time.Second, RecoverInterval: 50 * time.Millisecond}
	b := handoverReplica(t, sc, cfg)
	cfg.Limits = workers.Limits{MaxRunning: 3, QueueConcurrency: 2}
	a := handoverReplica(t, sc, cfg)
	ctx, cancelAll := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancelAll()
	alice := workers.MustOwner("alice")
	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	var started sync.Map
	var running sync.WaitGroup
	fn := func(key string, stubborn bool) workers.Func {
		return func(ctx context.Context, _ *workers.Task) (any, error) {
			started.Store(key, true)
			running.Done()
			if stubborn {
				<-release
				return "late", nil
			}
			<-ctx.Done()
			return nil, context.Cause(ctx)
		}
	}
	ids := map[string]string{}
	running.Add(3)
	for i := range 2 {
		key := fmt.Sprintf("q-%d", i)
		sub, err := a.SubmitSequential(ctx, "q", key, fn(key, i == 1), alice)
		if err != nil {
			t.Fatal(err)
		}
		ids[key] = sub.ID
	}
	waitFor(t, func() bool {
		_, q0 := started.Load("q-0")
		_, q1 := started.Load("q-1")
		return q0 && q1
	})
	for i := range 4 {
		key := fmt.Sprintf("async-%d", i)
		sub, err := a.Submit(ctx, key, fn(key, false), alice)
		if err != nil {
			t.Fatal(err)
		}
		ids[key] = sub.ID
	}
	for i := 2; i < 4; i++ {
		key := fmt.Sprintf("q-%d", i)
		sub, err := a.SubmitSequential(ctx, "q", key, fn(key, false), alice)
		if err != nil {
			t.Fatal(err)
		}
		ids[key] = sub.ID
	}
	running.Wait() // q-0, q-1 and async-0 hold the three slots
	if err := b.Cancel(ctx, ids["async-2"], alice); err != nil {
		t.Fatal(err)
	}
	waits := map[string]chan workers.Snapshot{}
	for key, id := range ids {
		ch := make(chan workers.Snapshot, 1)
		waits[key] = ch
		go func() {
			snap, err := b.Wait(ctx, id, alice)
			if err != nil {
				t.Errorf("B's Wait on %s: %v", id, err)
			}
			ch <- snap
		}()
	}
	shutCtx, cancelShut := context.WithTimeout(ctx, 600*time.Millisecond)
	defer cancelShut()
	begun := time.Now()
	err := a.Shutdown(shutCtx)
	if took := time.Since(begun); took > 600*time.Millisecond+500*time.Millisecond {
		t.Errorf("A's Shutdown took %v", took)
	}
	var se *workers.ShutdownError
	if !errors.As(err, &se) || !slices.Equal(se.ExecutingIDs, []string{ids["q-1"]}) || se.Executing != 1 || se.Unwritten != 0 {
		t.Fatalf("A's Shutdown: %v; want q-1 alone left executing", err)
	}
	c := handoverReplica(t, sc, cfg)
	for key, id := range ids {
		snap := endedIn(t, c, id)
		_, ran := started.Load(key)
		var want workers.Cause
		switch {
		case key == "async-2":
			want = workers.CauseCancelled
		case key == "q-1":
			want = workers.CauseAbandoned
		default:
			want = workers.CauseShutdown
		}
		if snap.Cause != want {
			t.Errorf("%s (ran %v): %s (%s), want %s", key, ran, snap.Status, snap.Cause, want)
		}
		if ran != (key == "q-0" || key == "q-1" || key == "async-0") {
			t.Errorf("%s ran: %v", key, ran)
		}
		select {
		case w := <-waits[key]:
			if w.Cause != snap.Cause {
				t.Errorf("B's Wait on %s: %s (%s), the record %s (%s)", key, w.Status, w.Cause, snap.Status, snap.Cause)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("B's Wait on %s did not return", key)
		}
	}
	once.Do(func() { close(release) })
	again, cancelAgain := context.WithTimeout(ctx, 10*time.Second)
	defer cancelAgain()
	if err := a.Shutdown(again); err != nil {
		t.Errorf("A's second Shutdown: %v", err)
	}
}
