package workers

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Limits bounds what the runtime takes on. The zero value sets no bound:
// every submission starts at once on its own goroutine, as without
// limits. Each field's zero means "no cap"; a negative value is a Config
// the runtime cannot run with: Start, and every call that needs the
// runtime running, returns ErrInvalidConfig wrapping ErrInvalidOption
// (see NewRuntime).
//
// # Admission
//
// A submission that starts a new run is admitted in one of three ways (a
// join is never refused, and gives back the place it reserved before it
// read the store once it has joined): it starts at once when the runtime
// and its owner are under their running caps and none of the owner's tasks
// waits for a running slot (a queue item waits for one only once its turn
// in its queue has come); otherwise it waits, as a PENDING record, when
// its owner is under OwnerLimits.Waiting and the runtime under MaxWaiting
// (which a queue item is measured against always, even in an idle queue:
// it counts as waiting from its submission until it starts); otherwise
// it is refused with a *QuotaError (ErrQuotaExceeded) and
// nothing is written to the store. A waiting task holds no goroutine. It
// is visible to its watchers, Cancel ends it without ever starting it, and
// Shutdown records it CANCELLED like a sequential backlog item. A waiting
// task whose record is ended, replaced or deleted by someone else ends
// without starting, and gives its place back, as soon as the runtime
// learns of it (a store's notice, a Resync, a Cancel that finds the
// record gone): one whose record was deleted has ErrDeleted as the cause
// of its context.
//
// # Fair dispatch
//
// When a slot frees, the next task to start is chosen by weighted
// round-robin (deficit round-robin with a cost of one per task) over the
// owners that have waiting work and are under their own running cap: each
// owner's turn starts up to OwnerLimits.Weight of its tasks (one by
// default), in its submission order, then the turn passes on. An owner
// that reaches its running cap loses the rest of its turn and leaves the
// rotation; when a slot of its own frees it comes back, last in the
// round, as an owner that starts to wait does. System is
// one more member of that rotation, with a weight of one and under no
// owner cap: it gets a turn every round however many owners wait, and no
// owner's backlog delays it, or another owner's first task, by more than
// one round (the sum of the other waiting owners' weights: one task each
// by default).
//
// Handing out a slot costs the same however many owners wait or sit at
// their caps, and cancelling a waiting task the same however many wait.
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
// while its record says FAILED at once. A run waiting out a retry's
// backoff (WithRetry) keeps its slot through the wait, though no
// callback of it executes: a long MaxBackoff holds slots idle.
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
	// to that owner's admission: a raised running cap starts the owner's
	// waiting tasks at once. Of concurrent calls for one owner, the one
	// made last decides: an answer that comes back after the answer to a
	// later call is not applied. An error refuses a submission that would
	// start a new run, wrapped, and nothing is written; so does a panic,
	// as its error, and an answer with a negative field
	// (ErrInvalidConfig). A submission that joins a
	// live run goes on, as it does past a quota. Defaults to nil: Owner
	// for all.
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
	if err := nonNegative("Limits", setting{"MaxRunning", l.MaxRunning}, setting{"MaxWaiting", l.MaxWaiting}, setting{"QueueConcurrency", l.QueueConcurrency}); err != nil {
		return err
	}
	return l.Owner.validate()
}

func (l OwnerLimits) validate() error {
	return nonNegative("OwnerLimits", setting{"Running", l.Running}, setting{"Waiting", l.Waiting}, setting{"Weight", l.Weight})
}

// setting is a numeric setting of a Limits, by its field's name.
type setting struct {
	name  string
	value int
}

// nonNegative refuses the first negative setting of the struct named of,
// naming it.
func nonNegative(of string, settings ...setting) error {
	for _, n := range settings {
		if n.value < 0 {
			return fmt.Errorf("%w: negative %s.%s %d", ErrInvalidOption, of, n.name, n.value)
		}
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
	load   *ownerLoad
	slot   uint8         // guarded by admission.mu
	since  time.Time     // guarded by admission.mu: when the slot was taken
	grant  chan struct{} // for a queue item: closed when it gets its slot, or must end
	waits  bool          // set by reserve, then read-only: an async run that must wait
	queued bool          // guarded by admission.mu: in its owner's fifo, not withdrawn
	t      *Task         // set once registered, before it is queued
}

// ownerLoad is what one owner (or System) has running and waiting.
type ownerLoad struct {
	id      string      // the owner's id; "" for System
	limits  OwnerLimits // the owner's latest limits
	asked   uint64      // the order of the hook's call that answered limits (see admission.asks)
	running int
	waiting int // waiting tasks, in fifo or in a sequential queue
	// fifo holds the tickets ready to start, in submission order. A
	// withdrawn ticket stays until it comes first or the fifo is swept
	// (see withdrawLocked), so that a withdrawal costs no search.
	fifo       []*admit
	queued     int        // the tickets in fifo not withdrawn
	prev, next *ownerLoad // the owner's neighbours in the ring, while inRing
	inRing     bool
	idle       bool // kept in the map with nothing left, counted in admission.idle
}

// eligible reports whether o may start a task now: it has a ticket, and
// is under its own running cap; mu is held.
func (o *ownerLoad) eligible() bool { return o.queued > 0 && under(o.running, o.limits.Running) }

// admission is the runtime's admission controller: nil without Limits,
// so the unlimited path pays one nil check per submission and per settle.
type admission struct {
	limits Limits
	start  func(*Task) // starts an admitted async run on its own goroutine
	// asks numbers the calls of the OwnerLimits hook in the order they
	// are made, so that a slow answer never replaces one asked after it.
	asks atomic.Uint64

	mu       sync.Mutex
	running  int                   // guarded by mu
	waiting  int                   // guarded by mu
	owners   map[string]*ownerLoad // guarded by mu: owners with anything running or waiting, and up to idleOwners idle ones
	idle     int                   // guarded by mu: the idle owners in owners
	system   ownerLoad             // guarded by mu
	ring     *ownerLoad            // guarded by mu: the owner whose turn is next, in the ring of those eligible, or nil
	turn     *ownerLoad            // guarded by mu: the owner whose turn is under way (ring), or nil
	credit   int                   // guarded by mu: the starts left in turn's turn
	used     int                   // guarded by mu: the starts turn's turn has made
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
// The owner's limits are read first; if they cannot be, the error comes
// with a standing that holds nothing, so that a join can go on, as it
// can past a quota.
func (a *admission) reserve(ctx context.Context, c caller, sequential bool) (*admit, error) {
	var asked uint64 // 0: limits not from the hook
	if a.limits.OwnerLimits != nil && !c.system {
		asked = a.asks.Add(1)
	}
	lim, limErr := a.ownerLimits(ctx, c)
	a.mu.Lock()
	o := &a.system
	if !c.system {
		o = a.owners[c.userID]
		switch {
		case o == nil:
			o = &ownerLoad{id: c.userID, limits: a.limits.Owner}
			a.owners[c.userID] = o
		case o.idle:
			o.idle = false
			a.idle--
		}
	}
	r := &admit{load: o}
	if limErr != nil {
		a.forget(o)
		a.mu.Unlock()
		return r, limErr
	}
	var ready []*admit
	if asked >= o.asked && o.limits != lim {
		// The owner's caps changed: a raised running cap lets its
		// waiting tasks start now, a lowered one keeps them waiting. An
		// answer to a call made before the one that set the caps is
		// older than they are, and is not applied.
		o.limits, o.asked = lim, asked
		if a.turn == o {
			// A lowered weight applies to the turn under way too.
			// Its starts so far count against the new weight: a turn
			// that has used it up passes on.
			if a.credit = min(a.credit, max(1, lim.Weight)-a.used); a.credit <= 0 {
				a.ring, a.turn, a.credit = o.next, nil, 0
			}
		}
		if a.place(o) && !a.draining {
			ready = a.pick()
		}
	} else if asked > o.asked {
		o.asked = asked
	}
	err := a.decide(r, sequential)
	a.mu.Unlock()
	a.launch(ready)
	return r, err
}

// askOwnerLimits calls the OwnerLimits hook; a panic in it is its error,
// as a panic of an authorizer is its denial.
func askOwnerLimits(ctx context.Context, hook func(context.Context, Owner) (OwnerLimits, error), o Owner) (l OwnerLimits, err error) {
	defer func() {
		if r := recover(); r != nil {
			l, err = OwnerLimits{}, fmt.Errorf("the hook panicked: %v", r)
		}
	}()
	return hook(ctx, o)
}

// ownerLimits returns the limits of the submitting owner: the hook's
// answer, if there is a hook, and otherwise Limits.Owner. System is under
// none.
func (a *admission) ownerLimits(ctx context.Context, c caller) (OwnerLimits, error) {
	switch {
	case c.system:
		return OwnerLimits{}, nil
	case a.limits.OwnerLimits == nil:
		return a.limits.Owner, nil
	}
	l, err := askOwnerLimits(ctx, a.limits.OwnerLimits, Owner{id: c.userID})
	if err != nil {
		return OwnerLimits{}, fmt.Errorf("workers: owner limits of %q: %w", c.userID, err)
	}
	if err := l.validate(); err != nil {
		// A negative cap would read as none. The answer is the
		// service's own mistake, not its caller's.
		return OwnerLimits{}, fmt.Errorf("%w: owner limits of %q: %v", ErrInvalidConfig, c.userID, err)
	}
	return l, nil
}

// decide gives r a running slot or a waiting place, or returns the
// *QuotaError that refuses it; mu is held.
func (a *admission) decide(r *admit, sequential bool) error {
	o := r.load
	if sequential {
		r.grant = make(chan struct{})
	}
	if !sequential && o.queued == 0 && under(a.running, a.limits.MaxRunning) && under(o.running, o.limits.Running) {
		a.take(r, false)
		return nil
	}
	if !under(o.waiting, o.limits.Waiting) {
		// The owner's waiting drains through its own running slots.
		return a.refusal(QuotaOwnerWaiting, o.limits.Waiting, o.waiting, cmp.Or(o.limits.Running, a.limits.MaxRunning), o)
	}
	if !under(a.waiting, a.limits.MaxWaiting) {
		// The runtime's, through all of them: MaxRunning, or, without it,
		// as many as run now.
		return a.refusal(QuotaRuntimeWaiting, a.limits.MaxWaiting, a.waiting, cmp.Or(a.limits.MaxRunning, a.running, o.limits.Running), o)
	}
	r.slot = slotWaiting
	r.waits = !sequential
	o.waiting++
	a.waiting++
	return nil
}

func under(n, limit int) bool { return limit <= 0 || n < limit }

// refusal builds the *QuotaError of a submission refused by limit. Its
// retry hint is how long the current waiting ahead of it should take to
// drain through lanes running slots at the recent pace, between one
// second and five minutes.
func (a *admission) refusal(which string, limit, current, lanes int, o *ownerLoad) error {
	a.forget(o)
	const most = 5 * time.Minute
	hint := most // unless the product is less, which it cannot overflow then
	if n := time.Duration(1 + current/max(1, lanes)); a.avg < most/n {
		hint = a.avg * n
	}
	return &QuotaError{Owner: o.id, Limit: which, Max: limit, Current: current, Retry: max(hint, time.Second)}
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

// forget keeps an owner's entry once nothing of it is left, as one of
// at most idleOwners idle ones, or drops it; mu is held. An entry already
// replaced (a refused reservation outlives its owner's entry) is left
// alone, and System's entry is not in the map.
func (a *admission) forget(o *ownerLoad) {
	if o.running != 0 || o.waiting != 0 || o.queued != 0 || o.idle || a.owners[o.id] != o {
		return
	}
	if a.idle < idleOwners {
		o.idle = true
		a.idle++
		return
	}
	delete(a.owners, o.id)
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
	r.queued = true
	o.fifo = append(o.fifo, r)
	o.queued++
	a.place(o)
}

// pop takes the first ticket of o's fifo that was not withdrawn; o has
// one, and mu is held.
func (o *ownerLoad) pop() *admit {
	for {
		r := o.fifo[0]
		o.fifo[0] = nil
		o.fifo = o.fifo[1:]
		if r.queued {
			r.queued = false
			o.queued--
			o.sweep()
			return r
		}
	}
}

// The ring holds the owners that may start a task now (eligible), in
// turn order, linked in a circle: an owner at its running cap leaves it,
// and comes back, last in the round, when a slot of its own frees, so
// that handing out a slot never looks at an owner that cannot take it.
// a.ring is the owner whose turn is next.

// place puts o in the ring, last in the round, or takes it out, as it
// may start a task now or not, and reports whether it joined; mu is
// held.
func (a *admission) place(o *ownerLoad) bool {
	switch e := o.eligible(); {
	case e && !o.inRing:
		o.inRing = true
		if a.ring == nil {
			o.prev, o.next, a.ring = o, o, o
		} else {
			o.prev, o.next = a.ring.prev, a.ring // just before the next turn's
			o.prev.next, o.next.prev = o, o
		}
		return true
	case !e && o.inRing:
		// It loses the rest of its turn, which passes to the next owner.
		o.inRing = false
		if o.next == o {
			a.ring = nil
		} else {
			o.prev.next, o.next.prev = o.next, o.prev
			if a.ring == o {
				a.ring = o.next
			}
		}
		o.prev, o.next = nil, nil
		if a.turn == o {
			a.turn = nil
		}
	}
	return false
}

// pick hands free slots to waiting tickets, weighted round-robin over
// the owners in the ring (see Limits); mu is held. It returns the
// tickets to launch outside the lock.
func (a *admission) pick() []*admit {
	var ready []*admit
	for a.ring != nil && under(a.running, a.limits.MaxRunning) {
		o := a.ring
		if o != a.turn {
			a.turn, a.credit, a.used = o, max(1, o.limits.Weight), 0 // a new turn
		}
		r := o.pop()
		a.used++
		if a.credit--; a.credit == 0 {
			a.ring, a.turn = o.next, nil
		}
		if r.slot == slotWaiting && r.t.cause() == nil {
			o.waiting--
			a.waiting--
			a.take(r, true)
		}
		// Otherwise it was cancelled while it waited: it ends without
		// starting, so it takes no slot; its waiting place, if Cancel
		// did not give it back, frees when it settles.
		ready = append(ready, r)
		a.place(o) // out of tickets, or at its cap
	}
	return ready
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
// reports whether it was there; mu is held. The ticket is only marked,
// and swept later (see sweep), so a storm of withdrawals costs each one
// the same.
func (a *admission) withdrawLocked(r *admit) bool {
	if !r.queued {
		return false
	}
	r.queued = false
	o := r.load
	o.queued--
	o.sweep()
	a.place(o)
	return true
}

// sweep drops the withdrawn tickets from o's fifo once they outnumber
// the others, and more than sweepAfter are left; mu is held. Each
// ticket is swept once, by a sweep that costs less than twice the
// tickets it drops.
func (o *ownerLoad) sweep() {
	switch withdrawn := len(o.fifo) - o.queued; {
	case o.queued == 0:
		o.fifo = nil
	case withdrawn > sweepAfter && withdrawn > o.queued:
		o.fifo = slices.DeleteFunc(o.fifo, func(r *admit) bool { return !r.queued })
	}
}

// sweepAfter is how many withdrawn tickets an owner's fifo may hold
// before a withdrawal sweeps it, when they outnumber the others.
const sweepAfter = 32

// release gives back whatever r holds, once its run has settled, and
// starts the tickets the freed slot lets in. It is idempotent.
func (a *admission) release(r *admit) {
	a.mu.Lock()
	o := r.load
	switch r.slot {
	case slotRunning:
		o.running--
		a.running--
		a.place(o) // back under its cap
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
// chooses, if given); mu is held. Queue items waiting for a slot stay:
// their processors withdraw them.
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
	sweep := func(o *ownerLoad) {
		if o.queued == 0 {
			return
		}
		// One pass, each ticket judged once: a cause may be set between
		// two looks, and a ticket dropped unreturned would never start.
		kept := o.fifo[:0]
		for _, r := range o.fifo {
			switch {
			case !r.queued: // withdrawn
			case async(r):
				r.queued = false
				o.queued--
				items = append(items, r.t)
			default:
				kept = append(kept, r)
			}
		}
		clear(o.fifo[len(kept):])
		o.fifo = kept
		if o.queued == 0 {
			o.fifo = nil
		}
		a.place(o)
	}
	// Owners at their running cap are out of the ring, not out of the
	// map: every owner with a ticket is in it.
	for _, o := range a.owners {
		sweep(o)
	}
	sweep(&a.system)
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
	// a slot or in a sequential queue. Without Limits, queue items
	// cancelled whose turn has not come are included (see
	// QueueLoad.Waiting); under Limits it is the waiting places held, the
	// sum of the owners' Waiting: a cancelled task gives its place back
	// at once, as does one whose record is found ended, replaced or
	// deleted elsewhere (see Limits), and a submission holds one from its
	// admission until it starts, or joins a live run.
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
	Name    string // the queue's name
	Running int    // its items executing
	// Waiting counts the queue's items not yet begun, including those
	// cancelled whose turn has not come (a cancelled item leaves the
	// queue when its turn comes, at once): a count that costs no walk of
	// the queue. QueueStatus lists only the items still to run.
	Waiting int
}

// OwnerLoad is one owner's load.
type OwnerLoad struct {
	Owner   string // the owner's id; "" for System
	Running int    // its callbacks executing (holding a slot)
	Waiting int    // its tasks waiting for a slot or in a sequential queue
}

// Stats reports the runtime's load: running and waiting counts, per
// sequential queue, and the owners with the most load. It names owners
// and counts, never task ids, and only System may call it. Errors:
// ErrInvalidOption for a nil ctx, ErrNoAuthority, an *AuthorizationError
// for an Owner, or ctx.Err().
func (rt *Runtime[S]) Stats(ctx context.Context, auth TaskAuthority) (Stats, error) {
	if err := checkContext(ctx); err != nil {
		return Stats{}, err
	}
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
