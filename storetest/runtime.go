package storetest

import (
	"testing"

	"github.com/taskgate/workers"
)

// RunRuntime checks that a [workers.Runtime] behaves over the stores
// newStore returns as it does over every other store. Where [Run] calls
// the Store methods one by one, RunRuntime drives real runtimes over the
// store through the scenarios in which backends have been seen to
// differ: joins and foreign joins, cancels, re-runs that supersede a run
// still executing, sequential queues, shutdown, zombie recovery, cleanup,
// progress, panics and timeouts.
//
// newStore has the contract it has for Run, and the options mean the
// same. Each case is a parallel subtest (unless [Serial] is given) with a
// store of its own, runs under the watchdog ([Timeout]), and shuts down
// every runtime it builds before it ends. The runtimes see the store
// through a pass-through recorder, and every error they log fails the
// case; the package documentation says more.
func RunRuntime(t *testing.T, newStore func(t *testing.T) workers.Store, opts ...Option) {
	t.Helper()
	newSuite(opts).run(t, runtimeCases, newStore)
}

// runtimeCases is the runtime suite, grouped by the runtime behaviour
// each checks.
var runtimeCases = []testCase{
	{"Submit/RunsAndCompletes",
		"a submitted task runs once and its record ends COMPLETED under the submission's run id, with the callback's result stored as JSON that ResultAs decodes.",
		withRuntime(runsAndCompletes)},
	{"Submit/JoinLiveKey",
		"a second submit of a live key by its owner, through the same runtime or another over the store, joins the run: Joined, the same run id, and the joiner's callback never runs.",
		withRuntime(joinLiveKey)},

	{"Join/ForeignRefused",
		"a caller who does not watch a global-scope key is refused with ErrUnauthorized when the store holds no watch authorizer or one that panics, and the record is left as it was.",
		withRuntime(joinForeignRefused)},
	{"Join/ForeignAllowed",
		"a caller the store's watch authorizer allows joins a live global-scope key: Joined, the same run id, the stored record lists it as a watcher, and Status answers it.",
		withRuntime(joinForeignAllowed)},

	{"Authorizers/QueueAuthorizerPanicDenies",
		"a queue authorizer that panics denies an Owner's submission on both paths with ErrUnauthorized and creates no record; System is not asked.",
		withRuntime(queueAuthorizerPanics)},

	{"Visibility/NonWatcherSeesNotFound",
		"Status and Cancel by a caller who does not watch a task return exactly what they return for a missing id, and leave the run alone.",
		withRuntime(nonWatcherSeesNotFound)},

	{"Cancel/WhilePending",
		`cancelling a sequential item that waits behind a running head records CANCELLED with "Cancelled by user" at once, and the item never runs.`,
		withRuntime(cancelWhilePending)},
	{"Cancel/WhileRunning",
		`cancelling a running task records CANCELLED with "Cancelled by user" at once, ends the callback's context with ErrCancelled, and the run's own late write changes nothing.`,
		withRuntime(cancelWhileRunning)},
	{"Cancel/FromAnotherRuntime",
		"a cancel through another runtime over the store records CANCELLED at once, and the late write of the runtime executing the run is fenced out.",
		withRuntime(cancelFromAnotherRuntime)},

	{"Rerun/SupersedesExecutingPredecessor",
		"re-submitting a key whose record was marked terminal while its run still executes starts a new run that completes, cancels the predecessor with ErrSuperseded, and the predecessor's late write never lands.",
		withRuntime(rerunSupersedes)},
	{"Rerun/ResetsWatchers",
		"re-running a finished key resets its watchers to the submitter and its WithWatchers grants: earlier watchers lose access.",
		withRuntime(rerunResetsWatchers)},

	{"Queue/FIFOOrder",
		"a sequential queue runs its items one at a time, in submission order, each to COMPLETED.",
		withRuntime(queueFIFO)},

	{"Progress/LiveInStatus",
		"progress set inside the callback shows in Status while the run executes, and the terminal record keeps the last value.",
		withRuntime(progressLive)},
	{"Panic/FailsAndRuntimeKeepsWorking",
		"a callback that panics ends FAILED with the panic recorded, on both paths, and the runtime and its queue go on running tasks.",
		withRuntime(panicFails)},
	{"Timeout/FailsWithTypedError",
		"a run whose timeout expires ends FAILED without retry, Snapshot.Err matching a *TimeoutError that carries the timeout, and the callback's late return changes nothing.",
		withRuntime(timeoutFails)},

	{"Shutdown/AbandonsBacklog",
		`Shutdown returns nil, records every sequential item that never started CANCELLED with "Cancelled by worker shutdown" without running it, and later submissions return ErrClosed.`,
		withRuntime(shutdownAbandonsBacklog)},
	{"Shutdown/LeavesNothingLive",
		"once Shutdown returns nil, however submissions raced it, the store holds no PENDING or RUNNING record.",
		withRuntime(shutdownLeavesNothingLive)},

	{"Recovery/NewRuntimeSweepsZombies",
		"a new runtime recovering zombies at Start fails with ErrAbandoned the live records it runs nothing for, leaves its own runs and finished records alone, and the abandoned run's late write is fenced out.",
		withRuntime(recoverySweepsZombies)},

	{"Cleanup/DeletesOldTerminal",
		"Cleanup, and the cleanup scheduler, delete the terminal records completed before the retention and keep recent terminal records and live ones.",
		withRuntime(cleanupDeletesOld)},

	{"Admission/RefusalWritesNothing",
		"a submission past its owner's waiting cap is refused with a *QuotaError carrying the limit and count, leaves no record on either path, and a join of a live run, running or waiting, is never refused.",
		withRuntime(admissionRefusalWritesNothing)},
	{"Admission/WaitingCancelled",
		`a task waiting for a slot is PENDING in the store; Cancel records it CANCELLED with "Cancelled by user" at once, frees its waiting place, and it never runs.`,
		withRuntime(admissionWaitingCancelled)},
	{"Admission/ShutdownCancelsWaiting",
		`Shutdown records every task waiting for a slot, async or sequential, CANCELLED with "Cancelled by worker shutdown" without running it.`,
		withRuntime(admissionShutdownCancelsWaiting)},

	{"Reset/KeepsDurableRecords",
		"Reset clears the records of a volatile store that implements RecordClearer, never deletes a durable store's records, records waiting queue items CANCELLED, and leaves the runtime open.",
		withRuntime(resetKeepsDurable)},
}
