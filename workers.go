// Package workers is an in-process task queue with authorization built in.
//
// A service submits closures as tasks on behalf of an identity, and its
// handlers poll status and progress, list a user's tasks and cancel them.
// Every call names who it acts for, and only the task's watchers may see or
// touch it. Tasks run on their own goroutines or, one at a time and in
// order, on named sequential queues.
//
//	store := workers.NewMemStore()
//	rt := workers.NewRuntime(store, workers.Config{})
//	defer rt.Shutdown(context.Background())
//
//	alice := workers.MustOwner("alice")
//	sub, err := rt.Submit(ctx, "report-42", func(ctx context.Context, t *workers.Task) (any, error) {
//		t.SetProgress(50)
//		return buildReport(ctx)
//	}, alice)
//	snap, err := rt.Status(ctx, sub.ID, alice) // or rt.Wait, to block until it ends
//
// # Authority
//
// Every task API takes a [TaskAuthority]: an [Owner], built by [NewOwner]
// from a validated user id, or [System], the explicit unscoped bypass. A
// nil authority and a zero Owner are refused with [ErrNoAuthority] on every
// call; a forgotten identity never widens access.
//
// A task id is also its deduplication key, so its [Scope] decides who can
// collide with whom. By default a key is scoped to its owner
// ("alice::report-42"), and [ScopedTaskKey] rebuilds the id; [OwnerOf]
// reads the owner back, so ownership is derived from the id and cannot be
// lost. With [WithScope]([ScopeGlobal]) the key is used verbatim and shared
// system-wide; a caller who does not watch an existing global task is
// refused unless the store's [WatchAuthorizer] allows it.
//
// Watchers are the only gate on reading, listing and cancelling. A caller
// who is not a watcher cannot learn that a task exists: [Runtime.Status]
// and [Runtime.Cancel] answer [ErrNotFound] exactly as for a missing task.
// Access is granted only at submit time: with [WithWatchers], or, for a
// live global-scope key, by joining it when the store's [WatchAuthorizer]
// allows the caller, which makes the caller a watcher.
//
// # Runs and fencing
//
// Each run of a task has a run id, minted when the run is registered.
// Every write of a run's outcome is a transition fenced on that run id, so
// when a finished key is submitted again and a new run replaces the
// record, the old run's late writes can never land.
//
// # Cancellation
//
// A task's callback receives a context that the runtime cancels, with a
// cause, when the run should stop: [ErrCancelled] (through
// [Runtime.Cancel], in this process or another), a [*TimeoutError]
// ([WithTimeout]), [ErrSuperseded] (a newer run replaced it),
// [ErrShutdown] ([Runtime.Shutdown]), [ErrAbandoned] (its instance lost
// its lease, or another process recovered it) or [ErrDeleted] (its
// record was deleted; no record keeps that cause). The first cause is the one
// that sticks and the one recorded: the record keeps a [Cause] code beside
// its message, and [Snapshot.Err] unwraps to the cause the code names. The
// cancel function is private to the runtime, and the message stored for
// each cause comes from one table. A cancel through [Runtime.Cancel] also
// records who cancelled and, with [WithReason], why
// ([Snapshot.CancelledBy], [Snapshot.CancelReason]). The context keeps the values of the
// submission's context (a trace span, a request id), never its
// cancellation or deadline.
//
// # Live events
//
// [Runtime.Watch] yields one task's snapshots as they change, ending
// after its terminal one; [Runtime.Subscribe] yields changes of every
// task the caller may see. Both are authorized when they start and on
// every run change, coalesce per task so that a slow reader sees the
// latest state rather than a backlog, and never slow a run. Package
// github.com/taskgate/workers/workershttp serves them, with list,
// status and cancel, over HTTP.
//
// # Stores
//
// A [Store] holds the records and the authorization policy: what the
// record says. A [Runtime] holds what this process is doing: run handles,
// queues, the cleanup scheduler. [MemStore] is the volatile default (with
// leases and notices within the process); the
// SQL stores in the module github.com/taskgate/workers/sqlstore make
// records durable and let several processes share one database. Package
// storetest is the conformance suite every store passes, and holds
// Faulty, a store wrapper that injects faults for tests.
//
// Results are stored as JSON in every store; decode them with [ResultAs].
//
// # Limits
//
// Without [Config.Limits] every submission starts at once on its own
// goroutine. With them, the runtime caps the callbacks executing at once,
// and each owner's running and waiting tasks ([Limits], [OwnerLimits],
// with a hook for tiers); a task over a running cap waits as a PENDING
// record, holding no goroutine, and waiting tasks start round-robin
// across owners, System being one more member of the rotation, so no
// tenant's backlog delays another's first task by more than one round. A
// submission past a waiting cap is refused with a [*QuotaError]
// ([ErrQuotaExceeded]) carrying a retry hint, before anything is written;
// joining a live run is never refused. A slot is held until the callback
// really returns, even past its timeout. [Runtime.Stats] reports the
// load to System.
//
// # Shutdown
//
// [Runtime.Shutdown] has the shape of http.Server.Shutdown: it stops
// intake, stops the queues fetching (recording their backlog CANCELLED),
// lets the runs in flight finish for a grace period
// (Config.ShutdownGrace), cancels what remains and waits for it within its
// context, which bounds it even over a store that hangs. After it returns
// nil, no goroutine the runtime started is left and no record it owned is
// PENDING or RUNNING.
//
// # Replicas and faults
//
// Over a store that implements [Leaser], each runtime holds an instance
// lease judged by the store's clock, and every replica's recovery loop
// ends the runs of instances whose lease expired ([ErrAbandoned]); a
// submission never joins a run that is not alive. Over a [Notifier]
// store, a change made in one process reaches the others at once. A run's
// store writes retry transient failures with backoff, fenced on its run
// id, and a write the store refuses for good ([ErrInvalidData]) ends the
// run FAILED with a message that says so, so that no acknowledged
// submission is left live without a live run behind it.
//
// # Listing
//
// [Runtime.List] returns newest first; [Runtime.ListPage] returns one
// [Page] and an opaque cursor for the next ([WithCursor]), in either
// [Order] ([WithOrder]). Every store reads a page in proportion to its
// size, whatever the user's history.
//
// # Observability
//
// [Config.Middleware] wraps every callback (the first is outermost), and
// [Config.Observers] receive each run's lifecycle [Event]s, called with
// no lock held; a panicking observer is contained and logged. The module
// github.com/taskgate/workers/workersotel builds OpenTelemetry traces and
// metrics on them. A callback's panic is logged with its stack, which the
// record keeps for System readers ([Snapshot.Stack]).
//
// # Errors
//
// Errors are sentinels matched with [errors.Is] ([ErrNotFound],
// [ErrUnauthorized], [ErrClosed], ...) or types matched with [errors.As]
// ([*ValidationError], [*AuthorizationError], [*QuotaError],
// [*TimeoutError], [*PanicError], [*TaskError], [*PermanentError]). Each
// method's doc says which it returns. Every method that takes a context
// refuses a nil one with [ErrInvalidOption] before doing anything (a
// stream yields it once and ends), [Runtime.Shutdown] included, which
// then leaves the runtime open. A callback returns [Permanent](err) for
// an error that no retry can fix.
package workers
