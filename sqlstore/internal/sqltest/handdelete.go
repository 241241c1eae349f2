package sqltest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// HandDeleted is what DeletedByHandEndsAWaitingRun runs over.
type HandDeleted struct {
	// Store is a fresh, migrated store over tables of its own.
	Store workers.Store
	// Del deletes the task row of id with SQL from outside the store,
	// as an operator would.
	Del func(t *testing.T, id string)
}

// DeletedByHandEndsAWaitingRun: a run waiting for its turn (for the one
// slot under Limits, or in a sequential queue behind a blocked head)
// whose record is deleted by hand ends at once, on the notice of the
// delete: its context's cause is ErrDeleted, the observers hear it finish
// with CauseDeleted, it gives its owner's waiting place back, and a Wait
// and a Watch on it begun before the delete end with ErrNotFound. It
// never starts. The sync loop is an hour away, the listener resynced
// before the run existed, and it heard the run's own notices before the
// delete, so only the delete's notice can end it before the head's turn
// ends.
func DeletedByHandEndsAWaitingRun(t *testing.T, fresh func(t *testing.T) HandDeleted) {
	for _, c := range []struct{ name, queue string }{{"ForASlot", ""}, {"InAQueue", "q"}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			deletedByHand(t, fresh(t), c.queue)
		})
	}
}

// deletedByHand is DeletedByHandEndsAWaitingRun in queue ("" for a run
// waiting for a slot).
func deletedByHand(t *testing.T, h HandDeleted, queue string) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	alice := workers.MustOwner("alice")
	s := &heardStore{Store: h.Store, Leaser: h.Store.(workers.Leaser), n: h.Store.(workers.Notifier), heard: make(chan workers.Change, 1024)}
	var mu sync.Mutex
	tasks := make(map[string]*workers.Task) // guarded by mu: by run id, from their submission
	finished := make(chan workers.Event, 16)
	obs := workers.ObserverFunc(func(_ context.Context, e workers.Event) {
		switch e.Kind {
		case workers.EventSubmitted:
			mu.Lock()
			tasks[e.RunID] = e.Task
			mu.Unlock()
		case workers.EventFinished:
			finished <- e
		}
	})
	rt := workers.NewRuntime(s, workers.Config{SyncInterval: time.Hour, Observers: []workers.Observer{obs},
		Limits: workers.Limits{MaxRunning: 1, Owner: workers.OwnerLimits{Waiting: 1}}})
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		if err := rt.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	}()
	if err := rt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// The listener's first Resync, which re-reads every run waiting for
	// its turn, comes before the run exists: it cannot be what finds the
	// delete.
	s.hear(t, "the listener's first Resync", func(c workers.Change) bool { return c.Resync })
	submit := func(key string, fn workers.Func) (workers.Submission, error) {
		if queue == "" {
			return rt.Submit(ctx, key, fn, alice)
		}
		return rt.SubmitSequential(ctx, queue, key, fn, alice)
	}
	started, release := make(chan struct{}), make(chan struct{})
	if _, err := submit("head", func(context.Context, *workers.Task) (any, error) {
		close(started)
		<-release // holds the slot, and the queue, whatever happens
		return "head", nil
	}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	recv[struct{}](t, started, "the head's start")
	var ran atomic.Int64
	fn := func(context.Context, *workers.Task) (any, error) { ran.Add(1); return nil, nil }
	k, err := submit("k", fn)
	if err != nil {
		t.Fatal(err)
	}
	// The notices of the run's own writes are heard before the delete:
	// one heard after it would have the runtime read the record, and
	// find it gone, without any notice of the delete. A record written
	// after them is heard after them.
	s.hear(t, "the run's insert", func(c workers.Change) bool { return c.ID == k.ID && c.Status == workers.StatusPending })
	marker := workers.Record{ID: "marker", RunID: "marker.1", CreatedAt: time.Now(),
		State: workers.State{Status: workers.StatusCompleted, CompletedAt: time.Now()}}
	if err := h.Store.InsertTask(ctx, marker); err != nil {
		t.Fatal(err)
	}
	s.hear(t, "a record written after the run's", func(c workers.Change) bool { return c.ID == marker.ID })
	waited := make(chan error, 1)
	go func() {
		_, err := rt.Wait(ctx, k.ID, alice)
		waited <- err
	}()
	watched := make(chan error, 1)
	watching := make(chan struct{})
	go func() {
		var last error
		first := true
		for _, err := range rt.Watch(ctx, k.ID, alice) {
			if first {
				first = false
				close(watching)
			}
			last = err
		}
		if first {
			close(watching)
		}
		watched <- last
	}()
	recv[struct{}](t, watching, "the Watch's first snapshot")

	h.Del(t, k.ID)

	deadline := time.After(5 * time.Second)
	for ended := false; !ended; {
		select {
		case e := <-finished:
			if e.RunID != k.RunID {
				continue
			}
			ended = true
			if e.Cause != workers.CauseDeleted || e.Status != workers.StatusCancelled {
				t.Errorf("the observers heard the run finish %s with cause %q, want CANCELLED with %q", e.Status, e.Cause, workers.CauseDeleted)
			}
		case <-deadline:
			t.Fatal("the run whose record was deleted by hand did not end within 5 s: no notice of the delete reached the runtime")
		}
	}
	mu.Lock()
	task := tasks[k.RunID]
	mu.Unlock()
	if task == nil {
		t.Fatal("no EventSubmitted for the run")
	}
	if cause := task.CancelCause(); !errors.Is(cause, workers.ErrDeleted) {
		t.Errorf("the run's cause is %v, want ErrDeleted", cause)
	}
	// The place is given back as the run ends, not at the head's turn.
	eventually(t, "the deleted run's waiting place given back", func() (bool, error) {
		st, err := rt.Stats(ctx, workers.System)
		return err == nil && st.Waiting == 0, err
	})
	next, err := submit("next", fn)
	if err != nil {
		t.Fatalf("the owner's next submission: %v, want it admitted to the place given back", err)
	}
	for what, ch := range map[string]chan error{"Wait": waited, "Watch": watched} {
		select {
		case err := <-ch:
			if !errors.Is(err, workers.ErrNotFound) {
				t.Errorf("%s ended with %v, want ErrNotFound", what, err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("%s on the deleted run did not end within 5 s", what)
		}
	}
	close(release)
	if _, err := rt.Wait(ctx, next.ID, alice); err != nil {
		t.Fatal(err)
	}
	if n := ran.Load(); n != 1 {
		t.Errorf("the waiting callbacks ran %d times, want once: the next's, never the deleted run's", n)
	}
}

// heardStore is a Leaser and Notifier store whose listener also passes
// each notice it passes on to heard, as long as it has room.
type heardStore struct {
	workers.Store
	workers.Leaser
	n     workers.Notifier
	heard chan workers.Change
}

// Listen implements workers.Notifier.
func (s *heardStore) Listen(ctx context.Context, changed func(workers.Change)) error {
	return s.n.Listen(ctx, func(c workers.Change) {
		changed(c)
		select {
		case s.heard <- c:
		default: // nobody reads any more
		}
	})
}

// hear returns once the listener has passed on a notice that want
// accepts, failing t after waitLimit.
func (s *heardStore) hear(t *testing.T, what string, want func(workers.Change) bool) {
	t.Helper()
	deadline := time.After(waitLimit)
	for {
		select {
		case c := <-s.heard:
			if want(c) {
				return
			}
		case <-deadline:
			t.Fatalf("the listener did not hear %s within %v", what, waitLimit)
		}
	}
}
