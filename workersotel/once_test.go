package workersotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/workersotel"
)

// onceCheck shuts f's runtime down, then checks that every span started
// was ended exactly once, and that the metrics count each run once.
func onceCheck(t *testing.T, f *fixture, wantStarted int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.rt.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	started := map[string]int{}
	for _, s := range f.spans.Started() {
		if s.Name() == "workers.run" {
			started[s.SpanContext().SpanID().String()]++
		}
	}
	ended := map[string]int{}
	for _, s := range f.spans.Ended() {
		if s.Name() == "workers.run" {
			ended[s.SpanContext().SpanID().String()]++
		}
	}
	for id := range started {
		if ended[id] != 1 {
			t.Errorf("span %s ended %d times, want 1", id, ended[id])
		}
	}
	sums, hist := f.metrics(t)
	if sums["workers.tasks.finished"] != sums["workers.tasks.submitted"] {
		t.Errorf("finished %d, submitted %d (by status %v)", sums["workers.tasks.finished"], sums["workers.tasks.submitted"], sums)
	}
	if sums["workers.tasks.waiting"] != 0 || sums["workers.tasks.running"] != 0 {
		t.Errorf("waiting %d, running %d after Shutdown; want 0, 0", sums["workers.tasks.waiting"], sums["workers.tasks.running"])
	}
	if sums["workers.tasks.started"] != wantStarted {
		t.Errorf("started %d, want %d", sums["workers.tasks.started"], wantStarted)
	}
	if int64(hist["workers.task.duration"]) != wantStarted || int64(hist["workers.task.queue_wait"]) != wantStarted {
		t.Errorf("histogram counts %v, want %d each", hist, wantStarted)
	}
}

func blocker(started chan<- struct{}, release <-chan struct{}) workers.Func {
	return func(ctx context.Context, _ *workers.Task) (any, error) {
		close(started)
		<-release // ignores its context
		return nil, nil
	}
}

// A queue item cancelled while it waits for its turn, and one left in the
// backlog at Shutdown.
func TestQueuedItemsEndOnce(t *testing.T) {
	f := setupOver(t, workers.NewMemStore(), func(inst *workersotel.Instrumentation) workers.Config {
		return workers.Config{
			Middleware:    []workers.Middleware{inst.Middleware()},
			Observers:     []workers.Observer{inst.Observer()},
			ShutdownGrace: -1,
		}
	})
	alice := workers.MustOwner("alice")
	started, release := make(chan struct{}), make(chan struct{})
	first, err := f.rt.SubmitSequential(context.Background(), "q", "first", func(ctx context.Context, _ *workers.Task) (any, error) {
		close(started)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil, ctx.Err()
	}, alice)
	if err != nil {
		t.Fatal(err)
	}
	<-started
	nop := func(context.Context, *workers.Task) (any, error) { return nil, nil }
	second, err := f.rt.SubmitSequential(context.Background(), "q", "second", nop, alice)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.rt.SubmitSequential(context.Background(), "q", "third", nop, alice); err != nil {
		t.Fatal(err)
	}
	if err := f.rt.Cancel(context.Background(), second.ID, alice); err != nil {
		t.Fatal(err)
	}
	f.wait(t, second.ID)
	_ = first
	defer close(release)
	onceCheck(t, f, 1)
}

// Under Limits: a task waiting for a slot cancelled, and one waiting at
// Shutdown.
func TestWaitingForASlotEndsOnce(t *testing.T) {
	f := setupOver(t, workers.NewMemStore(), func(inst *workersotel.Instrumentation) workers.Config {
		return workers.Config{
			Middleware:    []workers.Middleware{inst.Middleware()},
			Observers:     []workers.Observer{inst.Observer()},
			Limits:        workers.Limits{MaxRunning: 1},
			ShutdownGrace: -1,
		}
	})
	alice := workers.MustOwner("alice")
	started, release := make(chan struct{}), make(chan struct{})
	if _, err := f.rt.Submit(context.Background(), "first", func(ctx context.Context, _ *workers.Task) (any, error) {
		close(started)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil, ctx.Err()
	}, alice); err != nil {
		t.Fatal(err)
	}
	<-started
	nop := func(context.Context, *workers.Task) (any, error) { return nil, nil }
	second, err := f.rt.Submit(context.Background(), "second", nop, alice)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.rt.Submit(context.Background(), "third", nop, alice); err != nil {
		t.Fatal(err)
	}
	if err := f.rt.Cancel(context.Background(), second.ID, alice); err != nil {
		t.Fatal(err)
	}
	f.wait(t, second.ID)
	defer close(release)
	onceCheck(t, f, 1)
}

// A run cancelled whose callback ignores the cancel, its key re-run
// meanwhile (the old run superseded), and a timed-out run whose callback
// returns later.
func TestSupersededAndTimedOutEndOnce(t *testing.T) {
	f := setup(t)
	alice := workers.MustOwner("alice")
	started, release := make(chan struct{}), make(chan struct{})
	old, err := f.rt.Submit(context.Background(), "k", blocker(started, release), alice)
	if err != nil {
		t.Fatal(err)
	}
	<-started
	if err := f.rt.Cancel(context.Background(), old.ID, alice); err != nil {
		t.Fatal(err)
	}
	nop := func(context.Context, *workers.Task) (any, error) { return nil, nil }
	again, err := f.rt.Submit(context.Background(), "k", nop, alice)
	if err != nil {
		t.Fatal(err)
	}
	if again.RunID == old.RunID {
		t.Fatal("not re-run")
	}
	f.wait(t, again.ID)

	tStarted, tRelease := make(chan struct{}), make(chan struct{})
	to, err := f.rt.Submit(context.Background(), "timeout", blocker(tStarted, tRelease), alice, workers.WithTimeout(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	<-tStarted
	if snap := f.wait(t, to.ID); snap.Status != workers.StatusFailed {
		t.Fatalf("timeout: %s", snap.Status)
	}
	// Re-run the timed-out key while its first callback still executes.
	again2, err := f.rt.Submit(context.Background(), "timeout", nop, alice)
	if err != nil {
		t.Fatal(err)
	}
	f.wait(t, again2.ID)
	close(release)
	close(tRelease)
	onceCheck(t, f, 4)
}

// A run cancelled by Shutdown, one in a retry backoff at Shutdown, and
// one that panics and is retried.
func TestShutdownAndRetriesEndOnce(t *testing.T) {
	f := setupOver(t, workers.NewMemStore(), func(inst *workersotel.Instrumentation) workers.Config {
		return workers.Config{
			Middleware:    []workers.Middleware{inst.Middleware()},
			Observers:     []workers.Observer{inst.Observer()},
			ShutdownGrace: -1,
		}
	})
	alice := workers.MustOwner("alice")
	started := make(chan struct{})
	if _, err := f.rt.Submit(context.Background(), "running", func(ctx context.Context, _ *workers.Task) (any, error) {
		close(started)
		<-ctx.Done()
		return nil, ctx.Err()
	}, alice); err != nil {
		t.Fatal(err)
	}
	<-started
	failed := make(chan struct{})
	if _, err := f.rt.Submit(context.Background(), "backoff", func(ctx context.Context, _ *workers.Task) (any, error) {
		select {
		case <-failed:
		default:
			close(failed)
		}
		return nil, errors.New("flaky")
	}, alice, workers.WithRetry(workers.RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Hour})); err != nil {
		t.Fatal(err)
	}
	<-failed
	calls := 0
	p, err := f.rt.Submit(context.Background(), "panics", func(ctx context.Context, _ *workers.Task) (any, error) {
		if calls++; calls < 3 {
			panic("boom")
		}
		return nil, nil
	}, alice, workers.WithRetry(workers.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Microsecond}))
	if err != nil {
		t.Fatal(err)
	}
	f.wait(t, p.ID)
	onceCheck(t, f, 3)
}

// Reset over a MemStore (records cleared) with a run executing and a
// queue item waiting: the item ends at once, the run when its callback
// returns, deleted (its record is gone); every span ends once.
func TestResetEndsOnce(t *testing.T) {
	f := setup(t)
	alice := workers.MustOwner("alice")
	started, release := make(chan struct{}), make(chan struct{})
	if _, err := f.rt.SubmitSequential(context.Background(), "q", "first", blocker(started, release), alice); err != nil {
		t.Fatal(err)
	}
	<-started
	if _, err := f.rt.SubmitSequential(context.Background(), "q", "second", func(context.Context, *workers.Task) (any, error) { return nil, nil }, alice); err != nil {
		t.Fatal(err)
	}
	if err := f.rt.Reset(context.Background()); err != nil {
		t.Fatal(err)
	}
	close(release)
	onceCheck(t, f, 1)
}

// A run Shutdown gave up on (its callback ignores the cancel) ends its
// span when its callback returns and its one late write lands.
func TestShutdownGaveUpEndsLater(t *testing.T) {
	f := setupOver(t, workers.NewMemStore(), func(inst *workersotel.Instrumentation) workers.Config {
		return workers.Config{Observers: []workers.Observer{inst.Observer()}, ShutdownGrace: -1}
	})
	alice := workers.MustOwner("alice")
	started, release, returned := make(chan struct{}), make(chan struct{}), make(chan struct{})
	sub, err := f.rt.Submit(context.Background(), "k", func(ctx context.Context, _ *workers.Task) (any, error) {
		defer close(returned)
		close(started)
		<-release
		return "late", nil
	}, alice)
	if err != nil {
		t.Fatal(err)
	}
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := f.rt.Shutdown(ctx); err == nil {
		t.Fatal("Shutdown settled a run whose callback ignores its context")
	}
	close(release)
	<-returned
	f.span(t, sub.RunID)
	sums, _ := f.metrics(t)
	if sums["workers.tasks.running"] != 0 || sums["workers.tasks.finished"] != 1 {
		t.Errorf("running %d, finished %d; want 0, 1", sums["workers.tasks.running"], sums["workers.tasks.finished"])
	}
}

// Two replicas over one MemStore: a queue item of one cancelled, while
// it waits for its turn, through the other; each run is counted once, by
// the replica that holds it, and every span it opened ends.
func TestQueuedItemCancelledElsewhereEndsOnce(t *testing.T) {
	s := workers.NewMemStore()
	config := func(inst *workersotel.Instrumentation) workers.Config {
		return workers.Config{Observers: []workers.Observer{inst.Observer()}}
	}
	here, there := setupOver(t, s, config), setupOver(t, s, config)
	for _, f := range []*fixture{here, there} {
		if err := f.rt.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	alice := workers.MustOwner("alice")
	started, release := make(chan struct{}), make(chan struct{})
	if _, err := here.rt.SubmitSequential(context.Background(), "q", "first", blocker(started, release), alice); err != nil {
		t.Fatal(err)
	}
	<-started
	second, err := here.rt.SubmitSequential(context.Background(), "q", "second", func(context.Context, *workers.Task) (any, error) { return nil, nil }, alice)
	if err != nil {
		t.Fatal(err)
	}
	if err := there.rt.Cancel(context.Background(), second.ID, alice); err != nil {
		t.Fatal(err)
	}
	here.span(t, second.RunID) // ended once here hears of the cancel
	close(release)
	onceCheck(t, here, 1)
	ts, _ := there.metrics(t)
	if ts["workers.tasks.finished"] != 0 {
		t.Errorf("the replica that cancelled counted %d finished", ts["workers.tasks.finished"])
	}
}
