package workers

import (
	"context"
	"runtime/pprof"
	"slices"
	"sync"
	"time"
)

// queue is a named sequential queue: a FIFO of registered runs and the one
// processor goroutine that starts them in order, at most
// Limits.QueueConcurrency at once (one by default).
type queue struct {
	name string
	opts runOptions // shared by its runs submitted without options

	// What a submission writes, a cache line away from opts, which the
	// runs read as they execute (see cacheLinePad).
	_        cacheLinePad
	mu       sync.Mutex
	items    fifo[*Task] // guarded by mu: registered runs waiting, in order
	next     *Task       // guarded by mu: the run taken off items, waiting for an admission slot
	running  []*Task     // guarded by mu: the runs executing now, in start order
	draining bool        // guarded by mu: set once by Shutdown; never cleared
	retired  bool        // guarded by mu: set once by reapQueues, the queue out of Runtime.queues; never cleared
	idle     bool        // guarded by mu: empty at reapQueues's last pass, and nothing pushed since

	// cancelled counts the items cancelled while they waited, since the
	// queue last dropped its cancelled items (see dropCancelled); guarded
	// by mu. It may count an item the processor took since: it only
	// paces the drops.
	cancelled int

	wake   chan struct{} // capacity 1: an item was pushed or a run settled
	exited chan struct{} // closed when the processor and its runs have returned
}

// queueOptions returns the options that the named queue's runs share
// when submitted without options of their own (the runtime's noOpts for
// the async path, ""); before the queue's first run, options of the
// run's own, so that a submission that registers nothing creates no
// queue.
func (rt *Runtime[S]) queueOptions(name string) *runOptions {
	if name == "" {
		return &rt.noOpts
	}
	rt.mu.RLock()
	q := rt.queues[name]
	rt.mu.RUnlock()
	if q != nil {
		return &q.opts
	}
	return &runOptions{queue: name, hub: &rt.hub}
}

// queue returns the named queue, creating it and starting its processor
// on first use, or nil once Shutdown has begun and the queue does not
// exist. Creation and the closed check share rt.mu with Shutdown's
// collection of the queues, so every queue created is drained.
func (rt *Runtime[S]) queue(name string) *queue {
	rt.mu.RLock()
	q := rt.queues[name]
	rt.mu.RUnlock()
	if q != nil {
		return q
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if q = rt.queues[name]; q == nil {
		if rt.gate.isClosed() {
			return nil // Shutdown has begun: it would never drain a new queue
		}
		if rt.made++; rt.made > queuesKept && len(rt.queues) >= queuesKept {
			rt.retireEmptyQueues()
		}
		q = &queue{
			name:   name,
			opts:   runOptions{queue: name, hub: &rt.hub},
			wake:   make(chan struct{}, 1),
			exited: make(chan struct{}),
		}
		rt.queues[name] = q
		go rt.process(q)
	}
	return q
}

// What push did with a run.
const (
	pushed      = iota
	pushRefused // the queue is draining, or the run was cancelled
	pushRetired // the queue was retired: the run goes to its successor
)

// push appends a run, and reports pushRefused if the queue is draining,
// or the run was cancelled: a submission that registered while Shutdown
// began (Shutdown waits only so long for those) finds the queue draining,
// and a run that a lost lease's sweep cancelled before it was queued,
// which the sweep's take of the queue's cancelled items (under mu)
// missed, must end at once rather than wait behind the items ahead of
// it. It reports pushRetired if reapQueues retired the queue.
func (q *queue) push(t *Task) int {
	q.mu.Lock()
	switch {
	case q.retired:
		q.mu.Unlock()
		return pushRetired
	case q.draining || t.cause() != nil:
		q.mu.Unlock()
		return pushRefused
	}
	q.items.push(t)
	q.idle = false
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return pushed
}

// queuesKept is how many queues a runtime keeps, empty or not, before
// the queues it makes retire the empty ones at once, one new queue in
// queuesKept, rather than at reapQueues' pace: a submitter that uses
// queue after queue, each one briefly (one name per tenant, say), holds
// about that many idle processors at most, with those of its queues in
// use, which Limits bound. Retiring at one new queue in queuesKept costs
// a new queue among many busy ones O(1), amortized.
const queuesKept = 256

// retireEmptyQueues retires the queues that are empty now, as
// reapQueues retires those empty at two passes in a row, and keeps them
// in rt.retiring until their processors end, for Shutdown to wait for.
// rt.mu is held.
func (rt *Runtime[S]) retireEmptyQueues() {
	rt.made = 0
	rt.retiring = slices.DeleteFunc(rt.retiring, func(q *queue) bool {
		select {
		case <-q.exited:
			return true
		default:
			return false
		}
	})
	rt.retiring = append(rt.retiring, rt.retireQueuesLocked(func(_ *queue, empty bool) bool { return empty })...)
}

// queueReapInterval is how often reapQueues looks for idle queues: a
// queue empty at two passes in a row, with nothing pushed in between,
// is retired.
const queueReapInterval = time.Minute

// reapQueues retires the queues that have been empty since its last
// pass: each is taken out of Runtime.queues and its processor ends, so
// that a process that submits to many queues (one per tenant, say) holds
// a goroutine only for those in use. A later submission to a retired
// queue's name starts a new one, as on first use.
//
// It returns once the retired queues' processors have ended: Shutdown
// waits for its loops, and so for them, which it no longer finds among
// the queues.
func (rt *Runtime[S]) reapQueues(context.Context) {
	for _, q := range rt.retireIdleQueues() {
		<-q.exited // at once: the queue is empty, and its processor woken
	}
}

// retireIdleQueues retires the queues that reapQueues retires, wakes
// their processors to end, and returns them.
func (rt *Runtime[S]) retireIdleQueues() []*queue {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.retireQueuesLocked(func(q *queue, empty bool) bool {
		retire := empty && q.idle
		q.idle = empty
		return retire
	})
}

// retireQueuesLocked retires the queues that pick picks, told whether
// each is empty (nothing waiting or running, and not draining): it takes
// them out of rt.queues, wakes their processors to end, and returns
// them. pick is called with the queue's mu held; it picks only empty
// queues. rt.mu is held.
func (rt *Runtime[S]) retireQueuesLocked(pick func(q *queue, empty bool) bool) (retired []*queue) {
	for name, q := range rt.queues {
		q.mu.Lock()
		retire := pick(q, q.items.len() == 0 && q.next == nil && len(q.running) == 0 && !q.draining)
		if retire {
			q.retired = true
			delete(rt.queues, name)
		}
		q.mu.Unlock()
		if retire {
			retired = append(retired, q)
			select {
			case q.wake <- struct{}{}:
			default:
			}
		}
	}
	return retired
}

// process is the queue's processor: it starts items in order until the
// queue drains. An item's place in the queue is held until its run has
// settled, which is after its callback really returned: a callback that
// outlived its timeout still holds it. With a concurrency of one the
// processor executes the item itself; above one, each item executes on
// its own goroutine, which the processor waits for before it exits.
//
// A callback that calls runtime.Goexit ends the processor's goroutine
// when it executes the item itself; the item's run has settled by then
// (see attempts), and the processor's deferred call frees its place and
// goes on with the queue on a new goroutine.
func (rt *Runtime[S]) process(q *queue) {
	// Started from a submitter's goroutine, whose profiler labels it
	// would keep, and hand on to its items' goroutines, while it lives.
	pprof.SetGoroutineLabels(context.Background())
	var wg sync.WaitGroup
	var inline *Task // the item this goroutine executes, if any
	drained := false
	defer func() {
		if !drained {
			q.settled(inline, false)
			go rt.process(q)
			return
		}
		wg.Wait()
		close(q.exited)
	}()
	width := max(1, rt.cfg.Limits.QueueConcurrency)
	for {
		q.mu.Lock()
		if q.draining || q.retired {
			q.mu.Unlock()
			drained = true
			return
		}
		if q.items.len() == 0 || len(q.running) >= width {
			q.mu.Unlock()
			<-q.wake
			continue
		}
		t, _ := q.items.pop()
		if t.adm == nil || t.cause() != nil {
			q.running = append(q.running, t)
			q.mu.Unlock()
		} else {
			q.next = t
			q.mu.Unlock()
			if !rt.adm.acquire(t.adm) {
				// Cancelled before it could wait, or the runtime is
				// draining: it never starts, and records its first cause.
				t.cancel(ErrShutdown)
			}
			q.mu.Lock()
			q.next = nil
			q.running = append(q.running, t)
			q.mu.Unlock()
		}

		if width == 1 {
			inline = t
			rt.execute(t)
			inline = nil
			<-t.doneChan() // a timed-out callback settles when it returns
			q.settled(t, false)
			continue
		}
		begun := make(chan struct{})
		wg.Go(func() {
			defer func() { // deferred: after a runtime.Goexit too
				<-t.doneChan()
				q.settled(t, true)
			}()
			rt.executeInOrder(t, begun)
		})
		<-begun // the next item starts after this one's start is written
	}
}

// settled frees the queue place of a run that has settled, and wakes
// the processor if it may be waiting for a place (wake).
func (q *queue) settled(t *Task, wake bool) {
	q.mu.Lock()
	if i := slices.Index(q.running, t); i >= 0 {
		q.running = slices.Delete(q.running, i, i+1)
	}
	q.mu.Unlock()
	if wake {
		select {
		case q.wake <- struct{}{}:
		default:
		}
	}
}

// drain stops the processor fetching and returns the items it will never
// run. Setting draining and taking the items happen in one critical
// section, so no item can slip between them; the abandon writes are the
// caller's, outside the queue lock.
func (q *queue) drain() []*Task {
	q.mu.Lock()
	q.draining = true
	items := q.items.takeAll()
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return items
}

// takeCancelled removes and returns the waiting items that were
// cancelled, keeping the others in order.
func (q *queue) takeCancelled() []*Task {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.takeCancelledLocked()
}

// queueDropMin is the fewest cancelled items a queue drops at once.
const queueDropMin = 64

// dropCancelled counts an item cancelled while it waited. Once the count
// reaches queueDropMin and half the waiting items, it takes the
// cancelled items out of the queue and returns them, for the caller to
// end: a queue holds no more cancelled items than waiting ones, nor than
// queueDropMin, for long, however many a tenant submits and cancels
// while the items ahead run (under Limits a cancelled item's waiting
// place is given back at once). A drop walks the queue once, after as
// many cancels as half its length: a cancel costs O(1), amortized.
func (q *queue) dropCancelled() []*Task {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.cancelled++; q.cancelled < queueDropMin || 2*q.cancelled < q.items.len() {
		return nil
	}
	return q.takeCancelledLocked()
}

// takeCancelledLocked is takeCancelled with mu held.
func (q *queue) takeCancelledLocked() []*Task {
	q.cancelled = 0
	var cancelled []*Task
	for _, t := range q.items.takeAll() {
		if t.cause() != nil {
			cancelled = append(cancelled, t)
		} else {
			q.items.push(t)
		}
	}
	return cancelled
}

// take removes and returns every waiting item without stopping the
// processor.
func (q *queue) take() []*Task {
	q.mu.Lock()
	items := q.items.takeAll()
	q.mu.Unlock()
	return items
}

// QueueStatus reports what the named sequential queue is doing. An Owner
// must pass the queue authorizer for the queue, and sees only the ids of
// tasks it may see (the counts include every item); System sees all. It
// answers from this runtime's memory: a watcher added by a join through
// another runtime is known here once the store's notice of it arrives
// (over a store without notices, once the record is read here).
// An item taken off the queue but waiting for a slot under
// Config.Limits is listed first among the pending. A queue that never
// received a submission is reported idle. Errors: ErrInvalidOption for
// a nil ctx, ErrNoAuthority, a *ValidationError (ErrInvalidKey), an
// *AuthorizationError, or ctx.Err().
func (rt *Runtime[S]) QueueStatus(ctx context.Context, name string, auth TaskAuthority) (QueueInfo, error) {
	if err := checkContext(ctx); err != nil {
		return QueueInfo{}, err
	}
	c, err := resolve(auth)
	if err != nil {
		return QueueInfo{}, err
	}
	if err := validateText("queue", name, MaxKeyLen, ErrInvalidKey); err != nil {
		return QueueInfo{}, err
	}
	if err := ctx.Err(); err != nil {
		return QueueInfo{}, err
	}
	if !c.system && !allowQueue(rt.store, rt.cfg.Logger, name, c.userID) {
		return QueueInfo{}, &AuthorizationError{Op: "queue status", Queue: name, UserID: c.userID}
	}
	info := QueueInfo{Name: name, State: QueueIdle, Pending: []string{}}
	rt.mu.RLock()
	q := rt.queues[name]
	rt.mu.RUnlock()
	if q == nil {
		return info, nil
	}
	q.mu.Lock()
	running := slices.Clone(q.running)
	items := slices.Collect(q.items.all())
	if q.next != nil {
		items = slices.Insert(items, 0, q.next)
	}
	q.mu.Unlock()
	// A cancelled item waits only to be skipped: it is not pending.
	items = slices.DeleteFunc(items, func(t *Task) bool { return t.cause() != nil })

	info.PendingCount = len(items)
	info.RunningCount = len(running)
	info.Load = len(items) + len(running)
	for _, t := range items {
		if t.visibleTo(c) {
			info.Pending = append(info.Pending, t.ID())
		}
	}
	for _, t := range running {
		if info.Running == "" && t.visibleTo(c) {
			info.Running = t.ID()
		}
	}
	switch {
	case len(running) > 0:
		info.State = QueueProcessing
	case len(items) > 0:
		info.State = QueueQueued
	}
	return info, nil
}
