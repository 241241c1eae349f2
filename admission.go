package workers

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Limits bounds what the runtime takes on. The zero value sets no bound:
// every submission starts at once on its own goroutine, as without
// limits. Each field's zero means "no cap"; a negative value makes Start
// return ErrInvalidOption.
//
// # Admission
//
// A submission that starts a new run is admitted in one of three ways
// (a join is never refused, and gives back the place it reserved before
// it read the store once it has joined): it starts at once when the
// runtime and its owner are under their running caps and none of the
// owner's tasks waits for a running slot (a queue item waits for one
// only once its turn in its queue has come); otherwise it waits, as a
// PENDING record, when its owner is under OwnerLimits.Waiting and the
// runtime under MaxWaiting; otherwise it is refused with a *QuotaError
// (ErrQuotaExceeded) and nothing is written to the store. A waiting task holds no goroutine. It is visible
// to its watchers, Cancel ends it without ever starting it, and Shutdown
// records it CANCELLED like a sequential backlog item.
//
// # Fair dispatch
//
// When a slot frees, the next task to start is chosen by weighted
// round-robin (deficit round-robin with a cost of one per task) over the
// owners that have waiting work and are under their own running cap: each
// owner's turn starts up to OwnerLimits.Weight of its tasks (one by
// default), in its submission order, then the turn passes on; an owner
// that reaches its running cap mid-turn loses the rest of it. System is
// one more member of that rotation, with a weight of one and under no
// owner cap: it gets a turn every round however many owners wait, and no
// owner's backlog delays it, or another owner's first task, by more than
// one round (the sum of the other waiting owners' weights: one task each
// by default).
//
// A sequential queue keeps its order under limits: its next item waits
// for a slot in its owner's turn, and the items behind it wait with it.
//
// # Slots
//
// A slot is taken when the callback is about to start and given back
// when the run has settled: after its callback has really returned and
// its terminal record is written. A callback that outlives its timeout
// (WithTimeout) and ignores its context keeps its slot until it returns,
// while its record says FAILED at once.
//
// Limits are this runtime's own: replicas that share a store each apply
// theirs to the work they run.
type Limits struct {
	// MaxRunning caps the callbacks executing at once in this runtime,
	// across owners, System and queues. Defaults to 0: no cap.
	MaxRunning int

	// MaxWaiting caps the tasks waiting for a slot in this runtime
	// (System's included), as a last bound on memory when owners are
	// many. Defaults to 0: no cap.
	MaxWaiting int

	// QueueConcurrency is how many items of one sequential queue execute
	// at once. One keeps a queue strictly one at a time, in submission
	// order; above one, items still start in submission order. An item
	// holds its place until its callback has returned, even past its
	// timeout. It applies with or without the other limits. Defaults to
	// 1.
	QueueConcurrency int

	// Owner is every owner's limits, unless OwnerLimits says otherwise.
	// System is never under owner limits.
	Owner OwnerLimits

	// OwnerLimits, when set, returns an owner's limits (tiers, plans):
	// it is called with the submission's context for every submission of
	// an Owner, before the runtime knows whether it joins a live run, so
	// keep it cheap (cache what it reads); its answer applies from then on
	// to that owner's admission. An error refuses the submission, wrapped,
	// and nothing is written; so does an answer with a negative field
	// (ErrInvalidConfig). Defaults to nil: Owner for all.
	OwnerLimits func(ctx context.Context, owner Owner) (OwnerLimits, error)
}

// OwnerLimits are one owner's caps. Zero fields set no cap.
type OwnerLimits struct {
	// Running caps the owner's callbacks executing at once.
	Running int
	// Weight is how many of the owner's waiting tasks start per turn of
	// fair dispatch, for tiers that buy a larger share when the runtime
	// is saturated. Zero or one means one.
	Weight int
	// Waiting caps the owner's tasks waiting: for a slot, or for their
	// turn in a sequential queue. A submission past it is refused with a
	// *QuotaError.
	Waiting int
}

// set reports whether l bounds anything the admission controller keeps.
func (l Limits) set() bool {
	return l.MaxRunning > 0 || l.MaxWaiting > 0 || l.Owner != (OwnerLimits{}) || l.OwnerLimits != nil
}

func (l Limits) validate() error {
	if l.MaxRunning < 0 || l.MaxWaiting < 0 || l.QueueConcurrency < 0 {
		return fmt.Errorf("%w: negative limit", ErrInvalidOption)
	}
	return l.Owner.validate()
}

func (l OwnerLimits) validate() error {
	if l.Running < 0 || l.Waiting < 0 || l.Weight < 0 {
		return fmt.Errorf("%w: negative limit", ErrInvalidOption)
	}
	return nil
}

// Where a run stands with admission; guarded by admission.mu.
const (
	slotNone    uint8 = iota // holds nothing: never admitted, or released
	slotWaiting              // counted in its owner's waiting
	slotRunning              // holds a running slot
)

// admit is a run's standing with the admission controller.
type admit struct {
	load  *ownerLoad
	slot  uint8         // guarded by admission.mu
	since time.Time     // guarded by admission.mu: when the slot was taken
	grant chan struct{} // for a queue item: closed when it gets its slot, or must end
	waits bool          // set by reserve, then read-only: an async run that must wait
	t     *Task         // set once registered, before it is queued
}

// ownerLoad is what one owner (or System) has running and waiting.
type ownerLoad struct {
	id      string      // the owner's id; "" for System
	limits  OwnerLimits // the owner's latest limits
	running int
	waiting int      // waiting tasks, in fifo or in a sequential queue
	fifo    []*admit // tickets ready to start, in submission order
	inRing  bool
}

// admission is the runtime's admission controller: nil without Limits,
// so the unlimited path pays one nil check per submission and per settle.
type admission struct {
	limits Limits
	start  func(*Task) // starts an admitted async run on its own goroutine

	mu       sync.Mutex
	running  int                   // guarded by mu
	waiting  int                   // guarded by mu
	owners   map[string]*ownerLoad // guarded by mu: owners with anything running or waiting, and up to idleOwners idle ones
	system   ownerLoad             // guarded by mu
	ring     []*ownerLoad          // guarded by mu: owners with tickets, in turn order
	cursor   int                   // guarded by mu: the ring index whose turn is next
	turn     *ownerLoad            // guarded by mu: the owner whose turn is under way, or nil
	credit   int                   // guarded by mu: the starts left in turn's turn
	avg      time.Duration         // guarded by mu: moving average of how long a slot is held
	draining bool                  // guarded by mu
	drained  chan struct{}         // closed when draining is set
}

func newAdmission(l Limits, start func(*Task)) *admission {
	return &admission{limits: l, start: start, owners: make(map[string]*ownerLoad), drained: make(chan struct{})}
}

// reserve decides a submission's admission before anything is written.
// It returns the run's standing, holding a running slot or a waiting
// place, or a *QuotaError (with the owner's load, so that a join can go
// on without quota). A sequential item always takes a waiting place.
func (a *admission) reserve(ctx context.Context, c caller, sequential bool) (*admit, error) {
	lim := a.limits.Owner
	if !c.system && a.limits.OwnerLimits != nil {
		l, err := a.limits.OwnerLimits(ctx, Owner{id: c.userID})
		if err != nil {
			return nil, fmt.Errorf("workers: owner limits of %q: %w", c.userID, err)
		}
		if err := l.validate(); err != nil {
			// A negative cap would read as none. The answer is the
			// service's own mistake, not its caller's.
			return nil, fmt.Errorf("%w: owner limits of %q: %v", ErrInvalidConfig, c.userID, err)
		}
		lim = l
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	o := &a.system
	if !c.system {
		o = a.owners[c.userID]
		if o == nil {
			o = &ownerLoad{id: c.userID}
			a.owners[c.userID] = o
		}
		o.limits = lim
	}
	r := &admit{load: o}
	if sequential {
		r.grant = make(chan struct{})
	}
	if !sequential && len(o.fifo) == 0 && under(a.running, a.limits.MaxRunning) && under(o.running, o.limits.Running) {
		a.take(r, false)
		return r, nil
	}
	if !under(o.waiting, o.limits.Waiting) {
		// The owner's waiting drains through its own running slots.
		return r, a.refusal("owner waiting", o.limits.Waiting, o.waiting, cmp.Or(o.limits.Running, a.limits.MaxRunning), o)
	}
	if !under(a.waiting, a.limits.MaxWaiting) {
		// The runtime's, through all of them: MaxRunning, or, without it,
		// as many as run now.
		return r, a.refusal("runtime waiting", a.limits.MaxWaiting, a.waiting, cmp.Or(a.limits.MaxRunning, a.running, o.limits.Running), o)
	}
	r.slot = slotWaiting
	r.waits = !sequential
	o.waiting++
	a.waiting++
	return r, nil
}

func under(n, limit int) bool { return limit <= 0 || n < limit }

// refusal builds the *QuotaError of a submission refused by limit. Its
// retry hint is how long the current waiting ahead of it should take to
// drain through lanes running slots at the recent pace, between one
// second and five minutes.
func (a *admission) refusal(which string, limit, current, lanes int, o *ownerLoad) error {
	a.forget(o)
	lanes = max(1, lanes)
	hint := a.avg * time.Duration(1+current/lanes)
	return &QuotaError{Owner: o.id, Limit: which, Max: limit, Current: current, Retry: min(max(hint, time.Second), 5*time.Minute)}
}

// take gives r a running slot; mu is held. A run that waited is timed,
// for the retry hint: refusals happen only when tasks wait, and an
// uncontended start then pays no clock reading.
func (a *admission) take(r *admit, timed bool) {
	r.slot = slotRunning
	if timed {
		r.since = time.Now()
	}
	r.load.running++
	a.running++
}

// idleOwners is how many idle owners' entries admission keeps, so that
// an owner who submits often is not re-created each time.
const idleOwners = 1024

// forget drops an owner's entry once nothing of it is left, when idle
// entries are many; mu is held. An entry already replaced (a refused
// reservation outlives its owner's entry) is left alone, and System's
// entry is not in the map.
func (a *admission) forget(o *ownerLoad) {
	if o.running == 0 && o.waiting == 0 && !o.inRing && len(a.owners) > idleOwners && a.owners[o.id] == o {
		delete(a.owners, o.id)
	}
}

// enqueue queues a registered async run that must wait for a slot, and
// reports false once the runtime drains, or when the run was cancelled
// already (the caller then ends the run). A run that Cancel or a lost
// lease cancels later is taken out by its canceller (cancelWaiting,
// takeCancelled), whose check is serialized with this one by mu.
func (a *admission) enqueue(r *admit) bool {
	a.mu.Lock()
	if a.draining || r.t.cause() != nil {
		a.mu.Unlock()
		return false
	}
	a.push(r)
	ready := a.pick()
	a.mu.Unlock()
	a.launch(ready)
	return true
}

// push appends a ticket to its owner's fifo; mu is held.
func (a *admission) push(r *admit) {
	o := r.load
	o.fifo = append(o.fifo, r)
	if !o.inRing {
		o.inRing = true
		a.ring = append(a.ring, o)
	}
}

// pick hands free slots to waiting tickets, weighted round-robin over
// the owners in the ring that are under their running cap (see Limits);
// mu is held. It returns the tickets to launch outside the lock.
func (a *admission) pick() []*admit {
	var ready []*admit
	for len(a.ring) > 0 && under(a.running, a.limits.MaxRunning) {
		i := a.nextTurn()
		if i < 0 {
			break // every owner with work is at its own cap
		}
		o := a.ring[i]
		if o != a.turn {
			a.turn, a.credit = o, max(1, o.limits.Weight) // a new turn
		}
		r := o.fifo[0]
		o.fifo[0] = nil
		o.fifo = o.fifo[1:]
		a.cursor = i // its turn goes on while it has credit
		if a.credit--; a.credit == 0 {
			a.cursor, a.turn = i+1, nil
		}
		if len(o.fifo) == 0 {
			o.fifo = nil
			o.inRing = false
			a.ring = slices.Delete(a.ring, i, i+1)
			a.cursor, a.turn = i, nil // the next owner moved into i
		}
		if a.cursor >= len(a.ring) {
			a.cursor = 0
		}
		if r.slot != slotWaiting || r.t.cause() != nil {
			// Cancelled while it waited: it ends without starting, so it
			// takes no slot; its waiting place, if Cancel did not give it
			// back, frees when it settles.
			ready = append(ready, r)
			continue
		}
		o.waiting--
		a.waiting--
		a.take(r, true)
		ready = append(ready, r)
	}
	return ready
}

// nextTurn returns the ring index of the next owner, from the cursor on,
// that may start a task, or -1; mu is held.
func (a *admission) nextTurn() int {
	n := len(a.ring)
	for k := range n {
		i := (a.cursor + k) % n
		if o := a.ring[i]; under(o.running, o.limits.Running) { // System's limits are zero
			return i
		}
	}
	return -1
}

// launch starts tickets picked under the lock.
func (a *admission) launch(ready []*admit) {
	for _, r := range ready {
		if r.grant != nil {
			close(r.grant)
		} else {
			a.start(r.t)
		}
	}
}

// acquire waits for a queue item's running slot. It reports false when
// the runtime began draining first, or the item was cancelled before it
// could wait; an item cancelled meanwhile may be let through without a
// slot, since it ends without starting.
func (a *admission) acquire(r *admit) bool {
	if !a.enqueue(r) {
		return false
	}
	r.t.begin() // the queue's next item: its context is made now, to watch
	select {
	case <-r.grant:
		return true
	case <-r.t.ctx.Done():
	case <-a.drained:
	}
	a.mu.Lock()
	withdrawn := a.withdrawLocked(r)
	a.mu.Unlock()
	if withdrawn {
		return false
	}
	<-r.grant // picked as it was withdrawn
	return true
}

// isWaiting reports whether r holds a place in its owner's waiting: its
// run waits for its turn and has not started.
func (a *admission) isWaiting(r *admit) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return r.slot == slotWaiting
}

// cancelWaiting gives back the waiting place of a run cancelled before
// it started, at once, and reports whether it was an async run waiting
// in its owner's fifo: the caller then ends it, and it never starts. A
// queue item is left to its processor, which skips it.
func (a *admission) cancelWaiting(r *admit) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r.slot != slotWaiting {
		return false
	}
	r.slot = slotNone
	r.load.waiting--
	a.waiting--
	ended := r.grant == nil && a.withdrawLocked(r)
	a.forget(r.load)
	return ended
}

// withdrawLocked takes a waiting ticket out of its owner's fifo, and
// reports whether it was there; mu is held.
func (a *admission) withdrawLocked(r *admit) bool {
	o := r.load
	i := slices.Index(o.fifo, r)
	if i < 0 {
		return false
	}
	o.fifo = slices.Delete(o.fifo, i, i+1)
	if len(o.fifo) == 0 {
		o.fifo = nil
		o.inRing = false
		j := slices.Index(a.ring, o)
		a.ring = slices.Delete(a.ring, j, j+1)
		if j < a.cursor {
			a.cursor--
		}
		if a.turn == o {
			a.turn = nil
		}
		if a.cursor >= len(a.ring) {
			a.cursor = 0
		}
	}
	return true
}

// release gives back whatever r holds, once its run has settled, and
// starts the tickets the freed slot lets in. It is idempotent.
func (a *admission) release(r *admit) {
	a.mu.Lock()
	o := r.load
	switch r.slot {
	case slotRunning:
		o.running--
		a.running--
		if !r.since.IsZero() {
			held := time.Since(r.since)
			if a.avg == 0 {
				a.avg = held
			} else {
				a.avg += (held - a.avg) / 8
			}
		}
	case slotWaiting:
		o.waiting--
		a.waiting--
	}
	r.slot = slotNone
	a.forget(o)
	var ready []*admit
	if !a.draining {
		ready = a.pick()
	}
	a.mu.Unlock()
	a.launch(ready)
}

// drain stops dispatch and returns the async runs still waiting, for
// Shutdown to record CANCELLED. Queue items waiting for a slot are woken
// to end themselves.
func (a *admission) drain() []*Task {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.draining {
		a.draining = true
		close(a.drained)
	}
	return a.takeLocked()
}

// takeWaiting returns the async runs waiting, without stopping dispatch,
// for Reset.
func (a *admission) takeWaiting() []*Task {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.takeLocked()
}

// takeCancelled takes the async runs cancelled while they waited out of
// the fifos, for the caller to end: they never start.
func (a *admission) takeCancelled() []*Task {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.takeLocked(func(r *admit) bool { return r.t.cause() != nil })
}

// takeLocked empties the fifos of their async tickets (those also
// chooses, if given); mu is held. Queue
// items waiting for a slot stay: their processors withdraw them.
func (a *admission) takeLocked(also ...func(*admit) bool) []*Task {
	var items []*Task
	async := func(r *admit) bool {
		for _, f := range also {
			if !f(r) {
				return false
			}
		}
		return r.grant == nil
	}
	for _, o := range a.ring {
		// One pass, each ticket judged once: a cause may be set between
		// two looks, and a ticket dropped unreturned would never start.
		kept := o.fifo[:0]
		for _, r := range o.fifo {
			if async(r) {
				items = append(items, r.t)
			} else {
				kept = append(kept, r)
			}
		}
		clear(o.fifo[len(kept):])
		o.fifo = kept
		o.inRing = len(o.fifo) > 0
	}
	a.ring = slices.DeleteFunc(a.ring, func(o *ownerLoad) bool { return !o.inRing })
	a.cursor, a.turn = 0, nil
	return items
}

// statsTopOwners is how many owners Stats reports.
const statsTopOwners = 10

// Stats is a point-in-time view of the runtime's load, as Runtime.Stats
// returns it.
type Stats struct {
	// Running counts the callbacks executing in this runtime (over
	// Limits, those holding a slot, a timed-out callback that has not
	// returned included).
	Running int
	// Waiting counts the tasks registered but not started: waiting for
	// a slot or in a sequential queue.
	Waiting int
	// Queues is each sequential queue's load, by name.
	Queues []QueueLoad
	// Owners is the owners with the most running and waiting tasks,
	// heaviest first, at most ten; System, when it has any, is the
	// entry with an empty Owner. It is tracked only under Limits: nil
	// without them.
	Owners []OwnerLoad
}

// QueueLoad is one sequential queue's load.
type QueueLoad struct {
	Name    string
	Running int
	// Waiting counts the queue's items not yet begun, including those
	// cancelled whose turn has not come (a cancelled item leaves the
	// queue when its turn comes, at once): a count that costs no walk of
	// the queue. QueueStatus lists only the items still to run.
	Waiting int
}

// OwnerLoad is one owner's load.
type OwnerLoad struct {
	Owner   string // the owner's id; "" for System
	Running int
	Waiting int
}

// Stats reports the runtime's load: running and waiting counts, per
// sequential queue, and the owners with the most load. It names owners
// and counts, never task ids, and only System may call it. Errors:
// ErrNoAuthority, an *AuthorizationError for an Owner, or ctx.Err().
func (rt *Runtime[S]) Stats(ctx context.Context, auth TaskAuthority) (Stats, error) {
	c, err := resolve(auth)
	if err != nil {
		return Stats{}, err
	}
	if !c.system {
		return Stats{}, &AuthorizationError{Op: "stats", UserID: c.userID}
	}
	if err := ctx.Err(); err != nil {
		return Stats{}, err
	}
	var st Stats
	rt.mu.RLock()
	queues := make([]*queue, 0, len(rt.queues))
	for _, q := range rt.queues {
		queues = append(queues, q)
	}
	rt.mu.RUnlock()
	live := rt.runs.len()
	queued := 0
	for _, q := range queues {
		q.mu.Lock()
		l := QueueLoad{Name: q.name, Running: len(q.running), Waiting: q.items.len()}
		if q.next != nil {
			l.Waiting++
		}
		q.mu.Unlock()
		queued += l.Waiting
		st.Queues = append(st.Queues, l)
	}
	slices.SortFunc(st.Queues, func(a, b QueueLoad) int { return cmp.Compare(a.Name, b.Name) })
	if rt.adm == nil {
		st.Running, st.Waiting = max(0, live-queued), queued
		return st, nil
	}
	a := rt.adm
	a.mu.Lock()
	st.Running, st.Waiting = a.running, a.waiting
	for _, o := range a.owners {
		if o.running+o.waiting > 0 {
			st.Owners = append(st.Owners, OwnerLoad{Owner: o.id, Running: o.running, Waiting: o.waiting})
		}
	}
	if a.system.running+a.system.waiting > 0 {
		st.Owners = append(st.Owners, OwnerLoad{Running: a.system.running, Waiting: a.system.waiting})
	}
	a.mu.Unlock()
	slices.SortFunc(st.Owners, func(x, y OwnerLoad) int {
		return cmp.Or(cmp.Compare(y.Running+y.Waiting, x.Running+x.Waiting), cmp.Compare(x.Owner, y.Owner))
	})
	if len(st.Owners) > statsTopOwners {
		st.Owners = st.Owners[:statsTopOwners]
	}
	return st, nil
}
