package workers

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"
)

// Shutdown stops the runtime in the manner of http.Server.Shutdown. It
// closes the runtime to submissions (submit calls return ErrClosed from
// then on); stops every sequential queue fetching and records each item
// that never started CANCELLED with the shutdown message; cancels every
// run in flight with ErrShutdown; stops the background loops (cleanup,
// sync); and waits until every run has settled or ctx ends. An
// already-done ctx means "do not wait".
//
// What a cancelled run records is its own doing: COMPLETED if its callback
// returns a result anyway, FAILED if it fails, CANCELLED with "Cancelled by
// worker shutdown" if it returns after its context ended. Shutdown writes
// no outcome for a run in flight, and holds no lock while it waits.
//
// Shutdown first waits for submissions already in progress to finish
// their registration (a store call each), without a bound. Do not call it
// from inside a task's callback: it would wait for that callback.
//
// The context bounds the waiting, not the abandon writes: recording the
// backlog CANCELLED needs no wait and happens even with a done ctx, so
// that no item is left PENDING.
//
// Shutdown returns nil when everything settled, and otherwise an error
// wrapping ctx.Err(). A run that outlives the wait keeps its handle, so
// zombie recovery does not call it dead, and releases it when its callback
// returns. Calling Shutdown again waits again for what is left. A runtime
// cannot be started again after Shutdown.
func (rt *Runtime[S]) Shutdown(ctx context.Context) error {
	rt.submitMu.Lock()
	rt.closed = true
	rt.submitMu.Unlock()

	queues, abandoned := rt.emptyQueues((*queue).drain)
	rt.abandon(abandoned)

	rt.mu.RLock()
	inflight := slices.Collect(maps.Keys(rt.runs))
	rt.mu.RUnlock()
	for _, t := range inflight {
		t.cancel(ErrShutdown)
	}
	if rt.stopLoops != nil {
		rt.stopLoops()
	}

	waits := make([]<-chan struct{}, 0, len(inflight)+len(queues)+len(rt.loopsDone))
	for _, t := range inflight {
		waits = append(waits, t.done)
	}
	for _, q := range queues {
		waits = append(waits, q.exited)
	}
	for _, done := range rt.loopsDone {
		waits = append(waits, done)
	}
	if n := waitAll(ctx, waits); n > 0 {
		return fmt.Errorf("workers: shutdown left %d runs or goroutines executing: %w", n, ctx.Err())
	}
	return nil
}

// emptyQueues takes the waiting items out of every queue with take, and
// returns the queues and the items.
func (rt *Runtime[S]) emptyQueues(take func(*queue) []*Task) ([]*queue, []*Task) {
	rt.mu.RLock()
	queues := slices.Collect(maps.Values(rt.queues))
	rt.mu.RUnlock()
	var items []*Task
	for _, q := range queues {
		items = append(items, take(q)...)
	}
	return queues, items
}

// waitAll waits until every channel is closed or ctx ends, and returns
// how many are still open. Channels already closed count as settled even
// when ctx is already done.
func waitAll(ctx context.Context, chans []<-chan struct{}) int {
	open := 0
	for _, ch := range chans {
		select {
		case <-ch:
			continue
		default:
		}
		if ctx.Err() == nil {
			select {
			case <-ch:
				continue
			case <-ctx.Done():
			}
		}
		select {
		case <-ch:
		default:
			open++
		}
	}
	return open
}

// abandon records queue items that will never run CANCELLED with the
// shutdown message, each write fenced on the run id its item carries from
// registration, and settles them. It must not be called with a queue lock held.
func (rt *Runtime[S]) abandon(items []*Task) {
	if len(items) == 0 {
		return
	}
	status, msg := causeOutcome(ErrShutdown)
	st := State{Status: status, Error: msg, CompletedAt: now()}
	for _, t := range items {
		t.cancel(ErrShutdown)
		rt.write("abandon", t, StatusPending, &st)
	}
	for _, t := range items {
		rt.settle(t)
	}
}

// Reset is for tests: it drops the runtime's live state without draining.
// It records waiting queue items CANCELLED as Shutdown does, cancels every
// run in flight with ErrShutdown without waiting for it, forgets every run
// handle, and clears the store's records if the store is volatile (it
// implements RecordClearer). It never deletes durable records. The
// runtime stays open; runs still executing settle on their own, and a
// later Shutdown waits for them. Since their handles are forgotten, a
// RecoverZombies after a Reset over a durable store fails them even while
// they execute.
func (rt *Runtime[S]) Reset(ctx context.Context) error {
	_, waiting := rt.emptyQueues((*queue).take)
	rt.abandon(waiting)

	rt.mu.Lock()
	inflight := slices.Collect(maps.Keys(rt.runs))
	clear(rt.handles)
	rt.mu.Unlock()
	for _, t := range inflight {
		t.cancel(ErrShutdown)
	}
	if rc, ok := any(rt.store).(RecordClearer); ok {
		return rc.ClearRecords(ctx)
	}
	return nil
}

// RecoverZombies marks FAILED every PENDING or RUNNING record that has no
// live run in this runtime, and returns how many it marked. Such a record
// was left by a process that died, or by a runtime that was dropped
// without Shutdown; nothing will ever finish it. Each write is fenced on
// the run id read, so a run registered meanwhile is never touched.
//
// Until it runs, such a record blocks its key: a submission of a live key
// joins it, and nothing will ever finish it.
//
// Liveness is read from this runtime's handles only: a run of another
// runtime sharing the store counts as dead. Call it at startup (see
// Config.RecoverZombies), before other runtimes over the same store
// begin work, or where the other processes are known to be gone.
func (rt *Runtime[S]) RecoverZombies(ctx context.Context) (int, error) {
	recs, err := rt.store.ListTasks(ctx, Filter{Statuses: []Status{StatusPending, StatusRunning}})
	if err != nil {
		return 0, err
	}
	status, msg := causeOutcome(ErrAbandoned)
	ts := now()
	n := 0
	for _, rec := range recs {
		// Under the task's lock, a registration's insert and the
		// publishing of its handle are one step: a run registered since
		// the list is either seen live here or has another run id.
		l := rt.keys.lock(rec.ID)
		ok, err := false, error(nil)
		st := rec.State
		st.Status, st.Error, st.CompletedAt = status, msg, ts
		if rt.handle(rec.ID, rec.RunID) == nil {
			ok, err = rt.store.TransitionTask(ctx, rec.ID, rec.RunID, []Status{rec.Status}, st)
		}
		rt.keys.unlock(rec.ID, l)
		if err != nil {
			return n, err
		}
		if ok {
			n++
			rt.emit(&change{kind: changeRecovered, id: rec.ID, runID: rec.RunID, queue: rec.Queue, state: st})
		}
	}
	return n, nil
}

// Cleanup deletes terminal records that completed more than olderThan
// ago and returns how many it deleted. The cleanup scheduler calls it
// every Config.CleanupInterval with Config.Retention. A negative
// olderThan is ErrInvalidOption.
func (rt *Runtime[S]) Cleanup(ctx context.Context, olderThan time.Duration) (int, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("%w: negative age %v", ErrInvalidOption, olderThan)
	}
	return rt.store.DeleteFinished(ctx, now().Add(-olderThan))
}

// every starts a background loop that calls f every interval until ctx
// ends; a zero interval starts nothing. Shutdown ends ctx and waits for
// the loop. Called only by Start, before it returns.
func (rt *Runtime[S]) every(ctx context.Context, interval time.Duration, f func(context.Context)) {
	if interval <= 0 {
		return
	}
	done := make(chan struct{})
	rt.loopsDone = append(rt.loopsDone, done)
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if ctx.Err() != nil {
					return // a tick that raced the stop
				}
				f(ctx)
			}
		}
	}()
}
