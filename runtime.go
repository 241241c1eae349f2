package workers

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// DefaultQueue is the queue name the async path (Runtime.Submit) passes to
// the queue authorizer. An allowlist authorizer must permit it, or Submit
// is closed to everyone.
const DefaultQueue = "default"

// registerAttempts bounds how often a submission retries after another
// process changed the record between its read and its write.
const registerAttempts = 8

// Config configures a Runtime. The zero value is valid.
type Config struct {
	// Queues names the sequential queues whose processors Start starts.
	// Other queues start on their first submission. Defaults to none.
	Queues []string

	// RecoverZombies makes Start call RecoverZombies before anything
	// runs, even over a store without leases (see RecoverZombies for what
	// that assumes). Over a Leaser store Start recovers anyway, and the
	// recovery loop keeps doing so. Defaults to false.
	RecoverZombies bool

	// LeaseInterval is how often the runtime renews its instance lease,
	// over a store that implements Leaser. Defaults to 3 seconds.
	LeaseInterval time.Duration

	// LeaseTTL is how long a lease outlives its last renewal, by the
	// store's clock: an instance that has not renewed for this long is
	// dead to every other runtime, and its runs are recovered. It must
	// exceed LeaseInterval; a few missed renewals are tolerated by
	// design. A runtime whose lease may have ended (LeaseTTL has passed
	// since the start of its last successful renewal, the earliest the
	// store may have set that lease's end; a renewal still in flight is
	// cut off then), or that finds its lease expired, cancels its own
	// runs with ErrAbandoned before a peer may recover them: renewals
	// that each take longer than the lesser of LeaseTTL/2 and
	// LeaseTTL-LeaseInterval (7.5 seconds with the defaults) may lose the
	// lease. Its recovery loop ends the record of a run whose callback
	// goes on all the same. It registers no run on a lease that may have
	// ended: once LeaseTTL has passed since the start of its last
	// successful renewal, a submission renews the lease itself before it
	// registers, or fails with the renewal's error. Such a renewal is
	// bounded by the submission's context and by what is left of
	// LeaseTTL (LeaseInterval once that has passed, its retries on a lost
	// connection or a refused write included; a whole LeaseTTL for the
	// first, which takes the lease); submissions
	// waiting meanwhile share its answer, unless the context of the
	// submission that made it ended first, and Shutdown ends their wait,
	// or a renewal's, with ErrClosed. Defaults to five LeaseIntervals: 15
	// seconds with the default interval.
	LeaseTTL time.Duration

	// RecoverInterval is how often the recovery loop, started by Start
	// over a store that implements Leaser, ends the live records whose
	// run is no longer alive (see RecoverZombies). Defaults to
	// LeaseInterval.
	RecoverInterval time.Duration

	// ShutdownGrace is how long Shutdown lets callbacks in flight run on
	// before it cancels them with ErrShutdown: deploys then finish short
	// tasks instead of cancelling them. It is capped by Shutdown's
	// context. Zero (the default) lets them run for three quarters of the
	// time the context leaves when it has a deadline, and cancels them at
	// once when it has none; a negative value always cancels at once.
	ShutdownGrace time.Duration

	// CleanupInterval is how often the cleanup scheduler, started by
	// Start, deletes terminal records older than Retention. Zero disables
	// the scheduler. Defaults to 0.
	CleanupInterval time.Duration

	// Retention is how long the scheduler keeps terminal records.
	// Defaults to 24 hours.
	Retention time.Duration

	// SyncInterval is how often a loop, started with the first run or
	// by Start, syncs this runtime's running tasks with the store, for
	// processes that share it: it stores a run's live progress
	// whenever it changed (ProgressInterval, by default shorter, does
	// so too), and it cancels a run whose record says another process
	// ended it: with ErrCancelled when it was cancelled there,
	// ErrAbandoned when it was recovered, ErrSuperseded when the
	// record was replaced, ErrDeleted when it was deleted. Each progress write is fenced on
	// the run and its RUNNING status; a run with no progress to store
	// costs one read per interval.
	//
	// Over a store that implements Notifier, a change written elsewhere
	// reaches the run at once, and this loop is only the fallback for a
	// lost notice, and what finds a record that vanished without one (a
	// failover to a database that never had it; a Cancel that finds it
	// gone ends its run at once, see Runtime.Cancel). The SQL stores
	// announce a live record deleted by hand, which ends its run at
	// once. Defaults to 10 seconds over a Notifier, 2 seconds over a
	// Leaser that is not one (a store shared by processes that polls),
	// and to no loop over other stores (progress is then stored with a
	// run's transitions only, and a cancel from another process reaches
	// the record but not the callback). Only runs that have started are
	// checked.
	SyncInterval time.Duration

	// ProgressInterval is how often a run's progress is written to a
	// store other processes share: another process's Status, Watch,
	// Subscribe and their HTTP routes see it within about this long. Only
	// runs whose progress changed since their last write are written, in
	// one conditional update each (fenced on the run, and announced by a
	// Notifier store); a pass makes up to 16 at once, so that a store's
	// group commit combines them. A write that fails is tried again at
	// the next pass. Defaults to one second over a store that implements
	// Leaser (the PostgreSQL and SQLite stores, MemStore), and to none
	// over others. Over a *MemStore, progress is written only while
	// another runtime over the same store listens to its notices, which
	// a runtime does from its first Start, Ready, Submit, Wait, Watch or
	// Subscribe until its Shutdown: this runtime's own Status reads it
	// live. A negative value
	// turns these writes off; the sync loop (SyncInterval) still stores
	// changed progress.
	ProgressInterval time.Duration

	// StoreTimeout bounds each store call the runtime makes on its own,
	// with no caller's context to bound it: each try of a run's write
	// (its start, a retry, its outcome, its progress), the sync loop's
	// and the notices' reads of a run's record, each call of the recovery
	// loop, and each pass of cleanup (one DeleteFinished call, which
	// deletes in batches). A call cut off is treated as one that failed:
	// a run's write is tried again, fenced on its run, after reading
	// whether the try landed; a loop goes on with its next call or pass.
	//
	// What the bound cures is a call stuck on its connection (one lost
	// without a reset, whose statement would otherwise wait for the
	// operating system's timeouts): the next try takes another
	// connection. What holds every connection alike, a row lock that a
	// stuck transaction holds, still holds every try, and the run waits
	// for it, a StoreTimeout at a time; the loops meanwhile go on with
	// other work. Set it well above the store's slowest normal call: a
	// call that always takes longer fails every try.
	//
	// Lease renewals have their own bound (see LeaseTTL), and the read
	// that tells whether a cut-off try landed, like the one try a run
	// makes at its outcome after Shutdown gave up on it, is bounded to 5
	// seconds. Calls on a *MemStore itself wait on nothing and are not
	// bounded; a store that wraps one is. Defaults to LeaseTTL; a negative
	// value disables the bound.
	StoreTimeout time.Duration

	// Limits bounds how many callbacks execute at once, how many tasks
	// each owner may have running and waiting, and how many a sequential
	// queue runs at once; when saturated, waiting tasks start fairly
	// across owners. See Limits. Defaults to the zero Limits: no bound,
	// one at a time on a sequential queue.
	Limits Limits

	// Logger receives errors that have no caller to return to: a store
	// write on a run's behalf that failed (it is retried, or left for
	// recovery), a cleanup or lease renewal that failed. The writes
	// Shutdown gives up at its cutoff, or Reset when its ctx ends, are
	// logged together, in one line that counts them. Defaults to
	// slog.Default().
	//
	// A callback's panic is logged here too, at error level, with its
	// stack.
	Logger *slog.Logger

	// Middleware wraps every run's callback, once per attempt, the first
	// outermost (see Middleware). Defaults to none; a nil entry is an
	// invalid Config.
	Middleware []Middleware

	// Observers receive every run's lifecycle events, in this order (see
	// Observer for when and where they are called). Defaults to none.
	Observers []Observer
}

// Runtime is what this process is doing now: the run handles, the
// sequential queues and their processors, and the cleanup scheduler,
// over a Store that holds the records. Several runtimes may share one
// store (in one process or several); each has its own queues, handles and
// scheduler, while the store's authorizers are shared.
//
// A Runtime is safe for concurrent use. Construct it with NewRuntime,
// optionally call Start, submit, and end it with Shutdown. A Runtime that
// has shut down cannot be started again: construct a new one over the
// same store.
//
// S is the store's type, which Store returns as it is. A service that
// chooses its store when it starts (a MemStore in its tests, a SQL store
// in production) names the interface instead: NewRuntime[Store] returns
// a *Runtime[Store], one type for its handlers to hold whatever the
// store.
type Runtime[S Store] struct {
	// What the runs and the submissions read: set by NewRuntime, or
	// written seldom (the lease, once an interval).
	store    S
	cfg      Config
	cfgErr   error  // what is wrong with cfg: Start and every call that needs the lease return it
	instance string // this runtime's instance id: the prefix of its run ids

	// life ends when Shutdown returns: every store call made on a run's
	// behalf carries it, so none outlives Shutdown's bound.
	life    context.Context
	endLife context.CancelCauseFunc

	adm *admission // nil without Config.Limits: the unlimited path skips it

	keys    keyLocks   // the task lock: serializes this process's decisions per id
	runners *runners   // the goroutines that execute async runs
	noOpts  runOptions // every async run submitted without options shares it; never written after NewRuntime

	lease  leaseState            // this instance's lease, over a Leaser store
	leaser Leaser                // the store as a Leaser, nil if it is not one
	hooks  atomic.Pointer[hooks] // nil outside tests
	left   leftIDs               // the run writes given up, and their records' ids

	runs *runSet // every registered run not yet settled

	mem *MemStore // the store, when it is a MemStore, for the writes that skip a lookup

	// What Wait and the subscribers write (their locks, and the count of
	// those listening, which every change reads), between lines of their
	// own (see cacheLinePad).
	_     cacheLinePad
	bells bells // wakes Wait when a task changes
	hub   hub   // feeds Watch and Subscribe
	// listening is set while the store's listener listens: from its
	// Resync until its Listen returns (see waitFallback).
	listening atomic.Bool
	// ends remembers the notices that may say a run ended elsewhere, for
	// the runs that register while one comes (see checkRegistered).
	ends endNotices

	// What every submission writes, a cache line away from what the runs
	// read.
	_      cacheLinePad
	runSeq atomic.Uint64
	gate   intake // intake: closed by Shutdown, counts submissions in progress

	mu     sync.RWMutex      // read-locked by every SubmitSequential
	queues map[string]*queue // guarded by mu
	// retiring holds the queues retired as new ones were made (see
	// Runtime.queue), until Shutdown or a later retirement finds their
	// processors ended; made counts the queues made since the last such
	// retirement. Guarded by mu.
	retiring []*queue
	made     int
	started  bool  // guarded by mu
	loops    loops // guarded by mu: the background goroutines

	// early holds, by run (*Task), the end of a run that another writer
	// ended before its submission was reported: its submitter reports
	// it next (see reportEnd).
	early sync.Map

	// cancellingMu guards cancelling, the count, by run (*Task), of the
	// Cancels of this runtime that hold its runCancelling flag (see
	// claimCancel): the flag is cleared by the last of them.
	cancellingMu sync.Mutex
	cancelling   map[*Task]int

	// found holds, by run (*Task), the end the sync loop found that
	// another writer gave a run while the run's own write went on: the
	// write reports it if it does not land (see leaveEndToWriter). settle
	// drops what is left.
	found sync.Map

	// cancels holds, by run (*Task), who cancelled the run through
	// Cancel and why, when Cancel could not tell whether its own write
	// landed: the run's write of its end says so then (see endState).
	// settle drops what is left.
	cancels sync.Map
}

// cancelNote is who cancelled a run, and why, as Cancel writes them
// into the record (State.CancelledBy, State.CancelReason).
type cancelNote struct{ by, reason string }

// cacheLinePad keeps the fields before it and those after it off one
// cache line, where a struct's fields are written by one goroutine and
// read by another that runs on another core meanwhile: a submitter and
// the runs it starts, say. Had they shared a line, every write would
// cost the reader a cache miss, and the cores would pass the line back
// and forth (false sharing). Two bytes 64 apart never share a 64-byte
// line, however the struct is aligned: the line of amd64 and of most
// arm64 servers. Where lines are 128 bytes (Apple's arm64), fields 64
// bytes apart may still share one.
type cacheLinePad [64]byte

// validate reports the first setting of c, its defaults applied, that a
// runtime cannot run with, as ErrInvalidOption (ErrInvalidKey for a
// queue's name).
func (c *Config) validate() error {
	for _, q := range c.Queues {
		if err := validateText("queue", q, MaxKeyLen, ErrInvalidKey); err != nil {
			return err
		}
	}
	for _, d := range []struct {
		name  string
		value time.Duration
	}{
		{"CleanupInterval", c.CleanupInterval}, {"Retention", c.Retention}, {"SyncInterval", c.SyncInterval},
		{"LeaseInterval", c.LeaseInterval}, {"RecoverInterval", c.RecoverInterval},
	} {
		if d.value < 0 {
			return fmt.Errorf("%w: negative %s %v", ErrInvalidOption, d.name, d.value)
		}
	}
	for i, o := range c.Observers {
		if f, ok := o.(ObserverFunc); o == nil || ok && f == nil {
			return fmt.Errorf("%w: Observers[%d] is nil", ErrInvalidOption, i)
		}
	}
	for i, m := range c.Middleware {
		if m == nil {
			return fmt.Errorf("%w: Middleware[%d] is nil", ErrInvalidOption, i)
		}
	}
	if err := c.Limits.validate(); err != nil {
		return err
	}
	if c.LeaseTTL <= c.LeaseInterval {
		return fmt.Errorf("%w: LeaseTTL %v must exceed LeaseInterval %v", ErrInvalidOption, c.LeaseTTL, c.LeaseInterval)
	}
	return nil
}

// NewRuntime returns a Runtime over store. It starts no goroutine; see
// Start. A Config it cannot run with (a negative interval where a
// negative value has no meaning, a LeaseTTL
// not above LeaseInterval, invalid Limits or queue names, a nil
// Observer or Middleware) is reported, naming the setting, as
// ErrInvalidConfig, wrapping ErrInvalidOption (ErrInvalidKey for a
// queue's name), by Start, by Ready, and by every call that would take
// the runtime's lease (Submit, Wait, Watch, Subscribe) when Start was
// never called. NewRuntime panics if store is nil.
func NewRuntime[S Store](store S, cfg Config) *Runtime[S] {
	if v := reflect.ValueOf(store); !v.IsValid() || v.Kind() == reflect.Pointer && v.IsNil() {
		panic("workers: NewRuntime with a nil Store")
	}
	cfg.Retention = cmp.Or(cfg.Retention, 24*time.Hour)
	cfg.LeaseInterval = cmp.Or(cfg.LeaseInterval, 3*time.Second)
	cfg.LeaseTTL = cmp.Or(cfg.LeaseTTL, 5*cfg.LeaseInterval)
	cfg.RecoverInterval = cmp.Or(cfg.RecoverInterval, cfg.LeaseInterval)
	cfg.StoreTimeout = cmp.Or(cfg.StoreTimeout, cfg.LeaseTTL)
	if cfg.SyncInterval == 0 {
		if _, ok := any(store).(Notifier); ok {
			cfg.SyncInterval = 10 * time.Second
		} else if _, ok := any(store).(Leaser); ok {
			cfg.SyncInterval = 2 * time.Second
		}
	}
	if _, ok := any(store).(Leaser); ok && cfg.ProgressInterval == 0 {
		cfg.ProgressInterval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	// A random (version 4) UUID, in 22 characters of URL-safe base64:
	// every record keeps it in its run id.
	id := uuid.New()
	instance := base64.RawURLEncoding.EncodeToString(id[:])
	// The run writes carry life, and with it the instance as their
	// origin, so a MemStore spares this runtime the notices of its own
	// run writes (see MemStore.Listen).
	life, endLife := context.WithCancelCause(context.WithValue(context.Background(), originKey{}, instance))
	rt := &Runtime[S]{
		store:    store,
		cfg:      cfg,
		cfgErr:   configError(cfg.validate()),
		instance: instance,
		life:     life,
		endLife:  endLife,
		keys:     newKeyLocks(),
		runners:  newRunners(),
		queues:   make(map[string]*queue),
	}
	rt.noOpts.hub = &rt.hub
	rt.hub.sharing = cfg.ProgressInterval > 0
	rt.leaser, _ = any(store).(Leaser)
	rt.mem, _ = any(store).(*MemStore)
	rt.runs = newRunSet(rt.mem)
	rt.gate.init()
	rt.lease.turn = make(chan struct{}, 1)
	rt.lease.base, rt.lease.lost = time.Now(), true
	if cfg.Limits.set() {
		rt.adm = newAdmission(cfg.Limits, func(t *Task) { go rt.execute(t) })
	}
	return rt
}

// checkContext returns the error of a call made with a nil ctx, which
// every exported call that takes a context returns before it does
// anything else: ErrInvalidOption, said of the context.
func checkContext(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", ErrInvalidOption)
	}
	return nil
}

// configError wraps err, what is wrong with a Config, in
// ErrInvalidConfig; nil stays nil.
func configError(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
}

// Ready reports whether the runtime can take submissions now, and if
// not, why: ErrClosed once Shutdown has begun, the error of a Config it
// cannot run with (ErrInvalidConfig), or, over a store that implements
// Leaser, the error of taking the instance lease or of renewing it; a
// nil ctx is ErrInvalidOption. Ready renews the lease itself, as a
// submission would, once it may have ended, and also while it lives if
// the last renewal failed: a store that is down or refuses writes makes
// Ready fail from the first renewal that failed (within a LeaseInterval
// of the outage's start), not only once the lease may have ended, and
// Ready answers nil again as soon as the store takes a renewal; its own
// renewals' failures are returned, not logged (the renewal loop logs its
// own, one an interval). A store that does not answer at all (a network
// that drops its packets) fails a renewal only once it is cut off, at
// the lease's end; Ready fails with ErrUnavailable from the time a
// renewal has gone unanswered for longer than a LeaseInterval. A
// service can serve it as its readiness check: it costs no store call
// while the lease is known to be live and its last renewal succeeded.
func (rt *Runtime[S]) Ready(ctx context.Context) error {
	if err := checkContext(ctx); err != nil {
		return err
	}
	if !rt.gate.enter() {
		return ErrClosed
	}
	defer rt.gate.leave()
	if _, err := rt.leaseForRun(ctx); err != nil {
		return err
	}
	return rt.renewIfFailing(ctx)
}

// Store returns the store the runtime was built over.
func (rt *Runtime[S]) Store() S { return rt.store }

// Start readies the runtime as its Config says: over a store that
// implements Leaser it takes this instance's lease and recovers the runs
// of dead instances (and, with Config.RecoverZombies, over any store it
// recovers as RecoverZombies does); it starts the named queues'
// processors, and the background loops: lease renewal, recovery, cleanup,
// sync, and the listener of a Notifier store. Start is optional when none
// of that is wanted: the first submission takes the lease and starts the
// renewal and the listener itself. For a Config it cannot run with it
// returns ErrInvalidConfig, wrapping a *ValidationError for a bad queue
// name in Config.Queues, or ErrInvalidOption for a negative interval or
// Retention or a LeaseTTL not above LeaseInterval; it returns
// ErrInvalidOption for a nil ctx, ErrClosed after Shutdown and
// ErrStarted if it already ran; a Start that failed (a
// store error during recovery) may be called again. A Start that failed
// after taking the lease leaves its renewal and the listener running, as
// a submission that takes the lease does: call Shutdown on a runtime
// that is given up, whether or not it started.
func (rt *Runtime[S]) Start(ctx context.Context) error {
	if err := checkContext(ctx); err != nil {
		return err
	}
	if rt.cfgErr != nil {
		return rt.cfgErr
	}
	if !rt.gate.enter() {
		return ErrClosed
	}
	defer rt.gate.leave()
	rt.mu.Lock()
	started := rt.started
	rt.started = true
	rt.mu.Unlock()
	if started {
		return ErrStarted
	}
	_, leased := any(rt.store).(Leaser)
	err := rt.ensureLease(ctx)
	if err == nil && (leased || rt.cfg.RecoverZombies) {
		_, err = rt.RecoverZombies(ctx)
	}
	if err != nil {
		rt.mu.Lock()
		rt.started = false // a transient store error must not leave Start unretryable
		rt.mu.Unlock()
		return err
	}
	for _, name := range rt.cfg.Queues {
		rt.queue(name) // nil once Shutdown began; Start returns anyway
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.loops.every(rt.cfg.CleanupInterval, func(ctx context.Context) {
		err := rt.boundedCall(ctx, func(ctx context.Context) error {
			_, err := rt.Cleanup(ctx, rt.cfg.Retention)
			return err
		})
		if err != nil && ctx.Err() == nil {
			rt.cfg.Logger.Error("workers: cleanup failed", "err", err)
		}
	})
	if leased {
		rt.loops.every(rt.cfg.RecoverInterval, func(ctx context.Context) {
			if _, err := rt.recoverRuns(ctx, false, false); err != nil && ctx.Err() == nil {
				rt.cfg.Logger.Error("workers: recovery failed", "err", err)
			}
		})
	}
	return nil
}

// Submission is what a submit call returns.
type Submission struct {
	// ID is the scoped task id: the handle for Status and Cancel. It is
	// not the key passed in; ScopedTaskKey rebuilds it.
	ID string
	// RunID is the id of the run the submission started or joined.
	RunID string
	// Joined reports that the key was already live and the submission
	// attached to that run instead of starting a new one.
	Joined bool
}

// Submit runs fn on its own goroutine as the task key, on behalf of auth:
// one of the runtime's parked runner goroutines, whose stack has grown
// on earlier runs, or a new one when none is idle. Runners never bound how
// many runs execute at once; at most 32 stay parked between runs, and
// Shutdown ends them.
// ctx bounds the submission itself and nothing else: the run outlives it.
//
// If the key's task is live and the caller watches it, Submit joins that
// run. If it is live or finished and the caller is not a watcher (only
// possible for a global-scope key), Submit returns an *AuthorizationError
// unless the store's watch authorizer allows it. A finished key is run
// again: a new run replaces the record, its watchers reset to the
// submitter and those granted with WithWatchers, and a predecessor still
// executing is cancelled with ErrSuperseded, its late writes discarded;
// one still waiting here for its turn ends without starting, and gives
// its waiting place (Config.Limits) back at once. A run waiting for its
// turn whose record is deleted (a Reset of another runtime over the same
// MemStore, a cleanup of an end written elsewhere, an operator's DELETE
// over a SQL store) does the same once the runtime learns of it (see
// Limits), with ErrDeleted as the cause of its context.
//
// Under Config.Limits, a new run starts at once when a slot is free, and
// otherwise waits as a PENDING record for its turn (see Limits); a
// submission that would exceed a waiting cap is refused with a
// *QuotaError and writes nothing, unless it joins a live run, which costs
// no quota.
//
// The queue authorizer is asked with DefaultQueue. Errors: ErrNoAuthority
// (also for a zero Owner in WithWatchers), a *ValidationError
// (ErrInvalidKey), ErrInvalidOption (a nil ctx or fn, an option out of range), an
// *AuthorizationError (ErrUnauthorized), a *QuotaError (ErrQuotaExceeded),
// the error of Limits.OwnerLimits (wrapped), ErrClosed, ErrInvalidConfig
// (see NewRuntime), ErrConflict (wrapped) when other processes kept
// changing the record, ctx's error when it ends while the submission
// waits (for another submission of the key to register, or for the
// instance lease): one that errors.Is finds as context.Canceled or
// context.DeadlineExceeded, wrapping ctx's cause as well when it was
// given one (context.WithTimeoutCause), or a store error: over a store
// with leases, that of taking the instance lease, or of renewing it when
// it may have ended (both wrapped; see Config.LeaseTTL). A renewal the
// store does not answer in time fails with an error that says so, not
// context.DeadlineExceeded, which would read as ctx's own.
//
// A registering write (the insert of a new record, or the replace of a
// finished one) that fails because the store lost or could not open its
// connection, or its database refused writes for now (read-only, full:
// ErrUnavailable), is made again, up to three times within
// ctx, and not once Shutdown has begun. Every try carries the same run
// id, so a retry after a lost try that landed finds that record and
// takes it for its own: the submission registers one run either way.
// The take of the instance lease, or a renewal of it once it may have
// ended, that the submission makes itself is made again the same way,
// within one Config.LeaseInterval of its first try; so is a join's write
// of its caller among the run's watchers, which changes nothing when a
// lost try landed.
//
// Options such as WithWatchers apply to a new run only: a submission that
// joins a live run does not change it.
func (rt *Runtime[S]) Submit(ctx context.Context, key string, fn Func, auth TaskAuthority, opts ...SubmitOption) (Submission, error) {
	return rt.submit(ctx, false, "", key, fn, auth, opts)
}

// SubmitSequential is Submit on the named sequential queue: the queue's
// one processor runs its tasks one at a time, in submission order (or
// Limits.QueueConcurrency at a time, started in submission order: their
// starts are written in that order, and their callbacks, on goroutines
// of their own, may begin in any).
// Different queues run independently. An item holds its place until its
// callback has returned: one that timed out (WithTimeout) but ignores its
// context still blocks the next item, though its record says FAILED at
// once. Under Config.Limits an item also waits for a running slot, its
// turn shared fairly with other owners' work, and counts as waiting for
// its owner's cap from submission until it starts.
//
// The queue authorizer is asked with the queue's name. Each distinct
// queue name gets a processor goroutine while it has items: a queue left
// empty for one to two minutes ends its goroutine and leaves Stats, and
// its next submission starts it again, so many queues (one per tenant,
// say) cost only while they are in use. Past 256 queues, one new queue
// in 256 ends every empty queue's goroutine at once, so that names used
// one after another hold about that many idle goroutines at most. Do
// not pass untrusted names without a queue authorizer that limits them.
// Errors are Submit's.
func (rt *Runtime[S]) SubmitSequential(ctx context.Context, queue, key string, fn Func, auth TaskAuthority, opts ...SubmitOption) (Submission, error) {
	return rt.submit(ctx, true, queue, key, fn, auth, opts)
}

// submit is Submit, or SubmitSequential on the queue qname when
// sequential is set. It checks its arguments in the order every call
// does: ctx, then auth, then the others, the queue's name among them.
func (rt *Runtime[S]) submit(ctx context.Context, sequential bool, qname, key string, fn Func, auth TaskAuthority, opts []SubmitOption) (Submission, error) {
	if err := checkContext(ctx); err != nil {
		return Submission{}, err
	}
	c, err := resolve(auth)
	if err != nil {
		return Submission{}, err
	}
	if sequential {
		if err := validateText("queue", qname, MaxKeyLen, ErrInvalidKey); err != nil {
			return Submission{}, err
		}
	}
	if fn == nil {
		return Submission{}, fmt.Errorf("%w: nil Func", ErrInvalidOption)
	}
	o, err := applyOptions(opts)
	if err != nil {
		return Submission{}, err
	}
	k, err := rt.ids(key, c, o.scope)
	if err != nil {
		return Submission{}, err
	}
	if !c.system && !allowQueue(rt.store, rt.cfg.Logger, cmp.Or(qname, DefaultQueue), c.userID) {
		return Submission{}, &AuthorizationError{Op: "submit", Queue: cmp.Or(qname, DefaultQueue), UserID: c.userID}
	}

	if !rt.gate.enter() {
		return Submission{}, ErrClosed
	}
	defer rt.gate.leave()
	epoch, err := rt.leaseForRun(ctx)
	if err != nil {
		return Submission{}, err
	}
	base := rt.queueOptions(qname)
	var adm *admit
	var refused error
	if rt.adm != nil {
		// Admission comes before any write; a refused submission may
		// still join a live run, which costs no quota.
		if adm, refused = rt.adm.reserve(ctx, c, qname != ""); adm == nil {
			return Submission{}, refused
		}
	}
	ends := rt.ends.seq.Load()
	registered := false
	if adm != nil {
		defer func() {
			if !registered {
				// The registration panicked (a store's bug, recovered
				// by the caller's server): its place is given back.
				rt.adm.release(adm)
			}
		}()
	}
	t, sub, err := rt.register(ctx, k, base, c, o, fn, adm, refused)
	registered = true
	if err != nil || t == nil {
		// A join or a failure takes no place, except a run retired after
		// its insert failed: it holds its place while it ends, and
		// settling it gives the place back.
		if adm != nil && (adm.t == nil || !adm.t.has(runRetired)) {
			rt.adm.release(adm)
		}
		return sub, err
	}
	if rt.ends.seq.Load() != ends {
		rt.checkRegistered(ctx, t, ends, epoch)
	}
	rt.dispatch(t, epoch)
	return sub, nil
}

// checkRegistered checks run t, just registered and not yet dispatched,
// against its record if a notice that someone may have ended its id's
// run came while it registered (ends is the count of such notices
// before): the listener, which could not find the run here before it was
// published, passed it by, and it may be the run's cancel, made
// elsewhere once its registering write was in. A run found ended is
// cancelled: its callback never starts, and its fenced-out write reports
// the end its record holds. The read is the submission's, bounded by
// ctx; should it fail, the run starts, and the sync loop finds its end.
// Should it panic (a store's bug, recovered by the caller's server), the
// run, registered and published, is dispatched (see dispatch, with
// epoch) all the same before the panic goes on.
func (rt *Runtime[S]) checkRegistered(ctx context.Context, t *Task, ends, epoch uint64) {
	if !rt.ends.since(ends, t.ID()) {
		return
	}
	read := false
	defer func() {
		if !read {
			rt.dispatch(t, epoch)
		}
	}()
	_, cause := rt.endedBy(ctx, t)
	read = true
	if cause != nil {
		t.cancel(cause)
	}
}

// dispatch hands a registered run to a goroutine or its queue, which it
// creates on the queue's first run. A run registered while Shutdown began
// (it waits only so long for submissions in progress) is cancelled with
// ErrShutdown and executed at once, which records it CANCELLED. So is a
// run registered while the lease was found lost (its epoch, from
// leaseForRun, is behind), with ErrAbandoned, which the loss's sweep of
// the runs may have missed.
func (rt *Runtime[S]) dispatch(t *Task, epoch uint64) {
	if rt.gate.isClosed() {
		t.cancel(ErrShutdown)
		go rt.execute(t)
		return
	}
	if rt.lease.epoch.Load() != epoch {
		t.cancel(ErrAbandoned)
		go rt.execute(t)
		return
	}
	if t.opts.queue == "" {
		if t.adm != nil && t.adm.waits {
			if h := rt.hooks.Load(); h != nil && h.enqueue != nil {
				h.enqueue()
			}
			if rt.adm.enqueue(t.adm) {
				return // admission starts it when its turn comes
			}
			t.cancel(ErrShutdown) // cancelled already, or admission drained since the check
		}
		rt.run(t)
		return
	}
	for {
		q := rt.queue(t.opts.queue)
		if h := rt.hooks.Load(); h != nil && h.enqueue != nil {
			h.enqueue()
		}
		if q != nil {
			switch q.push(t) {
			case pushed:
				return
			case pushRetired:
				continue // to the queue that succeeds it
			}
		}
		t.cancel(ErrShutdown) // the queue drained, or the run was cancelled, since the check
		go rt.execute(t)
		return
	}
}

// hooks are test hooks: each stops a goroutine at a point where it races
// another, for a test to run the other in between.
type hooks struct {
	leaseRead func() // leaseForRun: between its reads of the epoch and of the lease's end
	leaseLost func() // loseLease: between the epoch's bump and the sweep of the runs
	enqueue   func() // dispatch: before a run that waits for admission, or a queue item (once its queue is looked up), joins its wait
	syncRead  func() // checkRuns: between a run's progress check and the read of its record
	keepEnd   func() // leaveEndToWriter: before it keeps the end it read
	wrote     func() // write that did not land: between clearing runWriting and looking for an end kept
	resynced  func() // listen: after the check of every run that follows a Resync
	backedOff func() // writeLocked: after a failed try's backoff, before the next try
}

// register decides, under the task's lock, whether the submission joins
// a live run, re-runs a finished or abandoned key, or creates the task.
// For a new run it returns the registered Task, its handle published; for
// a join it returns a nil Task. The change it made is reported once the
// lock is released.
func (rt *Runtime[S]) register(ctx context.Context, k runIDs, base *runOptions, c caller, o submitOptions, fn Func, adm *admit, refused error) (*Task, Submission, error) {
	h, err := rt.keys.lock(ctx, k.id())
	if err != nil {
		return nil, Submission{}, err
	}
	t, sub, ch, err := func() (*Task, Submission, change, error) {
		// Deferred: a store call that panics (a recovered handler's, say)
		// must not leave the task's lock held for good.
		defer h.unlock()
		return rt.decide(ctx, k, base, c, o, fn, adm, refused)
	}()
	switch ch.kind {
	case 0:
	case changeSubmitted:
		rt.announce(t, &ch)
	default:
		rt.emit(&ch)
	}
	return t, sub, err
}

// announce reports the submission of run t, then its end if another
// writer ended it meanwhile (a Cancel, once the task's lock was free):
// whoever hears of the end of a run this runtime submitted hears of its
// submission first. (A join of the run, reported by the joining
// submission, may come before it.)
func (rt *Runtime[S]) announce(t *Task, c *change) {
	rt.emit(c)
	if t.flags.Or(runAnnounced)&runEndWaiting != 0 {
		rt.reportEarly(t)
	}
}

// reportEarly reports the end of run t that waits in early, if it still
// does, and only then clears runEndWaiting: a Watch that finds the run's
// record moved on waits for the end while the flag is set.
func (rt *Runtime[S]) reportEarly(t *Task) {
	if end, ok := rt.early.LoadAndDelete(t); ok {
		rt.emit(end.(*change))
		t.flags.And(^runEndWaiting)
	}
}

// reportEnd reports c, the end of run t that another writer made (t is
// nil when this runtime does not hold the run), unless it was reported
// already. If t's submission has not been reported yet, its submitter
// reports c after it (see announce). c is taken by value so that only an
// end that waits is copied to the heap.
func (rt *Runtime[S]) reportEnd(t *Task, c change) {
	if t == nil {
		rt.emit(&c)
		return
	}
	if c.state.Status == StatusCancelled && c.state.Cause == CauseCancelled {
		// A Cancel's end, found or reported before the run settles: the
		// run's context ends with its cause, not with the run's end
		// (first cause wins; a no-op if the Cancel cancelled it).
		t.cancelLanded()
	}
	if !t.claim(runEndSeen) {
		return
	}
	for {
		f := t.flags.Load()
		if f&runRetired != 0 || f&runAnnounced != 0 && f&runLiveReporting == 0 {
			// A retired run is never announced: its end goes to Wait and
			// the streams at once (emit keeps it from the observers).
			rt.emit(&c)
			return
		}
		waiting := c
		rt.early.Store(t, &waiting)
		if t.flags.CompareAndSwap(f, f|runEndWaiting) {
			return
		}
		rt.early.Delete(t) // the flags moved: look again
	}
}

// decide is register's rule table; the task's lock is held. The change
// it returns, if its kind is set, is reported once the lock is released.
// The common case, a new key, costs one store call: the insert comes
// first, and the record is read only when one exists. A submission that
// admission refused (refused is its *QuotaError, or the error of the
// OwnerLimits hook) may only join: it reads first, and returns refused
// wherever it would have written.
func (rt *Runtime[S]) decide(ctx context.Context, k runIDs, base *runOptions, c caller, o submitOptions, fn Func, adm *admit, refused error) (*Task, Submission, change, error) {
	id := k.id()
	t := rt.newRunAs(ctx, k, base, c, o, fn)
	queue := base.queue
	if adm != nil {
		t.adm, adm.t = adm, t
	}
	// A run that starts as soon as it is registered is registered
	// RUNNING: its registering write is its durable start, one write
	// fewer per task. A queue item, or a run that waits for admission,
	// is registered PENDING and written RUNNING when its turn comes.
	t.startsRegistered = queue == "" && (adm == nil || !adm.waits)
	registered := func() (*Task, Submission, change, error) {
		st := State{Status: StatusPending}
		if t.startsRegistered {
			st = t.registeredStart()
			r := t.run.Load() // an async run's, made with it
			r.writeMu.Lock()
			t.setState(&st)
			r.writeMu.Unlock()
		}
		rt.publish(t)
		return t, Submission{ID: id, RunID: t.RunID()}, change{kind: changeSubmitted, id: id, runID: t.RunID(), queue: queue, task: t, state: st}, nil
	}
	insert := refused == nil
	for range registerAttempts {
		if insert {
			if refused != nil {
				return nil, Submission{}, change{}, refused // gone since the read: no join
			}
			err := rt.registerWrite(ctx, t, func() error { return rt.insert(ctx, t) })
			if err == nil {
				return registered()
			}
			if !errors.Is(err, ErrConflict) {
				rt.retire(t, err)
				return nil, Submission{}, change{}, err
			}
		}
		rec, err := rt.store.GetTask(ctx, id)
		if errors.Is(err, ErrNotFound) {
			insert = true
			continue // deleted since the insert found it
		}
		if err != nil {
			return nil, Submission{}, change{}, err
		}
		insert = false

		watching := c.system || visibleTo(id, rec.Watchers, c.userID)
		if !watching && !allowWatch(rt.store, rt.cfg.Logger, id, rec.Watchers, c.userID) {
			return nil, Submission{}, change{}, &AuthorizationError{Op: "submit", TaskID: id, UserID: c.userID}
		}

		if !rec.Status.Terminal() {
			alive, err := rt.alive(ctx, &rec)
			if err != nil {
				return nil, Submission{}, change{}, err
			}
			if alive {
				if !watching {
					added, err := rt.addWatcher(ctx, id, rec.RunID, c.userID)
					if errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound) {
						continue // the record moved on; decide again
					}
					if err != nil {
						return nil, Submission{}, change{}, err
					}
					if added {
						rt.noteWatcher(id, rec.RunID, append(rec.Watchers, c.userID))
					}
				}
				return nil, Submission{ID: id, RunID: rec.RunID, Joined: true},
					change{kind: changeJoined, id: id, runID: rec.RunID, queue: rec.Queue, task: rt.handle(id, rec.RunID), created: rec.CreatedAt, state: rec.State}, nil
			}
			// No live run stands behind the record: nobody will ever end
			// it, so it is replaced like a finished one, fenced on the
			// dead run's id, instead of being joined.
		}
		if refused != nil {
			return nil, Submission{}, change{}, refused // nothing live to join
		}

		prev := rec.RunID
		err = rt.registerWrite(ctx, t, func() error { return rt.replace(ctx, t, prev) })
		switch {
		case err == nil:
			return registered()
		case errors.Is(err, ErrConflict):
			continue // another process re-ran it first
		case errors.Is(err, ErrNotFound):
			insert = true
			continue // deleted since the read
		}
		rt.retire(t, err)
		return nil, Submission{}, change{}, err
	}
	return nil, Submission{}, change{}, fmt.Errorf("%w: task %q kept changing during submission", ErrConflict, id)
}

// insert stores t's new record. Over a MemStore, t keeps the record for
// its writes; so does replace.
func (rt *Runtime[S]) insert(ctx context.Context, t *Task) error {
	if rt.mem != nil {
		r := t.memRecord()
		return t.keep(r, rt.mem.add(ctx, r))
	}
	return rt.store.InsertTask(ctx, t.record())
}

// registerRetries bounds the tries a registering write makes again after
// it failed with ErrUnavailable, backing off from registerBackoff.
const (
	registerRetries = 3
	registerBackoff = 10 * time.Millisecond
)

// registerWrite makes write, run t's registering write (its insert, or
// its replace of a record), and makes it again, up to registerRetries
// times, while it fails with ErrUnavailable: the store lost or could not
// open its connection, a blip a new connection may not see, or the
// database refused writes for now (read-only, full). It stops
// backing off once Shutdown begins, which waits for the submissions in
// progress: the lost try's error is then returned. A lost try
// may have landed, so a retry that the store refuses (ErrConflict, or
// ErrNotFound for a replace whose predecessor it took away) reads the
// record: one that holds t's run id is the lost try's, which landed.
// When that read fails, whether a try landed is unknown: the lost try's
// error is returned, for decide to retire the run, as after any write
// that may have landed. So it is when a retry is refused for good
// (permanentStoreError): that refusal says nothing of the lost try, and
// retire leaves the record of a write so refused alone.
func (rt *Runtime[S]) registerWrite(ctx context.Context, t *Task, write func() error) error {
	err := write()
	backoff := registerBackoff
	for range registerRetries {
		if !rt.pausedAfterLost(ctx, err, &backoff) {
			return err
		}
		lost := err
		if err = write(); errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound) {
			rec, rerr := rt.store.GetTask(ctx, t.ID())
			switch {
			case rerr == nil && rec.RunID == t.RunID():
				return nil // the lost try landed
			case rerr != nil && !errors.Is(rerr, ErrNotFound):
				return lost
			}
			return err
		}
		if permanentStoreError(err) {
			return lost
		}
	}
	return err
}

// addWatcher adds watcher to the live run runID of task id for a join,
// and makes the write again, as registerWrite makes a registering write,
// up to registerRetries times while it fails with ErrUnavailable: adding
// a watcher the record holds already changes nothing, so a try that lost
// its connection may be made again whether it landed or not. It reports
// the watcher added once a try after a lost one succeeds, which may have
// found the lost try's watcher.
func (rt *Runtime[S]) addWatcher(ctx context.Context, id, runID, watcher string) (bool, error) {
	added, err := rt.store.AddWatcher(ctx, id, runID, watcher)
	backoff := registerBackoff
	for range registerRetries {
		if !rt.pausedAfterLost(ctx, err, &backoff) {
			return added, err
		}
		if added, err = rt.store.AddWatcher(ctx, id, runID, watcher); err == nil {
			return true, nil
		}
	}
	return added, err
}

// pausedAfterLost reports whether err says the store lost its connection
// or refuses writes for now (ErrUnavailable), and a pause of *backoff,
// jittered down to half, then passed within ctx and before Shutdown
// began: the caller then makes its write again (see registerWrite). It
// doubles *backoff for the next pause.
func (rt *Runtime[S]) pausedAfterLost(ctx context.Context, err error, backoff *time.Duration) bool {
	if !errors.Is(err, ErrUnavailable) || !sleepUnless(ctx, jitter(*backoff), rt.gate.shut) {
		return false
	}
	*backoff *= 2
	return true
}

// replace stores t's new record in place of the run prevRunID's.
func (rt *Runtime[S]) replace(ctx context.Context, t *Task, prevRunID string) error {
	if rt.mem != nil {
		r := t.memRecord()
		return t.keep(r, rt.mem.swap(ctx, r, prevRunID))
	}
	return rt.store.ReplaceTask(ctx, t.record(), prevRunID)
}

// keep makes r, the record t's registering write stored unless it failed
// with err, the one t's writes go to, and returns err.
func (t *Task) keep(r *memRecord, err error) error {
	if err == nil {
		t.rec = r
	}
	return err
}

// retire ends a run whose registering write failed. Unless the store
// refused it for good, the write may have landed (a timeout after the
// commit, a dropped connection): the run is then ended like one
// cancelled before it started, fenced on its own run id, by a write that
// retries while the runtime lives, so a record it may have left is never
// joined; should that write fail, a read that finds no record of the
// run ends it there, as the write would once the store took it (see
// retiredRecord). Its handle is never published, so this process does
// not take it for alive meanwhile.
func (rt *Runtime[S]) retire(t *Task, err error) {
	if permanentStoreError(err) {
		return
	}
	t.mark(runRetired) // no observer heard of its submission
	t.cancel(ErrAbandoned)
	rt.runs.addOther(t)
	go rt.execute(t)
}

// newRun builds the live object of a run and mints its run id. The run's
// context keeps the values of the submission's context, never its
// cancellation or deadline.
func (rt *Runtime[S]) newRun(ctx context.Context, id, queue string, c caller, o submitOptions, fn Func) *Task {
	return rt.newRunAs(ctx, rt.mint("", id), rt.queueOptions(queue), c, o, fn)
}

// newRunAs is newRun with its ids given (see mint), and base, the
// options of the run's queue (the runtime's noOpts for the async path),
// which it shares unless o sets a timeout or a retry policy.
func (rt *Runtime[S]) newRunAs(ctx context.Context, k runIDs, base *runOptions, c caller, o submitOptions, fn Func) *Task {
	var t *Task
	if base.queue == "" {
		a := new(asyncTask)
		t = &a.Task
		t.ctx = ctx
		t.run.Store(&a.runState)
		t.makeContext(&a.runState) // it starts at once
	} else {
		t = new(Task)
		t.ctx = ctx // until it starts: see begin
	}
	t.ids, t.idLen = k.s, uint16(k.n)
	t.opts, t.fn, t.created, t.home = base, fn, time.Now().UnixMicro(), rt.runs
	t.shard = rt.runs.shardIndex(k.id())
	if o.timeout != 0 || o.retry != (RetryPolicy{}) {
		t.opts = &runOptions{queue: base.queue, timeout: o.timeout, retry: o.retry, hub: &rt.hub}
	}
	w := t.first[:0] // the first watcher, whoever it is, needs no slice of its own
	if !c.system {
		w = append(w, c.userID)
	}
	for _, g := range o.watchers {
		if g != c.userID {
			w = append(w, g)
		}
	}
	if len(w) > 1 {
		t.setWatchers(w) // w outgrew first
	}
	return t
}

// runIDs is a run's task id and run id, built in one string that the
// run's Task and record share: the task id, then the run id.
type runIDs struct {
	s string
	n int // the task id's length
}

// A Task keeps the task id's length in a uint16: this does not compile
// if the longest id could not fit.
const _ = uint16(MaxOwnerIDLen + len(scopeSep) + MaxKeyLen)

func (k runIDs) id() string    { return k.s[:k.n] }
func (k runIDs) runID() string { return k.s[k.n:] }

// mint returns id with a new run id, in one allocation; id is owner's
// scope separator and key, or key alone when owner is "". The run id is
// the instance id, a dot and a sequence number in base 36.
func (rt *Runtime[S]) mint(owner, key string) runIDs {
	var buf [16]byte
	seq := strconv.AppendUint(buf[:0], rt.runSeq.Add(1), 36)
	n := len(key)
	if owner != "" {
		n += len(owner) + len(scopeSep)
	}
	var b strings.Builder
	b.Grow(n + len(rt.instance) + 1 + len(seq))
	if owner != "" {
		b.WriteString(owner)
		b.WriteString(scopeSep)
	}
	b.WriteString(key)
	b.WriteString(rt.instance)
	b.WriteByte('.')
	b.Write(seq)
	return runIDs{s: b.String(), n: n}
}

// ids validates key and returns its scoped id with a new run id (see
// mint). The run id is minted even when the submission then joins a
// live run, which costs a number of the sequence and nothing else.
func (rt *Runtime[S]) ids(key string, c caller, scope Scope) (runIDs, error) {
	owner, err := idOwner(key, c, scope)
	if err != nil {
		return runIDs{}, err
	}
	return rt.mint(owner, key), nil
}

// record is the new record a run is registered with: PENDING, or
// RUNNING for a run that starts as it is registered.
func (t *Task) record() Record {
	st := State{Status: StatusPending}
	if t.startsRegistered {
		st = t.registeredStart()
	}
	return Record{
		ID:        t.ID(),
		RunID:     t.RunID(),
		Queue:     t.opts.queue,
		Watchers:  t.watcherList(),
		CreatedAt: t.createdAt(),
		State:     st,
	}
}

// memRecord is record as a MemStore keeps it, built without the Record
// in between and without the checks a MemStore makes of a record from
// outside: every part of it comes from the runtime, which checked what
// came from its caller (the key, the owner, the watchers, the queue).
// It is what newMemRecord would make of record, as a test checks.
func (t *Task) memRecord() *memRecord {
	created := t.memCreated()
	var r *memRecord
	if t.startsRegistered {
		w := new(memRecordWithRest)
		r = &w.memRecord
		r.rest = &w.rest
		r.rest.startedAt = created
		r.status, r.attempt = statusCode(StatusRunning), 1
	} else {
		r = new(memRecord)
		r.status = statusCode(StatusPending)
	}
	r.ids, r.idLen, r.queue, r.created = t.ids, t.idLen, t.opts.queue, created
	r.setWatchers(t.watcherList())
	return r
}

// memCreated returns when the run was registered, as a MemStore keeps
// times (see memTime).
func (t *Task) memCreated() memTime { return memTime(t.created - zeroUnix*1e6) }

// registeredStart is the RUNNING state of a run that starts as it is
// registered: its first attempt, started when it was created.
func (t *Task) registeredStart() State {
	return State{Status: StatusRunning, StartedAt: t.createdAt(), Attempt: 1}
}

// publish makes t the holder of its id's handle. A run of the same id
// still executing here is a predecessor whose record was replaced or
// deleted: it is cancelled as superseded (a no-op if it already has a
// cause). One still waiting for its turn (a queue, Config.Limits) ends
// as a cancelled one does (see endWaiting): under Limits it gives its
// owner's waiting place back now, not when its turn comes.
func (rt *Runtime[S]) publish(t *Task) {
	for _, old := range rt.runs.publish(t) {
		waiting := old.cause() == nil && rt.isWaiting(old)
		old.cancel(ErrSuperseded)
		if waiting {
			rt.endWaiting(old)
		}
	}
}

// noteWatcher updates the live copy of a run's watchers after a join.
func (rt *Runtime[S]) noteWatcher(id, runID string, watchers []string) {
	if t := rt.handle(id, runID); t != nil {
		t.learnWatchers(watchers)
	}
}

// handle returns the run holding id's handle if it is the run runID.
func (rt *Runtime[S]) handle(id, runID string) *Task {
	if t := rt.runs.get(id); t != nil && t.RunID() == runID {
		return t
	}
	return nil
}

// runOf returns run runID of id if it is live in this runtime, holding
// its id's handle or not (a run a re-run superseded here), or nil.
func (rt *Runtime[S]) runOf(id, runID string) *Task {
	if t := rt.handle(id, runID); t != nil {
		return t
	}
	for _, t := range rt.runs.ofID(id) {
		if t.RunID() == runID {
			return t
		}
	}
	return nil
}

// settle ends a run's life in the runtime. Only the run that holds the
// handle removes it: a successor's handle is never touched.
func (rt *Runtime[S]) settle(t *Task) {
	if t.has(runEndKept) {
		rt.found.Delete(t)
	}
	rt.runs.settle(t)
	if t.adm != nil {
		rt.adm.release(t.adm) // the callback has returned: its slot frees
	}
	t.markSettled()
	if t.has(runCancelNoted) { // after markSettled: see Cancel
		rt.cancels.Delete(t)
	}
}
