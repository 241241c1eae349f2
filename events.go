package workers

import (
	"context"
	"errors"
	"iter"
	"sync"
	"sync/atomic"
	"time"
)

// changeKind names a change in a task's life that this runtime made or
// saw.
type changeKind uint8

const (
	changeSubmitted changeKind = iota + 1 // a new run was registered (PENDING, or RUNNING if it starts at once)
	changeJoined                          // a submission joined a live run
	changeStarted                         // the run's start write landed (RUNNING)
	changeProgress                        // a progress write landed (sync loop)
	changeRetrying                        // an attempt failed and another follows
	changeFinished                        // a terminal write landed, whoever made it
	changeRecovered                       // recovery ended another run as abandoned
	changePanicked                        // an attempt's callback panicked (no write)
	changeReplaced                        // the record moved past the run with no end of its own (no write; see reportMoved)
)

// eventKinds maps a change to the event observers see; changeProgress has
// none.
var eventKinds = [...]EventKind{
	changeSubmitted: EventSubmitted,
	changeJoined:    EventJoined,
	changeStarted:   EventStarted,
	changeRetrying:  EventRetrying,
	changeFinished:  EventFinished,
	changeRecovered: EventRecovered,
	changePanicked:  EventPanicked,
	changeReplaced:  EventFinished,
}

// change is what emit reports: the store write that made it has landed.
type change struct {
	kind    changeKind
	id      string
	runID   string
	queue   string
	task    *Task     // the live run, when this runtime holds it; else nil
	created time.Time // the record's CreatedAt, when task is nil
	state   State     // the state the write stored (identity fields excluded)
	err     error     // the callback's error, for changeRetrying, changeFinished and changePanicked
}

// emit reports c to Wait's listeners and to the configured observers. It
// is called after the store write that made the change has landed, with
// no runtime, task or store lock held, from the goroutine that made the
// write. Without observers it costs the bell's one atomic load.
func (rt *Runtime[S]) emit(c *change) {
	rt.emitStreams(c)
	if len(rt.cfg.Observers) > 0 && eventKinds[c.kind] != 0 {
		rt.observe(c)
	}
}

// emitStreams is emit without the observers: Wait's listeners and the
// streams.
func (rt *Runtime[S]) emitStreams(c *change) {
	if c.kind < changePanicked { // the others, no writes, are for observers only
		if rt.hub.n.Load() > 0 {
			rt.hub.publish(c)
		}
		if c.kind != changeProgress {
			rt.bells.ring(c.id) // progress ends no Wait
		}
	}
}

// observe builds the event of c and hands it to every observer in turn.
// It is kept out of line so that emit stays cheap to inline.
//
//go:noinline
func (rt *Runtime[S]) observe(c *change) {
	if c.task != nil && c.task.has(runRetired) {
		return // its submission failed: observers never heard of it
	}
	e := Event{
		Kind:        eventKinds[c.kind],
		TaskID:      c.id,
		RunID:       c.runID,
		Queue:       c.queue,
		Status:      c.state.Status,
		Cause:       c.state.Cause,
		Attempt:     c.state.Attempt,
		Err:         c.err,
		CreatedAt:   c.created,
		StartedAt:   c.state.StartedAt,
		CompletedAt: c.state.CompletedAt,
		Task:        c.task,
	}
	ctx := context.Background()
	if t := c.task; t != nil {
		ctx, e.CreatedAt = t.valuesContext(), t.createdAt()
		e.Attempt = max(e.Attempt, t.Attempt())
	}
	if c.kind == changePanicked {
		if pe, ok := asPanic(c.err); ok {
			e.Stack = pe.Stack
		}
	}
	if c.kind == changeFinished || c.kind == changeRecovered || c.kind == changeReplaced {
		if !e.StartedAt.IsZero() {
			e.Duration = e.CompletedAt.Sub(e.StartedAt)
		}
	}
	for _, o := range rt.cfg.Observers {
		rt.notify(ctx, o, &e)
	}
}

// notify calls one observer, containing its panic.
func (rt *Runtime[S]) notify(ctx context.Context, o Observer, e *Event) {
	defer func() {
		if r := recover(); r != nil {
			rt.cfg.Logger.Error("workers: observer panicked", "event", e.Kind.String(), "task", e.TaskID, "run", e.RunID, "panic", r)
		}
	}()
	o.Observe(ctx, *e)
}

// Limits of one subscriber's memory.
const (
	// maxPending bounds the tasks a subscriber holds undelivered changes
	// for. Beyond it the subscriber drops them and resynchronizes from the
	// store, which yields every live task's current snapshot.
	maxPending = 256
	// maxTracked bounds the tasks Subscribe remembers as last seen live,
	// to notice their end when another process ends them.
	maxTracked = 4096
	// subscribePoll is how often Subscribe reads the store for tasks run
	// by other processes.
	subscribePoll = time.Second
	// maxUnread bounds the ids the hub holds to find the Subscribe
	// streams of (see hub.readAudiences). Beyond it every Subscribe
	// stream resynchronizes instead.
	maxUnread = 4096
)

// hub fans changes out to the subscribers of Watch and Subscribe. With
// no subscriber, a change costs emit one atomic load.
//
// A change reaches only the streams that may show it: the Watch streams
// of its task, and the Subscribe streams of System, of the task's owner
// and of its run's watchers. So a change costs the same however many
// streams other tenants have open. A change made without a live run here
// (another process's, told by a notice, or a recovery) comes without
// its watchers: the hub reads the record once, on a goroutine of its
// own, to find its Subscribe streams, which then read it each under
// their own authority (see readAudiences).
type hub struct {
	n atomic.Int32 // subscribers
	// listened is set by the first Resync the store's listener sent
	// (see heard).
	listened atomic.Bool
	mu       sync.Mutex
	subs     map[string]map[*subscriber]struct{} // guarded by mu: Subscribe's, by the caller's user id ("" for System)
	byID     map[string]map[*subscriber]struct{} // guarded by mu: Watch's, by task id
	// follows holds, by task id, the Subscribe streams that showed
	// another process's run of it live and have not shown its end: a
	// notice of the task reaches them whatever its record holds by the
	// time it is read (a new run without their caller, or nothing).
	follows map[string]map[*subscriber]struct{}
	// stales counts the calls of stale, written under mu: a stream that
	// follows a task it read compares it with the count before its read
	// (see follow). recent holds the count at each id's last stale since
	// the count forgotten, when recent was last cleared to bound it.
	stales    atomic.Uint64
	recent    map[string]uint64 // guarded by mu
	forgotten uint64            // guarded by mu
	// visits counts the calls of audience: each marks the streams it
	// reaches with its count (subscriber.visit), so that a stream whose
	// user is named twice among the watchers is reached once.
	visits uint64 // guarded by mu
	// steps counts the watcher names the fan-out of changes went
	// through, a look-up, a comparison or a set's insertion each, which
	// tests hold to a few per watcher and per stream.
	steps uint64 // guarded by mu

	pumping bool // guarded by the runtime's mu: the progress pump and the audience reader were started

	pokes runQueue      // runs whose progress changed, for the progress pump (flag runPoked)
	pump  chan struct{} // wakes the progress pump; capacity 1

	// sharing is set once, before any run, when runs' progress is
	// written to the store each Config.ProgressInterval.
	sharing bool
	shares  runQueue // runs whose progress changed since their last write (flag runShared)

	unreadMu sync.Mutex
	reading  bool                // guarded by unreadMu: the audience reader runs, or was started
	unread   map[string]struct{} // guarded by unreadMu: ids whose Subscribe streams are to be found
	overflow bool                // guarded by unreadMu: too many ids: every Subscribe stream re-reads
	reader   chan struct{}       // wakes the audience reader; capacity 1
}

// subscriber is one Watch or Subscribe stream's inbox. Changes are
// coalesced per task id: the inbox holds the latest snapshot of each,
// so its size is bounded by maxPending and never by how slowly the
// consumer reads.
type subscriber struct {
	c    caller
	id   string        // Watch's task id; "" for Subscribe
	f    Filter        // Subscribe's filter (VisibleTo unused)
	wake chan struct{} // capacity 1: something is pending
	gone bool          // guarded by hub.mu: removed from the hub
	// following holds the ids s is in hub.follows under; guarded by
	// hub.mu.
	following map[string]struct{}
	visit     uint64 // guarded by hub.mu: hub.visits when audience last reached s

	mu     sync.Mutex
	slots  map[string]*slot    // guarded by mu: undelivered changes per id
	stale  map[string]struct{} // guarded by mu: ids to read from the store
	resync bool                // guarded by mu: read everything from the store
	// skipped is set with resync when changes were passed over: the
	// inbox overflowed, or notices were lost. Subscribe says so
	// (ErrSkipped). Guarded by mu.
	skipped bool
	// hidden is, for Watch, the latest end offered of a run whose copy
	// of its watchers did not name the caller (a join made through
	// another runtime): the stream reads the record, and if the key has
	// moved on by then, the end of a run it showed the caller is still
	// theirs to see (a run's watchers only grow). Guarded by mu.
	hidden *Snapshot
}

// slot is the undelivered state of one task id.
type slot struct {
	ended   *Snapshot // the terminal snapshot of an older run, delivered first
	snap    Snapshot  // the latest snapshot
	revoked bool      // a newer run the subscriber may not see replaced the task
}

// endOf returns the terminal snapshot of run runID that the slot holds,
// or nil.
func (sl *slot) endOf(runID string) *Snapshot {
	for _, end := range []*Snapshot{sl.ended, &sl.snap} {
		if end != nil && end.RunID == runID && end.Status.Terminal() {
			return end
		}
	}
	return nil
}

// event is one change as the hub hands it to subscribers.
type event struct {
	snap     Snapshot
	watchers []string
	stack    string // a panicked run's stack: System's streams only (see offer)
}

func (h *hub) add(s *subscriber) {
	h.mu.Lock()
	if h.subs == nil {
		h.subs = make(map[string]map[*subscriber]struct{})
		h.byID = make(map[string]map[*subscriber]struct{})
		h.pump = make(chan struct{}, 1)
		h.reader = make(chan struct{}, 1)
	}
	addTo(h.index(s), h.key(s), s)
	h.n.Add(1)
	h.mu.Unlock()
}

// index returns the index s is kept in, and key its key there.
func (h *hub) index(s *subscriber) map[string]map[*subscriber]struct{} {
	if s.id == "" {
		return h.subs
	}
	return h.byID
}

func (h *hub) key(s *subscriber) string {
	if s.id == "" {
		return s.c.userID // "" for System
	}
	return s.id
}

func addTo(index map[string]map[*subscriber]struct{}, key string, s *subscriber) {
	m := index[key]
	if m == nil {
		m = make(map[*subscriber]struct{}, 1)
		index[key] = m
	}
	m[s] = struct{}{}
}

// remove takes s out of the hub; once is enough, and more does nothing.
func (h *hub) remove(s *subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s.gone {
		return
	}
	s.gone = true
	index, key := h.index(s), h.key(s)
	if m := index[key]; m != nil {
		if delete(m, s); len(m) == 0 {
			delete(index, key)
		}
	}
	for id := range s.following {
		h.unfollowLocked(s, id)
	}
	h.n.Add(-1)
}

// follow adds s to the followers of task id (see hub.follows), which s
// read when stales was since. A notice of id marked since then, before s
// followed, missed s: id is marked stale in s, to be read again (as it
// is when the hub no longer knows: recent was cleared since).
func (h *hub) follow(s *subscriber, id string, since uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s.gone {
		return
	}
	if since < h.forgotten || h.recent[id] > since {
		s.markStale(id)
	}
	if h.follows == nil {
		h.follows = make(map[string]map[*subscriber]struct{})
	}
	addTo(h.follows, id, s)
	if s.following == nil {
		s.following = make(map[string]struct{})
	}
	s.following[id] = struct{}{}
}

// unfollow takes s from the followers of task id.
func (h *hub) unfollow(s *subscriber, id string) {
	h.mu.Lock()
	h.unfollowLocked(s, id)
	h.mu.Unlock()
}

// unfollowLocked is unfollow; h.mu is held.
func (h *hub) unfollowLocked(s *subscriber, id string) {
	delete(s.following, id)
	if m := h.follows[id]; m != nil {
		if delete(m, s); len(m) == 0 {
			delete(h.follows, id)
		}
	}
}

// each calls f for every subscriber that may show a change of task id
// whose run's watchers are watchers: the Watch streams of id, and the
// Subscribe streams of System, of id's owner and of each watcher; h.mu
// is held.
func (h *hub) each(id string, watchers []string, f func(*subscriber)) {
	for s := range h.byID[id] {
		f(s)
	}
	h.audience(id, watchers, f)
}

// audience calls f for the Subscribe streams that may show a change of
// task id whose run's watchers are watchers; h.mu is held.
//
// It costs one look-up per watcher, whatever their number: a name given
// twice is told by the mark its streams already bear, not by comparing
// it with the names before it, which for the many watchers of a key
// that many callers submit would be O(W²) on every change.
func (h *hub) audience(id string, watchers []string, f func(*subscriber)) {
	for s := range h.subs[""] {
		f(s)
	}
	owner, owned := OwnerOf(id)
	if owned {
		for s := range h.subs[owner.id] {
			f(s)
		}
	}
	h.visits++
	h.steps += uint64(len(watchers))
	for _, w := range watchers {
		if owned && w == owner.id {
			continue
		}
		for s := range h.subs[w] {
			if s.visit != h.visits {
				s.visit = h.visits
				f(s)
			}
		}
	}
}

// fanSetStreams and fanSetWatchers are the numbers of a task's Watch
// streams and of its watchers past which fan checks the streams against
// a set of the watchers rather than against the list.
const (
	fanSetStreams  = 4
	fanSetWatchers = 16
)

// fan offers ev to the streams that may show it (see each); h.mu is
// held. A Subscribe stream that audience reaches may see it: it is
// System's, the owner's or a watcher's. A Watch stream of the task is
// checked against ev's watchers, in a set of them when both are many, so
// that N streams and W watchers cost O(N + W), not O(N·W).
func (h *hub) fan(ev *event) {
	id := ev.snap.ID
	watches := h.byID[id]
	var named map[string]struct{} // ev's watchers, when many are checked
	if len(watches) > fanSetStreams && len(ev.watchers) > fanSetWatchers {
		named = make(map[string]struct{}, len(ev.watchers))
		for _, w := range ev.watchers {
			named[w] = struct{}{}
		}
		h.steps += uint64(len(ev.watchers))
	}
	for s := range watches {
		var visible bool
		switch {
		case s.c.system:
			visible = true
		case named != nil:
			_, visible = named[s.c.userID]
			visible = visible || visibleTo(id, nil, s.c.userID) // the owner
			h.steps++
		default:
			visible = visibleTo(id, ev.watchers, s.c.userID)
			h.steps += uint64(len(ev.watchers))
		}
		s.offer(ev, visible)
	}
	h.audience(id, ev.watchers, func(s *subscriber) { s.offer(ev, true) })
}

// subscriptions calls f for every Subscribe stream; h.mu is held.
func (h *hub) subscriptions(f func(*subscriber)) {
	for _, m := range h.subs {
		for s := range m {
			f(s)
		}
	}
}

// everyone calls f for every subscriber; h.mu is held.
func (h *hub) everyone(f func(*subscriber)) {
	for _, index := range []map[string]map[*subscriber]struct{}{h.subs, h.byID} {
		for _, m := range index {
			for s := range m {
				f(s)
			}
		}
	}
}

// stale marks id for a store read: at once in its Watch streams, and in
// the Subscribe streams the audience reader finds; h.mu is held.
func (h *hub) stale(id string) {
	n := h.stales.Add(1)
	if h.recent == nil || len(h.recent) >= maxUnread {
		h.recent, h.forgotten = make(map[string]uint64), n-1
	}
	h.recent[id] = n
	for s := range h.byID[id] {
		s.markStale(id)
	}
	for s := range h.follows[id] {
		s.markStale(id)
	}
	if !h.othersSubscribe(id) {
		// Only System and the owner subscribe: they are the audience.
		h.audience(id, nil, func(s *subscriber) { s.markStale(id) })
		return
	}
	h.unreadMu.Lock()
	if !h.reading {
		// No reader (the runtime's loops have ended): every Subscribe
		// stream reads the record.
		h.unreadMu.Unlock()
		h.subscriptions(func(s *subscriber) { s.markStale(id) })
		return
	}
	if !h.overflow {
		if h.unread == nil {
			h.unread = make(map[string]struct{})
		}
		if h.unread[id] = struct{}{}; len(h.unread) > maxUnread {
			h.unread, h.overflow = nil, true
		}
	}
	h.unreadMu.Unlock()
	select {
	case h.reader <- struct{}{}:
	default:
	}
}

// othersSubscribe reports whether anyone but System and the owner of
// task id has a Subscribe stream: one of its run's watchers may; h.mu is
// held.
func (h *hub) othersSubscribe(id string) bool {
	owner, owned := OwnerOf(id)
	for user := range h.subs {
		if user != "" && (!owned || user != owner.id) {
			return true
		}
	}
	return false
}

// wakeWatches wakes every Watch stream, to choose its poll again.
func (h *hub) wakeWatches() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range h.byID {
		for s := range m {
			s.ring()
		}
	}
}

// readAudiences finds the Subscribe streams of the ids stale marked,
// until ctx ends: it reads each record once, as System, and marks the
// id in the streams of System, of its owner and of its watchers, which
// read it under their own authority, after the events they took before
// (so the read is never older than what a stream has shown). A task
// gone from the store is marked in the streams of System and its owner;
// a read that fails, in every Subscribe stream. It runs on a runtime
// loop, started with the first subscription.
func (h *hub) readAudiences(ctx context.Context, read func(context.Context, string) (Record, error)) {
	defer func() {
		// What is left, and what comes from now on, reaches every
		// Subscribe stream.
		h.mu.Lock()
		ids, overflow := h.takeUnread(false)
		h.subscriptions(func(s *subscriber) {
			if overflow {
				s.skipAll()
			}
			for id := range ids {
				s.markStale(id)
			}
		})
		h.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.reader:
		}
		ids, overflow := h.takeUnread(true)
		if overflow {
			h.mu.Lock()
			h.subscriptions((*subscriber).skipAll)
			h.mu.Unlock()
			continue
		}
		for id := range ids {
			rec, err := read(ctx, id)
			mark := func(s *subscriber) {
				if _, marked := h.follows[id][s]; !marked { // stale marked its followers
					s.markStale(id)
				}
			}
			h.mu.Lock()
			switch {
			case err == nil:
				h.audience(id, rec.Watchers, mark)
			case errors.Is(err, ErrNotFound):
				h.audience(id, nil, mark)
			default:
				h.subscriptions(mark)
			}
			h.mu.Unlock()
		}
	}
}

// takeUnread empties the ids left to the audience reader, and leaves
// reading set as the reader goes on or not.
func (h *hub) takeUnread(reading bool) (ids map[string]struct{}, overflow bool) {
	h.unreadMu.Lock()
	defer h.unreadMu.Unlock()
	ids, overflow = h.unread, h.overflow
	h.unread, h.overflow, h.reading = nil, false, reading
	return ids, overflow
}

// reread marks id for a store read in the streams that may show a run
// of it whose watchers are watchers: its live run learnt watchers from a
// read (see Runtime.snapshot), or its record moved past a run of this
// runtime's (see Runtime.reportMoved).
func (h *hub) reread(id string, watchers []string) {
	h.mu.Lock()
	h.each(id, watchers, func(s *subscriber) { s.markStale(id) })
	h.mu.Unlock()
}

// publish fans c out. A change without its live run (a recovery, a join
// of another process's run) is marked for a store read instead.
func (h *hub) publish(c *change) {
	t := c.task
	if t == nil || t.RunID() != c.runID {
		h.mu.Lock()
		h.stale(c.id)
		h.mu.Unlock()
		return
	}
	ev := &event{snap: Snapshot{
		ID: c.id, RunID: c.runID, Queue: c.queue, CreatedAt: t.createdAt(),
	}, watchers: t.watcherList(), stack: c.state.Stack}
	ev.snap.setState(&c.state)
	ev.snap.WatcherCount = len(ev.watchers)
	if c.state.Status == StatusRunning {
		ev.snap.Progress, ev.snap.Attempt = t.Progress(), max(c.state.Attempt, t.Attempt())
	}
	// A queue item reported before it began keeps its view in a state
	// made for it now, before hub.mu is taken.
	r := t.ensureState()
	h.mu.Lock()
	// Writes of one run land in order but may be reported out of it; the
	// end is final, so a late report of an earlier write is dropped: once
	// the view holds the end, or once the end was reported (runEndSeen),
	// which while nobody subscribed left the view as it was.
	if v := r.view.Load(); v != nil && v.Status.Terminal() || !c.state.Status.Terminal() && t.has(runEndSeen) {
		h.mu.Unlock()
		return
	} else if v != nil && c.kind == changeJoined && (v.Status != StatusPending || c.state.Status == StatusPending) {
		// A join changes the watchers only; the state it read may be
		// older than what was published since, unless what was
		// published is a PENDING the run left while nobody subscribed.
		ev.snap = *v
		ev.snap.WatcherCount = len(ev.watchers)
	}
	r.view.Store(&ev.snap)
	h.fan(ev)
	h.mu.Unlock()
}

// runQueue holds runs, each queued at most once until a pass takes it
// (the progress pump's, or shareProgress's), which a flag of the run
// says. Passes reuse the queue's two buffers, so that queueing a run
// allocates only when a buffer grows.
type runQueue struct {
	mu     sync.Mutex
	queued []*Task // guarded by mu
	spare  []*Task // guarded by mu: the buffer the last pass emptied
}

// add queues t unless flag says it is queued, and reports whether it
// did.
func (q *runQueue) add(t *Task, flag uint32) bool {
	if !t.claim(flag) {
		return false
	}
	q.mu.Lock()
	q.queued = append(q.queued, t)
	q.mu.Unlock()
	return true
}

// drain takes the runs queued, and calls f for each once its flag is
// cleared: f may queue it again.
func (q *runQueue) drain(flag uint32, f func(*Task)) {
	q.mu.Lock()
	batch := q.queued
	q.queued, q.spare = q.spare[:0], nil
	q.mu.Unlock()
	for i, t := range batch {
		batch[i] = nil
		t.flags.And(^flag)
		f(t)
	}
	q.mu.Lock()
	q.spare = batch[:0]
	q.mu.Unlock()
}

// poke queues t for the progress pump. It is SetProgress's path while
// someone subscribes: it never blocks on a subscriber, and queues a run
// at most once until the pump has taken it.
func (h *hub) poke(t *Task) {
	if !h.pokes.add(t, runPoked) {
		return
	}
	select {
	case h.pump <- struct{}{}:
	default:
	}
}

// share queues t for shareProgress: its progress changed. It queues a
// run at most once until shareProgress has taken it.
func (h *hub) share(t *Task) { h.shares.add(t, runShared) }

// pumpProgress turns pokes into progress events until ctx ends. It runs
// on a runtime loop, started with the first subscription.
func (h *hub) pumpProgress(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.pump:
		}
		h.pokes.drain(runPoked, h.progress)
	}
}

// progress offers t's live progress to the subscribers.
func (h *hub) progress(t *Task) {
	if h.n.Load() == 0 {
		return
	}
	r := t.run.Load()
	if r == nil {
		return // not begun
	}
	if t.cause() != nil || t.has(runFinishing) {
		// Ending: cancelled (its record may already say so), timed out
		// or writing its outcome. The snapshot last published may be an
		// older one, from before the end, if nobody subscribed then.
		return
	}
	ev := &event{watchers: t.watcherList()}
	h.mu.Lock()
	defer h.mu.Unlock()
	if v := r.view.Load(); v != nil && v.Status == StatusRunning {
		ev.snap = *v
	} else if v != nil && v.Status.Terminal() {
		return // ended
	} else {
		// Running since before anyone subscribed, or since a PENDING
		// view that nobody subscribed to see replaced: what the run
		// holds. A run busy with a write is left to it: the write's
		// change, once it lands, carries the progress.
		if !r.writeMu.TryLock() {
			return
		}
		running := r.running()
		started := r.last.startedAt
		r.writeMu.Unlock()
		if !running {
			return // not started
		}
		ev.snap = Snapshot{ID: t.ID(), RunID: t.RunID(), Queue: t.opts.queue, Status: StatusRunning, CreatedAt: t.createdAt(), StartedAt: started}
	}
	ev.snap.Progress, ev.snap.Attempt = t.Progress(), max(ev.snap.Attempt, t.Attempt())
	ev.snap.WatcherCount = len(ev.watchers)
	h.fan(ev)
}

// remote marks a notice from another process for the subscribers. A
// Resync makes every subscriber read what it follows, and says that
// changes were passed over when it follows a gap in the notices (see
// heard).
func (h *hub) remote(c Change, gap bool) {
	if c.Resync {
		if gap {
			h.mu.Lock()
			h.everyone((*subscriber).skipAll)
			h.mu.Unlock()
			return
		}
		h.resync()
		return
	}
	h.mu.Lock()
	h.stale(c.ID)
	h.mu.Unlock()
}

// heard reports whether notice c is a Resync that follows a gap in the
// notices: any but the first, which the listener sends as it starts.
func (h *hub) heard(c Change) (gap bool) {
	return c.Resync && h.listened.Swap(true)
}

// resync makes every subscriber read what it follows from the store.
func (h *hub) resync() {
	h.mu.Lock()
	h.everyone((*subscriber).resyncAll)
	h.mu.Unlock()
}

// resyncAll makes s read every task it follows from the store.
func (s *subscriber) resyncAll() {
	s.mu.Lock()
	s.resync = true
	s.mu.Unlock()
	s.ring()
}

// skipAll makes s read every task it follows from the store, after
// changes were passed over (see ErrSkipped).
func (s *subscriber) skipAll() {
	s.mu.Lock()
	s.resync, s.skipped = true, true
	s.mu.Unlock()
	s.ring()
}

func (s *subscriber) ring() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *subscriber) markStale(id string) {
	if s.id != "" && s.id != id {
		return
	}
	s.mu.Lock()
	if len(s.stale) >= maxPending {
		s.resync, s.skipped = true, true
		clear(s.stale)
	} else {
		s.stale[id] = struct{}{}
	}
	s.mu.Unlock()
	s.ring()
}

// offer coalesces ev into the inbox; visible says whether s's caller
// may see ev's run (see fan). It never blocks on the consumer. A
// panicked run's stack reaches System's streams only, as it does
// System's reads.
func (s *subscriber) offer(ev *event, visible bool) {
	snap := ev.snap
	if s.c.system {
		snap.Stack = ev.stack
	}
	id := snap.ID
	if s.id != "" && s.id != id {
		return
	}
	if s.id == "" && !visible {
		return // Subscribe never holds what its caller may not see
	}
	s.mu.Lock()
	defer s.ring()
	defer s.mu.Unlock()
	// A re-read that is due lists live tasks only, so the slot is kept
	// even then: a task that ends before the re-read still delivers its
	// end.
	cur := s.slots[id]
	switch {
	case !visible && (cur == nil || cur.snap.RunID == snap.RunID):
		// The run's copy of its watchers may predate a join made through
		// another runtime: Watch's store read decides, and a run that
		// truly excludes the caller ends the stream with ErrNotFound.
		s.stale[id] = struct{}{}
		if s.id != "" && snap.Status.Terminal() {
			s.hidden = &snap
		}
	case cur == nil:
		if len(s.slots) >= maxPending {
			s.resync, s.skipped = true, true
			clear(s.slots)
			return
		}
		s.slots[id] = &slot{snap: snap}
	case cur.snap.RunID == snap.RunID:
		if !cur.snap.Status.Terminal() {
			cur.snap = snap // the latest state replaces a backlog
		}
	case compareRuns(snap.RunID, cur.snap.RunID) == runEarlier:
		// A late report of a run the key has moved past: its end, which
		// the run reports after its re-run may have, is still delivered.
		if snap.Status.Terminal() && cur.ended == nil {
			cur.ended = &snap
		}
	case !visible:
		// A run the caller may not see replaced the one it followed.
		cur.revoked = true
	default:
		if cur.snap.Status.Terminal() && cur.ended == nil {
			ended := cur.snap
			cur.ended = &ended // the older run's end is still delivered
		}
		cur.snap = snap
		cur.revoked = false
	}
}

// takeEnd takes out of the inbox the terminal snapshot of run runID of
// task id, undelivered, and returns it, or nil.
func (s *subscriber) takeEnd(id, runID string) *Snapshot {
	return s.takeEndOf(id, func(run string) bool { return run == runID })
}

// takeHidden takes out the end of run runID offered while the run did
// not know the caller among its watchers (see subscriber.hidden), or nil.
func (s *subscriber) takeHidden(runID string) *Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.hidden; h != nil && h.RunID == runID {
		s.hidden = nil
		return h
	}
	return nil
}

// takeEndBefore takes out of the inbox the terminal snapshot, undelivered,
// of a run of task id that this runtime minted before runID, and returns
// it, or nil.
func (s *subscriber) takeEndBefore(id, runID string) *Snapshot {
	return s.takeEndOf(id, func(run string) bool { return compareRuns(run, runID) == runEarlier })
}

// takeEndOf takes out of the inbox the terminal snapshot, undelivered,
// of a run of task id that of picks, and returns it, or nil.
func (s *subscriber) takeEndOf(id string, of func(runID string) bool) *Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	sl := s.slots[id]
	if sl == nil {
		return nil
	}
	switch {
	case sl.ended != nil && of(sl.ended.RunID):
		end := sl.ended
		sl.ended = nil
		return end
	case sl.snap.Status.Terminal() && of(sl.snap.RunID):
		end := sl.snap
		delete(s.slots, id)
		return &end
	}
	return nil
}

// takeEnds takes out of the inbox the ends it holds, undelivered.
func (s *subscriber) takeEnds() []Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ends []Snapshot
	for id, sl := range s.slots {
		if sl.ended != nil {
			ends = append(ends, *sl.ended)
			sl.ended = nil
		}
		if sl.snap.Status.Terminal() {
			ends = append(ends, sl.snap)
			delete(s.slots, id)
		}
	}
	return ends
}

// take empties the inbox; skipped reports that changes were passed over
// since the last take.
func (s *subscriber) take() (slots []slot, stale []string, resync, skipped bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, sl := range s.slots {
		slots = append(slots, *sl)
		delete(s.slots, id)
	}
	for id := range s.stale {
		stale = append(stale, id)
		delete(s.stale, id)
	}
	resync, s.resync = s.resync, false
	skipped, s.skipped = s.skipped, false
	return slots, stale, resync, skipped
}

// streamable returns the error a stream (Watch, Subscribe) ends with at
// once: ErrClosed once the runtime's life has ended (Shutdown returned,
// or passed its cutoff), when no change will reach a stream again, or
// the error of taking the lease.
func (rt *Runtime[S]) streamable(ctx context.Context) error {
	if rt.life.Err() != nil {
		return ErrClosed
	}
	return rt.ensureLease(ctx)
}

// streamRead makes read, a store read of a stream (Watch, Subscribe),
// under ctx cut off also when the runtime's life ends (Shutdown returned,
// or passed its cutoff): a read the store does not answer then ends with
// ErrClosed, as the stream's wait for a change does, instead of holding
// the stream until the store answers or ctx ends.
func streamRead[S Store, T any](rt *Runtime[S], ctx context.Context, read func(context.Context) (T, error)) (T, error) {
	c, cancel := context.WithCancel(ctx)
	defer cancel()
	// A read is cut off a moment after the runtime's end, not at once:
	// one begun in a stream's closing pass, for a change that reached the
	// stream before, gets its answer from a store that gives it.
	var cut *time.Timer
	var mu sync.Mutex
	defer func() {
		mu.Lock()
		if cut != nil {
			cut.Stop()
		}
		mu.Unlock()
	}()
	defer context.AfterFunc(rt.life, func() {
		mu.Lock()
		cut = time.AfterFunc(streamReadGrace, cancel)
		mu.Unlock()
	})()
	v, err := read(c)
	if err != nil && ctx.Err() == nil && c.Err() != nil {
		var zero T
		return zero, ErrClosed // cut off by the runtime's end
	}
	return v, err
}

// streamReadGrace is how long a stream's store read may go on past the
// runtime's end.
const streamReadGrace = time.Second

// newSubscriber returns the inbox of a stream of caller c: a Watch of
// task id, or a Subscribe narrowed by f when id is "".
func newSubscriber(c caller, id string, f Filter) *subscriber {
	return &subscriber{
		c: c, id: id, f: f,
		wake:  make(chan struct{}, 1),
		slots: make(map[string]*slot),
		stale: make(map[string]struct{}),
	}
}

// subscribe registers a subscriber and makes sure the progress pump runs.
func (rt *Runtime[S]) subscribe(c caller, id string, f Filter) *subscriber {
	s := newSubscriber(c, id, f)
	rt.hub.add(s)
	rt.mu.Lock()
	if !rt.hub.pumping {
		rt.hub.pumping = true
		rt.loops.goroutine(rt.hub.pumpProgress)
		if !rt.loops.halted {
			rt.hub.unreadMu.Lock()
			rt.hub.reading = true
			rt.hub.unreadMu.Unlock()
			rt.loops.goroutine(func(ctx context.Context) { rt.hub.readAudiences(ctx, rt.readRecord) })
		}
	}
	rt.mu.Unlock()
	return s
}

// Watch yields the snapshots of the task id as it changes (submitted,
// started, progress, retry, end), beginning with its current snapshot
// and ending after the terminal one. A caller who may not see the task
// gets one ErrNotFound and nothing else, as from Status. Authorization
// is checked again on every change: if the task is re-run and the new
// run's watchers exclude the caller, the stream never shows the new run;
// it ends with the end of the run the caller followed, if the caller had
// not read it yet, and with ErrNotFound otherwise. (The end of a run
// ended and re-run by another process before this runtime read that end
// is not in the store any more: the stream then ends with ErrNotFound,
// where Subscribe yields Gone.) Other errors end the stream as well:
// those of Status, ctx.Err() when ctx ends, and ErrClosed once the
// runtime's Shutdown has ended (returned, or passed its deadline's
// cutoff), after the changes that reached the stream before. A range
// that begins after Shutdown has ended yields ErrClosed alone, without the task's current snapshot:
// read that with Status or Wait, which work after Shutdown.
//
// Watch returns an iterator rather than a channel: the loop runs on the
// caller's goroutine, so there is no goroutine to leak and nothing to
// close; breaking out of the range, or ctx ending, unsubscribes at once.
// Changes are coalesced: a consumer that reads slowly is never queued a
// backlog, it sees the latest state of the task when it reads next, and
// its memory stays bounded. A slow consumer never slows the run:
// Task.SetProgress only stores a number and, while someone subscribes,
// hands the run to the runtime's progress pump without blocking. Per run,
// snapshots arrive in the order of the writes that made them, and the
// terminal one is always delivered, last.
//
// Changes made by this runtime reach Watch without a store read. A task
// run by another process is followed through the store's notices (see
// Notifier) with a store read per notice, or read every 50ms over a store
// without them.
func (rt *Runtime[S]) Watch(ctx context.Context, id string, auth TaskAuthority) iter.Seq2[Snapshot, error] {
	return func(yield func(Snapshot, error) bool) {
		c, err := resolveIn(ctx, auth)
		if err == nil {
			err = validateID(id)
		}
		if err == nil {
			err = rt.streamable(ctx)
		}
		if err != nil {
			yield(Snapshot{}, err)
			return
		}
		s := rt.subscribe(c, id, Filter{})
		defer rt.hub.remove(s)
		_, notices := any(rt.store).(Notifier)
		var last Snapshot
		emit := func(snap Snapshot) (more bool) {
			rt.keepProgress(&last, &snap)
			if nothingNew(&last, &snap) {
				return true
			}
			last = snap
			return yield(snap, nil) && !snap.Status.Terminal()
		}
		read := true // the first snapshot is read from the store
		closing := false
		// follow emits a report of this runtime's, unless it is a late
		// report of a run the key has moved past, or of a run that cannot
		// be ordered against the one last shown, which another runtime
		// minted: a store read then shows which run is current.
		follow := func(snap *Snapshot) (more bool) {
			switch compareRuns(snap.RunID, last.RunID) {
			case runEarlier:
				return true
			case runUnordered:
				read = true
				return true
			}
			if last.RunID != "" && snap.RunID != last.RunID {
				// A later run, while the one shown is live: that one
				// ended unseen here (another runtime cancelled it, say,
				// and its own end was fenced out by this run's record).
				// The read ends the stream with its end, or ErrNotFound.
				read = true
				return true
			}
			return emit(*snap)
		}
		for {
			if read {
				read = false
				rec, err := streamRead(rt, ctx, func(ctx context.Context) (Record, error) { return rt.visibleRecord(ctx, id, auth) })
				if errors.Is(err, ErrClosed) {
					yield(Snapshot{}, err)
					return
				}
				if last.RunID != "" && (errors.Is(err, ErrNotFound) || err == nil && rec.RunID != last.RunID) {
					// The run shown, live, is no longer the record's: it
					// ended and the key moved on (a re-run, a delete)
					// before this read. Its end, if this runtime
					// reported it, ends the stream; if not, that end is
					// no longer in the store, and the stream ends with
					// ErrNotFound rather than go on with another run.
					// A run shown to the caller keeps them among its
					// watchers: an end it offered while its copy did
					// not name them is theirs too.
					shownEnd := func() *Snapshot {
						if end := s.takeEnd(id, last.RunID); end != nil {
							return end
						}
						return s.takeHidden(last.RunID)
					}
					end := shownEnd()
					var t *Task
					if end == nil {
						t = rt.runOf(id, last.RunID) // superseded here, it holds the handle no more
					}
					for end == nil && t != nil && t.has(runFinishing|runCancelling|runEndWaiting) && !t.isSettled() {
						// Its end write is under way here, and may have
						// landed before the re-run: the run reports that
						// end as the write returns, and settles after
						// (a timed-out run's only once its callback
						// returns, if ever). The end's arrival wakes the
						// stream.
						select {
						case <-t.doneChan():
						case <-s.wake:
						case <-ctx.Done():
							yield(Snapshot{}, ctx.Err())
							return
						case <-rt.life.Done():
							yield(Snapshot{}, ErrClosed)
							return
						}
						end = shownEnd()
					}
					if end == nil {
						// Reported since the last look: as the wait ended,
						// or before the run, settled, left runOf.
						end = shownEnd()
					}
					if end != nil {
						emit(*end)
					} else {
						yield(Snapshot{}, ErrNotFound)
					}
					return
				}
				if err != nil {
					yield(Snapshot{}, err)
					return
				}
				if !emit(rt.snapshot(&rec, isSystem(auth))) {
					return
				}
			}
			slots, stale, resync, _ := s.take()
			for _, sl := range slots {
				if sl.revoked {
					// A run the caller may not see replaced the one it
					// followed: that one's end, if it came first, is
					// still the caller's to see, and ends the stream.
					if end := sl.endOf(last.RunID); end != nil {
						emit(*end)
					} else {
						yield(Snapshot{}, ErrNotFound)
					}
					return
				}
				if sl.ended != nil && !follow(sl.ended) {
					return
				}
				if !follow(&sl.snap) {
					return
				}
			}
			if len(stale) > 0 || resync {
				read = true
				continue
			}
			poll := rt.fallbackPoll(rt.handle(id, last.RunID) != nil, notices)
			select {
			case <-s.wake:
			case <-poll:
				read = true
			case <-ctx.Done():
				yield(Snapshot{}, ctx.Err())
				return
			case <-rt.life.Done():
				// Shutdown has returned: no change reaches the stream
				// again. What reached it first is taken once more.
				if closing {
					yield(Snapshot{}, ErrClosed)
					return
				}
				closing = true
			}
		}
	}
}

// Subscribe yields a snapshot each time a task the caller may see
// changes: for an Owner the tasks it owns or watches, for System every
// task, narrowed by the same options as List (WithStatus, WithQueue;
// WithLimit, WithOrder and WithCursor do not apply to a stream, though a
// value List refuses is refused here too). WithStatus chooses the tasks the
// stream shows: a task it has shown is followed to its end, each of its
// changes yielded whatever its status, so that a view of the running
// tasks learns when one ends. It begins with the current
// snapshot of every live task that passes, and runs until ctx ends, the
// consumer stops ranging, or the runtime's Shutdown has ended (returned,
// or passed its deadline's cutoff): ctx's end is yielded as its error,
// and Shutdown's as ErrClosed, after the changes that reached the
// stream before. A range that begins after Shutdown yields only those:
// no snapshot of the live tasks, which no longer change here. A task the
// caller may not see is never yielded, including the new run of a key
// re-run without the caller among its watchers.
//
// Like Watch it is an iterator on the caller's goroutine, coalescing per
// task with bounded memory: a consumer that falls far behind (more than
// 256 tasks with undelivered changes) skips to a fresh read of every live
// task, and so does every stream after the store's notices were
// interrupted (a listener's dropped connection, say). Either way the
// stream yields ErrSkipped first and goes on: a task that began and
// ended in the gap is never yielded, and a view that keeps ended tasks
// reads them again with List. Per task, snapshots arrive in order, and
// a task shown live is followed to an end: its run's terminal snapshot,
// or, when the stream cannot learn that run's end, a snapshot with Gone
// set, after which nothing more of that run is yielded. That happens
// when the run was another process's, or a resynchronization passed over
// its end, and
// by the time the stream read the record it held a new run (one the
// stream shows next, or one it may not show: without the caller among
// its watchers, or in another queue than WithQueue's), or was deleted.
// (A stream follows at most 4,096 shown tasks: one shown beyond that may
// get neither its end nor Gone.)
// Changes made by this runtime need no store read; tasks run by other
// processes are followed through the store's notices, or by reading the
// live tasks every second. A notice is read once by the runtime to find
// the streams that may show its task (System's, its owner's and its
// watchers'), each of which then reads it under its own authority.
//
// The subscription starts when Subscribe is called, not when the range
// begins, so a caller may subscribe, announce that it listens (an HTTP
// stream's headers, say), and only then range. A change made between the
// two is yielded all the same if this runtime made it, or heard of it
// from a Notifier store's notices, which it does once its listener runs
// (from Start, or from its first submission or range). A task of another
// process that ended before then, or over a store without notices, is not
// seen: the range begins with what is live. The subscription ends when
// the first range over the iterator ends or ctx does, whichever comes
// first; a later range subscribes anew, from its own start. An iterator
// never ranged holds its subscription, bounded in memory, until ctx ends.
//
// Any other error is yielded once and ends the stream: ErrNoAuthority,
// ErrInvalidOption for a nil ctx (the call then subscribes to nothing)
// or a WithStatus value that names no status, or a
// *ValidationError (ErrInvalidKey) for WithQueue's name, as from List,
// at once; ErrInvalidConfig (see NewRuntime) or the error of taking the
// instance lease; ctx.Err(); or ErrClosed.
func (rt *Runtime[S]) Subscribe(ctx context.Context, auth TaskAuthority, opts ...ListOption) iter.Seq2[Snapshot, error] {
	var o listOptions
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	f := o.f
	c, err := resolveIn(ctx, auth)
	if err == nil {
		err = o.check()
	}
	if err == nil && o.cursor != "" {
		_, _, err = decodeCursor(o.cursor)
	}
	var early *subscriber // the subscription the call starts, for the first range
	var stop func() bool  // ends the removal of early when ctx ends
	var taken atomic.Bool
	if err == nil && ctx.Err() == nil && rt.life.Err() == nil {
		early = rt.subscribe(c, "", f)
		stop = context.AfterFunc(ctx, func() { rt.hub.remove(early) })
	}
	return func(yield func(Snapshot, error) bool) {
		var s *subscriber // nil for a later range: it subscribes anew below
		if early != nil && !taken.Swap(true) {
			s = early
			defer stop()
		}
		// A subscription made by the call before Shutdown returned yields
		// what reached it, then ErrClosed; one made later, ErrClosed at once.
		closing := s != nil && rt.life.Err() != nil
		failed := err
		if failed == nil && !closing {
			failed = rt.streamable(ctx)
		}
		if failed != nil {
			if s != nil {
				rt.hub.remove(s)
			}
			yield(Snapshot{}, failed)
			return
		}
		if s == nil {
			s = rt.subscribe(c, "", f)
		}
		defer rt.hub.remove(s)
		_, notices := any(rt.store).(Notifier)
		// tracked is the last snapshot yielded of each live task.
		tracked := make(map[string]Snapshot)
		// shown holds the tracked tasks the stream has yielded: the
		// status filter chose them, and they are followed to their end.
		// It is true for a task the stream follows in the hub too (see
		// hub.follows): one it read as another process's run.
		shown := make(map[string]bool)
		unshow := func(id string) {
			if followed, ok := shown[id]; ok {
				delete(shown, id)
				if followed {
					rt.hub.unfollow(s, id)
				}
			}
		}
		// evictUnshown makes room in tracked for a task to show, by
		// letting go of one that was not shown, if there is one.
		evictUnshown := func() bool {
			for id := range tracked {
				if _, ok := shown[id]; !ok {
					delete(tracked, id)
					return true
				}
			}
			return false
		}
		// ended is the run last seen to end, per task: nothing of it, or
		// of an earlier run, follows its terminal snapshot, whichever path
		// brings it again.
		// Past maxTracked tasks, the one whose end was first recorded
		// is forgotten: an end is brought again soon after it was shown,
		// if at all (a notice's read that was slower than the event).
		ended := make(map[string]string)
		var endOrder []string // ended's ids, a ring from endNext
		endNext := 0
		end := func(id, runID string) {
			if _, ok := ended[id]; !ok {
				if len(endOrder) < maxTracked {
					endOrder = append(endOrder, id)
				} else {
					delete(ended, endOrder[endNext])
					endOrder[endNext] = id
					endNext = (endNext + 1) % maxTracked
				}
			}
			ended[id] = runID
		}
		// letGo stops following id. A task the stream showed is yielded
		// Gone: the store no longer holds its run for this stream (a new
		// run it may not show, or no record), so its end cannot be shown.
		var emit func(snap Snapshot, read bool) bool
		letGo := func(id string) bool {
			last := tracked[id]
			_, wasShown := shown[id]
			if wasShown {
				if e := s.takeEnd(id, last.RunID); e != nil {
					// This runtime reported the run's end, which the
					// inbox holds: it is shown, as if taken before.
					return emit(*e, false)
				}
			}
			delete(tracked, id)
			unshow(id)
			if !wasShown {
				return true
			}
			end(id, last.RunID)
			return yield(Snapshot{ID: id, RunID: last.RunID, Queue: last.Queue, Gone: true}, nil)
		}
		pass := func(snap *Snapshot) bool {
			return (len(f.Statuses) == 0 || contains(f.Statuses, snap.Status)) &&
				(f.Queue == "" || f.Queue == snap.Queue)
		}
		// stale lists the tasks to read from the store before the next
		// events are taken.
		var stale []string
		// readFrom is the hub's count of stale marks before the store
		// read whose records emit shows (see hub.follow).
		var readFrom uint64
		// behind reports whether an event of this runtime's, snap, must
		// not follow seen, the run last shown: it is a late report of an
		// earlier run, or of a run that cannot be ordered against seen,
		// which another runtime minted. A store read then shows which
		// run is current.
		behind := func(snap *Snapshot, seen string) bool {
			switch compareRuns(snap.RunID, seen) {
			case runEarlier:
				return true
			case runUnordered:
				stale = append(stale, snap.ID)
				return true
			}
			return false
		}
		// emit yields snap, an event of this runtime's or, when read is
		// set, a record read from the store after every event yielded so
		// far, which no event yielded before it can be newer than.
		emit = func(snap Snapshot, read bool) bool {
			e, isEnded := ended[snap.ID]
			if isEnded && e == snap.RunID {
				return true
			}
			last, ok := tracked[snap.ID]
			if !read && (isEnded && behind(&snap, e) || ok && behind(&snap, last.RunID)) {
				return true
			}
			if read && !ok {
				// The end of an earlier run that this runtime reported
				// since the subscription began, which the inbox holds,
				// comes first: after the read it would be dropped as an
				// earlier run's.
				if end := s.takeEndBefore(snap.ID, snap.RunID); end != nil && !emit(*end, false) {
					return false
				}
			}
			if _, wasShown := shown[snap.ID]; ok && wasShown && snap.RunID != last.RunID {
				// A new run of a task shown live, read from the store or
				// reported before the end of the run shown reached the
				// stream (a resynchronization passed over it, or the
				// re-run was reported first): that end comes first, if
				// the inbox holds it, or Gone.
				if !letGo(snap.ID) {
					return false
				}
				ok = false // letGo stopped following it: snap is its first
			}
			if f.Queue != "" && snap.Queue != f.Queue {
				// A run in another queue is not this stream's: never
				// shown, and a task whose new run went to another queue
				// is let go.
				return letGo(snap.ID)
			}
			if ok {
				rt.keepProgress(&last, &snap)
			}
			if ok && nothingNew(&last, &snap) {
				return true
			}
			_, followed := shown[snap.ID]
			if snap.Status.Terminal() {
				delete(tracked, snap.ID)
				unshow(snap.ID)
				end(snap.ID, snap.RunID)
			} else if ok || len(tracked) < maxTracked || pass(&snap) && evictUnshown() {
				tracked[snap.ID] = snap
			}
			if !followed && !pass(&snap) {
				return true
			}
			if _, ok := tracked[snap.ID]; ok {
				// Another process's run is followed in the hub, whose
				// notices of it reach this stream whatever its record
				// holds by then.
				remote := read && rt.handle(snap.ID, snap.RunID) == nil
				if f, was := shown[snap.ID]; !was || remote && !f {
					shown[snap.ID] = remote
					if remote {
						rt.hub.follow(s, snap.ID, readFrom)
					}
				}
			}
			return yield(snap, nil)
		}
		lf := Filter{Statuses: []Status{StatusPending, StatusRunning}, Queue: f.Queue}
		if !c.system {
			lf.VisibleTo = c.userID
		}
		// polled is set for a re-read that is only the timer's: this
		// runtime's own tasks are skipped then, their changes arriving as
		// events. A re-read after the inbox overflowed, or at the start,
		// shows every live task.
		polled := false
		resync := !closing // after Shutdown, what reached the subscription, and no read
		if resync {
			// The ends this runtime reported since the subscription
			// began precede the first read: they come first, before a
			// re-run the read shows, which may be another runtime's,
			// whose run id cannot be ordered against theirs.
			for _, end := range s.takeEnds() {
				if !emit(end, false) {
					return
				}
			}
		}
		for {
			if resync {
				readFrom = rt.hub.stales.Load()
				recs, err := streamRead(rt, ctx, func(ctx context.Context) ([]Record, error) { return rt.store.ListTasks(ctx, lf) })
				if err != nil {
					yield(Snapshot{}, err)
					return
				}
				live := make(map[string]struct{}, len(recs))
				for i := range recs {
					live[recs[i].ID] = struct{}{}
					if t := rt.handle(recs[i].ID, recs[i].RunID); polled && t != nil && t.visibleTo(c) {
						// This runtime's own: its changes arrive as
						// events. One its run does not know the caller
						// may see was joined elsewhere, which the run
						// learns of from this read (see snapshot).
						continue
					}
					if !emit(rt.snapshot(&recs[i], isSystem(auth)), true) {
						return
					}
				}
				for id := range tracked {
					if _, ok := live[id]; !ok {
						stale = append(stale, id) // ended or replaced elsewhere
					}
				}
				polled, resync = false, false
			}
			for _, id := range stale {
				readFrom = rt.hub.stales.Load()
				rec, err := streamRead(rt, ctx, func(ctx context.Context) (Record, error) { return rt.visibleRecord(ctx, id, auth) })
				switch {
				case err == ErrNotFound:
					if !letGo(id) {
						return
					}
				case err != nil:
					yield(Snapshot{}, err)
					return
				default:
					if !emit(rt.snapshot(&rec, isSystem(auth)), true) {
						return
					}
				}
			}
			stale = stale[:0]
			var slots []slot
			var skipped bool
			slots, stale, resync, skipped = s.take()
			if skipped && !yield(Snapshot{}, ErrSkipped) {
				return
			}
			for _, sl := range slots {
				if sl.ended != nil && !emit(*sl.ended, false) {
					return
				}
				if !emit(sl.snap, false) {
					return
				}
			}
			if len(stale) > 0 || resync || len(slots) > 0 {
				continue
			}
			var poll <-chan time.Time
			if !notices {
				poll = time.After(subscribePoll)
			}
			select {
			case <-s.wake:
			case <-poll:
				polled, resync = true, true
			case <-ctx.Done():
				yield(Snapshot{}, ctx.Err())
				return
			case <-rt.life.Done():
				// Shutdown has returned: no change reaches the stream
				// again. What reached it first is taken once more.
				if closing {
					yield(Snapshot{}, ErrClosed)
					return
				}
				closing = true
			}
		}
	}
}

// keepProgress sets the progress a stream that last yielded last shows
// in snap. A run this runtime executes shows its live progress, as Status
// does: a store read or an event that lags it cannot take it back, and a
// callback that lowers it (a retry that starts its work over, say) is
// shown doing so. Any other run's progress is kept from going back (see
// monotonic).
func (rt *Runtime[S]) keepProgress(last, snap *Snapshot) {
	if snap.Status == StatusRunning {
		if t := rt.handle(snap.ID, snap.RunID); t != nil {
			t.showLive(snap)
			return
		}
	}
	monotonic(last, snap)
}

// monotonic keeps a live run's progress from going back in a stream: a
// snapshot read from the store may carry progress stored before what a
// live event already showed.
func monotonic(last, snap *Snapshot) {
	if snap.RunID == last.RunID && !snap.Status.Terminal() && snap.Progress < last.Progress {
		snap.Progress = last.Progress
	}
}

// nothingNew reports whether a stream that last yielded last has nothing
// to yield in snap: the same snapshot, or one of the same run that shows
// an earlier state, a report queued before a store read the stream
// yielded first (PENDING after the read's RUNNING, or an earlier
// attempt). A run's status only moves forward, PENDING to RUNNING to its
// end, and its attempts only grow.
func nothingNew(last, snap *Snapshot) bool {
	if sameSnapshot(last, snap) {
		return true
	}
	if snap.RunID != last.RunID {
		return false
	}
	if r, l := statusRank(snap.Status), statusRank(last.Status); r != l {
		return r < l
	}
	return snap.Status == StatusRunning && snap.Attempt < last.Attempt
}

// statusRank orders the statuses of one run: PENDING, RUNNING, then the
// terminal ones.
func statusRank(s Status) int {
	switch s {
	case StatusPending:
		return 0
	case StatusRunning:
		return 1
	}
	return 2
}

// runOrder is how one run of a key stands to another.
type runOrder uint8

const (
	runSameOrLater runOrder = iota // the same run, a later one, or none to compare with
	runEarlier                     // registered before the other: its report is late
	runUnordered                   // minted by different runtimes: only the store tells
)

// compareRuns tells how run a of a key stands to run b ("" for none).
// A runtime numbers the runs it mints (see runIDs), so two runs minted
// by one runtime compare exactly. Runs minted by different runtimes
// carry creation times from different clocks, which may disagree by more
// than the time between two runs of a key: they are not ordered.
func compareRuns(a, b string) runOrder {
	if b == "" || a == b {
		return runSameOrLater
	}
	ia, na, okA := splitRunID(a)
	ib, nb, okB := splitRunID(b)
	switch {
	case !okA || !okB || ia != ib:
		return runUnordered
	case len(na) < len(nb) || len(na) == len(nb) && na < nb:
		return runEarlier
	}
	return runSameOrLater
}

// splitRunID splits a run id into its instance and its number, in base
// 36 without leading zeros, which compare as strings of one length do.
func splitRunID(runID string) (instance, n string, ok bool) {
	instance = InstanceOf(runID)
	if instance == "" || len(instance)+1 == len(runID) {
		return "", "", false
	}
	n = runID[len(instance)+1:]
	for j := 0; j < len(n); j++ {
		if c := n[j]; (c < '0' || c > '9') && (c < 'a' || c > 'z') {
			return "", "", false
		}
	}
	return instance, n, n[0] != '0'
}

func contains(ss []Status, s Status) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// sameSnapshot reports whether b says nothing a consumer of a has not
// seen.
func sameSnapshot(a, b *Snapshot) bool {
	return a.RunID == b.RunID && a.Status == b.Status && a.Progress == b.Progress &&
		a.Attempt == b.Attempt && a.Error == b.Error && a.WatcherCount == b.WatcherCount
}
