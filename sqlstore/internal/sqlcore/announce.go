package sqlcore

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// An announcer sends the notices of the rows group commit inserted
// without one (Dialect.InsertMany), once their insert has committed, off
// the inserting callers' path: the ids queued while a statement
// (Dialect.Announce) is in flight go together in the next.
//
// A statement that fails is tried again, with the notices queued since,
// after a backoff (up to announceBackoff), until the store stops. The
// notices of rows that a transaction elsewhere holds locked, which the
// statement skips, are tried again the same way, except that notices
// added meanwhile end the wait: they go at once, with the held ones,
// which cost them no wait. More than maxAnnounced notices waiting give
// way to one empty notice, which listeners take as "re-read everything",
// as they take a notice that never came once their connection is back.
//
// While its statements fail, inserts go as other writes do, notifying
// from the trigger (see Store.InsertTask), so that no new task goes
// unannounced meanwhile.
//
// Once stopped, it sends what is queued, once, and drops whatever that
// statement fails to send: the store is closing, and a replica's sync
// loop stays the fallback for any notice lost.
//
// The first statement to fail after one that did not is logged, at warn
// level, and the first to succeed after failures, at info level, so that
// an outage is told once however long it lasts.
type announcer struct {
	// send sends the notices of ids ("" for an empty notice) and returns
	// those of rows it found held, and skipped.
	send func(ctx context.Context, ids []string) (held []string, err error)
	log  *slog.Logger

	ctx    context.Context // ends when stop's wait runs out
	cancel context.CancelFunc

	mu      sync.Mutex
	queue   []string      // guarded by mu: ids, in the order their rows committed
	total   int           // guarded by mu: ids ever added, for tests
	resync  bool          // guarded by mu: the queue overflowed; send one empty notice for it
	running bool          // guarded by mu: a loop sends the queue
	stopped bool          // guarded by mu
	halt    chan struct{} // closed by stop: a backoff ends at once
	failing atomic.Bool   // the last statement failed (see Store.InsertTask)
	failed  int           // guarded by running: statements failed since the last that did not
	added   chan struct{} // signalled by add: a wait for held rows ends
	done    chan struct{} // guarded by mu: closed when the running loop returns
}

// Announcer limits: the notices one statement carries at most, waiting
// notices before they give way to one empty notice, one statement's
// bound, the longest backoff after a failure, and how long stop waits
// for the queue to go.
const (
	announceMax     = 1024
	maxAnnounced    = 8192
	announceTimeout = 5 * time.Second
	announceBackoff = time.Second
	announceStopped = time.Second
)

func newAnnouncer(send func(ctx context.Context, ids []string) ([]string, error), log *slog.Logger) *announcer {
	ctx, cancel := context.WithCancel(context.Background())
	return &announcer{send: send, log: log, ctx: ctx, cancel: cancel, halt: make(chan struct{}), added: make(chan struct{}, 1)}
}

// add queues the notices of ids, in order, and starts a loop to send
// them if none runs.
func (a *announcer) add(ids []string) {
	if len(ids) == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped {
		return
	}
	a.total += len(ids)
	switch {
	case a.resync:
		// The empty notice yet to go covers these rows: they committed
		// before it is sent.
	case len(a.queue)+len(ids) > maxAnnounced:
		clear(a.queue)
		a.queue, a.resync = a.queue[:0], true
	default:
		a.queue = append(a.queue, ids...)
	}
	if !a.running {
		a.running, a.done = true, make(chan struct{})
		go a.loop(a.done)
	}
	select {
	case a.added <- struct{}{}:
	default:
	}
}

// take removes the next statement's notices from the queue, or reports
// that none wait and the loop ends. a.mu is held.
func (a *announcer) take() []string {
	if a.resync {
		a.resync = false
		return []string{""}
	}
	if len(a.queue) == 0 {
		a.running = false
		return nil
	}
	n := min(len(a.queue), announceMax)
	batch := make([]string, n)
	copy(batch, a.queue)
	a.queue = append(a.queue[:0], a.queue[n:]...)
	return batch
}

// loop sends the queue until it is empty.
func (a *announcer) loop(done chan struct{}) {
	defer close(done)
	var backoff time.Duration
	for {
		a.mu.Lock()
		batch, stopped := a.take(), a.stopped
		a.mu.Unlock()
		if batch == nil {
			return
		}
		ctx, cancel := context.WithTimeout(a.ctx, announceTimeout)
		held, err := a.send(ctx, batch)
		cancel()
		a.failing.Store(err != nil)
		a.tell(err)
		if err == nil && len(held) == 0 {
			backoff = 0
			continue
		}
		if stopped {
			continue // dropped: see announcer
		}
		var added <-chan struct{}
		if err == nil {
			batch, added = held, a.added // the others went
		}
		a.mu.Lock()
		a.requeue(batch)
		a.mu.Unlock()
		backoff = min(max(2*backoff, 10*time.Millisecond), announceBackoff)
		select {
		case <-time.After(backoff):
		case <-a.halt:
		case <-added:
		}
	}
}

// tell logs the statement's outcome if it differs from the last one's;
// only the running loop calls it.
func (a *announcer) tell(err error) {
	switch {
	case err != nil:
		if a.failed++; a.failed == 1 {
			a.log.Warn("sqlstore: new tasks cannot be announced; each insert notifies from its own transaction meanwhile", "err", err)
		}
	case a.failed > 0:
		a.log.Info("sqlstore: new tasks are announced again", "failed statements", a.failed)
		a.failed = 0
	}
}

// requeue puts back the notices of a statement that failed, ahead of
// those queued since. a.mu is held.
func (a *announcer) requeue(batch []string) {
	switch {
	case a.resync:
	case len(batch) == 1 && batch[0] == "", len(batch)+len(a.queue) > maxAnnounced:
		clear(a.queue)
		a.queue, a.resync = a.queue[:0], true
	default:
		a.queue = append(batch, a.queue...)
	}
}

// stop sends what is queued, waiting for it at most announceStopped, and
// stops: the notices of later inserts are dropped.
func (a *announcer) stop() {
	a.mu.Lock()
	if a.stopped {
		a.mu.Unlock()
		return
	}
	a.stopped = true
	close(a.halt)
	done := a.done
	a.mu.Unlock()
	if done != nil {
		t := time.NewTimer(announceStopped)
		select {
		case <-done:
		case <-t.C:
			a.cancel()
			<-done
		}
		t.Stop()
	}
	a.cancel()
}
