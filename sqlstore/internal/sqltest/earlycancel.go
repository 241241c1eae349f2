package sqltest

import (
	"context"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// landedInsertHeld wraps a replica's store handle: its InsertTask of the
// task id lands, then waits for release before it returns, as a commit
// whose answer is slow to come; heard gets each notice of the task's
// end once the replica's listener has handled it. It keeps the handle's
// Leaser and Notifier.
type landedInsertHeld struct {
	workers.Store
	workers.Leaser
	workers.Notifier
	id                string
	inserted, release chan struct{}
	heard             chan workers.Change
	listening         chan struct{} // gets a value at each Resync: the listener listens
}

func (s *landedInsertHeld) InsertTask(ctx context.Context, rec workers.Record) error {
	err := s.Store.InsertTask(ctx, rec)
	if rec.ID == s.id {
		close(s.inserted)
		<-s.release
	}
	return err
}

func (s *landedInsertHeld) Listen(ctx context.Context, changed func(workers.Change)) error {
	return s.Notifier.Listen(ctx, func(c workers.Change) {
		changed(c)
		if c.Resync {
			select {
			case s.listening <- struct{}{}:
			default:
			}
		}
		if c.ID == s.id && c.Status.Terminal() {
			s.heard <- c
		}
	})
}

// cancelBeforePublish: replica A cancels a task of B's once B's insert
// of it has committed, and B hears of it before the insert has returned,
// so before B could know the run: B's callback never starts, and B ends
// the run as A's cancel says.
func cancelBeforePublish(t *testing.T, open Opener) {
	alice := workers.MustOwner("alice")
	id, err := workers.ScopedTaskKey("early", alice)
	if err != nil {
		t.Fatal(err)
	}
	a := replica(t, open, workers.Config{}, nil)
	var held *landedInsertHeld
	finished := make(chan workers.Event, 1)
	cfg := workers.Config{
		SyncInterval: time.Hour, // the notice alone must do it
		Observers: []workers.Observer{workers.ObserverFunc(func(_ context.Context, e workers.Event) {
			if e.Kind == workers.EventFinished && e.TaskID == id {
				finished <- e
			}
		})},
	}
	b := replica(t, open, cfg, func(s workers.Store) workers.Store {
		held = &landedInsertHeld{Store: s, Leaser: s.(workers.Leaser), Notifier: s.(workers.Notifier),
			id: id, inserted: make(chan struct{}), release: make(chan struct{}), heard: make(chan workers.Change, 8), listening: make(chan struct{}, 1)}
		return held
	})
	recv(t, held.listening, "B listening") // so that it hears the cancel
	started := make(chan struct{}, 1)
	submitted := make(chan error, 1)
	go func() {
		_, err := b.Submit(context.Background(), "early", func(ctx context.Context, _ *workers.Task) (any, error) {
			started <- struct{}{}
			<-ctx.Done()
			return nil, context.Cause(ctx)
		}, alice)
		submitted <- err
	}()
	recv(t, held.inserted, "B's insert")
	if err := a.Cancel(t.Context(), id, alice); err != nil {
		t.Fatal(err)
	}
	recv(t, held.heard, "B hearing of the cancel")
	close(held.release)
	if err := recv(t, submitted, "B's Submit"); err != nil {
		t.Fatal(err)
	}
	e := recv(t, finished, "B ending the run")
	if e.Status != workers.StatusCancelled {
		t.Errorf("the run ended %s, want CANCELLED", e.Status)
	}
	select {
	case <-started:
		t.Error("the callback started, its record cancelled elsewhere")
	default:
	}
}
