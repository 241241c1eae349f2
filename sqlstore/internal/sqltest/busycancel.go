package sqltest

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// checkGate wraps a replica's store handle. It holds the progress write
// (progress 1) of one run, the target's, until told; and, once armed, it
// holds each read of a marker task, which only the replica's notice
// checks then make, so that a test knows which batch of notice checks the
// replica is in. (Before, the marker's own submission may read it: a
// notice that came while it registered, such as the listener's first
// Resync, has it check its record.) It keeps the handle's Leaser and
// Notifier.
type checkGate struct {
	workers.Store
	workers.Leaser
	workers.Notifier

	target, marker string // task ids, set before either task is submitted
	armed          atomic.Bool

	hold    chan struct{} // the target's progress write waits for it to close
	holding chan struct{} // closed when that write waits

	targetRead chan struct{}      // gets a value at each read of the target
	markerIn   chan chan struct{} // a read of the marker hands over the channel it then waits on
	free       chan struct{}      // closed: reads of the marker wait no more
	freeOnce   sync.Once

	delivered chan struct{} // gets a value once a watcher notice of the marker has been handled
	resynced  chan struct{} // gets a value once a Resync has been handled
}

func newCheckGate(s workers.Store, target, marker string) *checkGate {
	return &checkGate{
		Store: s, Leaser: s.(workers.Leaser), Notifier: s.(workers.Notifier),
		target: target, marker: marker,
		hold: make(chan struct{}), holding: make(chan struct{}),
		targetRead: make(chan struct{}, 64), markerIn: make(chan chan struct{}), free: make(chan struct{}),
		delivered: make(chan struct{}, 64), resynced: make(chan struct{}, 64),
	}
}

func (g *checkGate) TransitionTask(ctx context.Context, id, runID string, from []workers.Status, next workers.State) (bool, error) {
	if id == g.target && next.Status == workers.StatusRunning && next.Progress == 1 {
		close(g.holding)
		select {
		case <-g.hold:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	return g.Store.TransitionTask(ctx, id, runID, from, next)
}

func (g *checkGate) GetTask(ctx context.Context, id string) (workers.Record, error) {
	switch id {
	case g.target:
		g.targetRead <- struct{}{}
	case g.marker:
		if !g.armed.Load() {
			break
		}
		release := make(chan struct{})
		select {
		case g.markerIn <- release:
			select {
			case <-release:
			case <-g.free:
			case <-ctx.Done():
				return workers.Record{}, ctx.Err()
			}
		case <-g.free:
		case <-ctx.Done():
			return workers.Record{}, ctx.Err()
		}
	}
	return g.Store.GetTask(ctx, id)
}

func (g *checkGate) Listen(ctx context.Context, changed func(workers.Change)) error {
	return g.Notifier.Listen(ctx, func(c workers.Change) {
		changed(c)
		switch {
		case c.Resync:
			g.resynced <- struct{}{}
		case c.ID == g.marker && c.Status == "":
			g.delivered <- struct{}{}
		}
	})
}

// freeMarker lets every read of the marker through.
func (g *checkGate) freeMarker() { g.freeOnce.Do(func() { close(g.free) }) }

// cancelDuringProgressWrite: replica B runs a task whose progress write
// is in flight when replica A cancels it. B's listener hears the cancel
// while the write holds the run, and B cancels the callback's context
// once the write is done, with ErrCancelled, not at its next sync pass
// (an hour away here) or never.
func cancelDuringProgressWrite(t *testing.T, open Opener) {
	alice := workers.MustOwner("alice")
	target, err := workers.ScopedTaskKey("busy", alice)
	if err != nil {
		t.Fatal(err)
	}
	marker, err := workers.ScopedTaskKey("marker", alice)
	if err != nil {
		t.Fatal(err)
	}
	a := replica(t, open, workers.Config{}, nil)
	var g *checkGate
	b := replica(t, open, workers.Config{SyncInterval: time.Hour, ProgressInterval: 5 * time.Millisecond, StoreTimeout: 2 * waitLimit},
		func(s workers.Store) workers.Store { g = newCheckGate(s, target, marker); return g })
	defer g.freeMarker()

	done := make(chan struct{})
	defer close(done) // before the replicas' Shutdown, which would wait for it
	markerSub, err := b.Submit(t.Context(), "marker", func(ctx context.Context, _ *workers.Task) (any, error) {
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-done:
			return nil, nil
		}
	}, alice)
	if err != nil {
		t.Fatal(err)
	}
	started, setProgress, cancelled := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	if _, err := b.Submit(t.Context(), "busy", func(ctx context.Context, tk *workers.Task) (any, error) {
		close(started)
		<-setProgress
		tk.SetProgress(1)
		<-ctx.Done()
		cancelled <- context.Cause(ctx)
		return nil, context.Cause(ctx)
	}, alice); err != nil {
		t.Fatal(err)
	}
	recv(t, started, "the target run starting")

	// A watcher added to the marker makes B check the marker, and each
	// check reads it, held by the gate: B's next batch of notice checks
	// waits meanwhile, and holds what B heard before it.
	watchers := 0
	touchMarker := func() {
		t.Helper()
		watchers++
		if added, err := a.Store().AddWatcher(t.Context(), markerSub.ID, markerSub.RunID, "w"+strconv.Itoa(watchers)); err != nil || !added {
			t.Fatalf("adding a watcher to the marker: %v, %v", added, err)
		}
		recv(t, g.delivered, "B hearing of the marker's watcher")
	}
	// The marker's notices are heard once B listens.
	recv(t, g.resynced, "B listening")
	g.armed.Store(true)
	// Two batches, so that the one held is not B's first, which checks
	// every run (the target's read included).
	touchMarker()
	release := recv(t, g.markerIn, "B checking the marker")
	touchMarker()
	close(release)
	release = recv(t, g.markerIn, "B checking the marker")
	for len(g.targetRead) > 0 {
		<-g.targetRead
	}

	close(setProgress)
	recv(t, g.holding, "B's progress write of the target")
	if err := a.Cancel(t.Context(), target, alice); err != nil {
		t.Fatal(err)
	}
	// The cancel's notice comes before the marker's next one: B's next
	// batch holds both. The batch after that one shows it over.
	for range 2 {
		touchMarker()
		close(release)
		select {
		case <-g.targetRead:
			// B reads the target's record, and waits for the write.
		case release = <-g.markerIn:
			continue
		case <-time.After(waitLimit):
			t.Fatal("B's notice checks went no further")
		}
		break
	}
	g.freeMarker()
	close(g.hold)

	select {
	case cause := <-cancelled:
		if !errors.Is(cause, workers.ErrCancelled) {
			t.Errorf("the run's context ended with %v, want ErrCancelled", cause)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the cancel made while B's progress write was in flight never reached the callback")
	}
}
