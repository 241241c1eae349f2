package workers

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"reflect"
	"sync"
	"testing"
	"time"
)

// streamError ranges over a stream made with a nil context, which must
// yield one zero Snapshot with its error and end: it returns that error,
// or one that says what the stream yielded instead.
func streamError(seq iter.Seq2[Snapshot, error]) error {
	var got []error
	var snaps []Snapshot
	for snap, err := range seq {
		snaps, got = append(snaps, snap), append(got, err)
		if len(got) == 2 {
			break
		}
	}
	switch {
	case len(got) != 1:
		return fmt.Errorf("the stream yielded %d items (errors %v), not one", len(got), got)
	case !reflect.DeepEqual(snaps[0], Snapshot{}):
		return fmt.Errorf("the stream yielded %+v with %v, not a zero Snapshot", snaps[0], got[0])
	}
	return got[0]
}

// nilCtxCalls are the exported calls of a Runtime that take a context,
// each made with a nil one about the task id; each returns the call's
// error (a stream's, by streamError).
//
//nolint:staticcheck // SA1012: the nil context is the point of every case
var nilCtxCalls = []struct {
	name string
	call func(rt *Runtime[*MemStore], id string) error
}{
	{"Ready", func(rt *Runtime[*MemStore], _ string) error { return rt.Ready(nil) }},
	{"Start", func(rt *Runtime[*MemStore], _ string) error { return rt.Start(nil) }},
	{"Submit", func(rt *Runtime[*MemStore], _ string) error {
		_, err := rt.Submit(nil, "k", nopFn, alice)
		return err
	}},
	{"SubmitSequential", func(rt *Runtime[*MemStore], _ string) error {
		_, err := rt.SubmitSequential(nil, "q", "k", nopFn, alice)
		return err
	}},
	{"Status", func(rt *Runtime[*MemStore], id string) error {
		_, err := rt.Status(nil, id, alice)
		return err
	}},
	{"Wait", func(rt *Runtime[*MemStore], id string) error {
		_, err := rt.Wait(nil, id, alice)
		return err
	}},
	{"Cancel", func(rt *Runtime[*MemStore], id string) error { return rt.Cancel(nil, id, alice) }},
	{"List", func(rt *Runtime[*MemStore], _ string) error {
		_, err := rt.List(nil, alice)
		return err
	}},
	{"ListPage", func(rt *Runtime[*MemStore], _ string) error {
		_, err := rt.ListPage(nil, alice)
		return err
	}},
	{"Stats", func(rt *Runtime[*MemStore], _ string) error {
		_, err := rt.Stats(nil, System)
		return err
	}},
	{"QueueStatus", func(rt *Runtime[*MemStore], _ string) error {
		_, err := rt.QueueStatus(nil, "q", alice)
		return err
	}},
	{"Watch", func(rt *Runtime[*MemStore], id string) error { return streamError(rt.Watch(nil, id, alice)) }},
	{"Subscribe", func(rt *Runtime[*MemStore], _ string) error { return streamError(rt.Subscribe(nil, alice)) }},
	{"RecoverZombies", func(rt *Runtime[*MemStore], _ string) error {
		_, err := rt.RecoverZombies(nil)
		return err
	}},
	{"Cleanup", func(rt *Runtime[*MemStore], _ string) error {
		_, err := rt.Cleanup(nil, 0)
		return err
	}},
	{"Reset", func(rt *Runtime[*MemStore], _ string) error { return rt.Reset(nil) }},
	{"Shutdown", func(rt *Runtime[*MemStore], _ string) error { return rt.Shutdown(nil) }},
}

func nopFn(context.Context, *Task) (any, error) { return nil, nil }

// callNilCtx makes call, failing the test, rather than crashing it, if
// the call panics, and rather than hanging, if it does not return.
func callNilCtx(t *testing.T, call func() error) error {
	t.Helper()
	type answer struct {
		err   error
		panic any
	}
	ch := make(chan answer, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				ch <- answer{panic: p}
			}
		}()
		ch <- answer{err: call()}
	}()
	select {
	case a := <-ch:
		if a.panic != nil {
			t.Fatalf("panicked: %v", a.panic)
		}
		return a.err
	case <-time.After(10 * time.Second):
		t.Fatal("did not return")
	}
	return nil
}

// Every call that takes a context refuses a nil one with
// ErrInvalidOption (a stream yields it once and ends), never a panic, and
// before it touches anything: the runtime is as it was, whether it was
// fresh (no lease taken, not started, open) or busy (a run executing in
// a queue, another waiting behind it, both left alone), and it takes and
// runs submissions afterwards. Shutdown(nil) is refused too, leaving the
// runtime open.
func TestNilContextIsRefusedByEveryCall(t *testing.T) {
	for _, tc := range nilCtxCalls {
		t.Run(tc.name+"/fresh", func(t *testing.T) {
			t.Parallel()
			rt := newRuntime(t, NewMemStore(), Config{})
			id, err := ScopedTaskKey("k", alice)
			if err != nil {
				t.Fatal(err)
			}
			err = callNilCtx(t, func() error { return tc.call(rt, id) })
			if !errors.Is(err, ErrInvalidOption) {
				t.Fatalf("returned %v, want ErrInvalidOption", err)
			}
			if rt.lease.held.Load() {
				t.Error("the call took the instance lease")
			}
			rt.mu.RLock()
			started := rt.started
			rt.mu.RUnlock()
			if started {
				t.Error("the call left the runtime marked started")
			}
			checkUntouched(t, rt)
		})
		t.Run(tc.name+"/busy", func(t *testing.T) {
			t.Parallel()
			rt := newRuntime(t, NewMemStore(), Config{})
			g := newGate()
			release := sync.OnceFunc(g.open)
			t.Cleanup(release) // before the Shutdown of newRuntime's cleanup
			running, err := rt.SubmitSequential(ctx, "q", "running", g.fn, alice)
			if err != nil {
				t.Fatal(err)
			}
			wait(t, g.started, "the queue's first run to start")
			waiting, err := rt.SubmitSequential(ctx, "q", "waiting", nopFn, alice)
			if err != nil {
				t.Fatal(err)
			}
			err = callNilCtx(t, func() error { return tc.call(rt, running.ID) })
			if !errors.Is(err, ErrInvalidOption) {
				t.Fatalf("returned %v, want ErrInvalidOption", err)
			}
			for id, want := range map[string]Status{running.ID: StatusRunning, waiting.ID: StatusPending} {
				snap, err := rt.Status(ctx, id, alice)
				if err != nil {
					t.Fatal(err)
				}
				if snap.Status != want {
					t.Errorf("task %s is %s after the call, want %s", id, snap.Status, want)
				}
			}
			release()
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			snap, err := rt.Wait(wctx, waiting.ID, alice)
			if err != nil {
				t.Fatalf("Wait for the waiting item: %v", err)
			}
			if snap.Status != StatusCompleted {
				t.Errorf("the waiting item ended %s, want COMPLETED", snap.Status)
			}
			checkUntouched(t, rt)
		})
	}
}

// checkUntouched checks that rt holds no stream or waiter left by a
// refused call, is open, and runs a submission of a key the calls named.
func checkUntouched(t *testing.T, rt *Runtime[*MemStore]) {
	t.Helper()
	if n := rt.hub.n.Load(); n != 0 {
		t.Errorf("%d stream subscriptions left", n)
	}
	if n := rt.bells.listeners.Load(); n != 0 {
		t.Errorf("%d Wait listeners left", n)
	}
	if rt.gate.isClosed() {
		t.Fatal("the runtime is closed")
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sub, err := rt.Submit(sctx, "k", nopFn, alice)
	if err != nil {
		t.Fatalf("Submit after the call: %v", err)
	}
	snap, err := rt.Wait(sctx, sub.ID, alice)
	if err != nil {
		t.Fatalf("Wait after the call: %v", err)
	}
	if snap.Status != StatusCompleted {
		t.Errorf("a submission after the call ended %s, want COMPLETED", snap.Status)
	}
}
