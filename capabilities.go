package workers

import (
	"context"
	"time"
)

// Leaser is an optional Store capability: instance leases decided on the
// store's clock. A store shared by several processes implements it so
// that each runtime can prove it is alive, and every runtime can tell
// which runs belong to an instance that is gone. The runtime finds it by
// type assertion.
//
// An instance is a runtime; its id is the prefix of every run id it mints
// (see InstanceOf). A lease is live until its expiry, which is always
// computed and compared by the store's clock (a SQL database's now()),
// never by a caller's, so replicas whose clocks disagree still agree on
// who is alive.
//
// Implementations must be safe for concurrent use by multiple goroutines,
// and must honour ctx's cancellation where they block.
type Leaser interface {
	// RenewLease sets instance's lease to expire ttl after the store's
	// clock now, creating the lease if there is none. It reports whether
	// it extended a lease that was still live; false means it created a
	// new one: the instance's first call, or a call after its lease
	// expired or was released, in which case its runs may already have
	// been recovered by another instance. ttl must be positive
	// (ErrInvalidOption).
	RenewLease(ctx context.Context, instance string, ttl time.Duration) (extended bool, err error)

	// ReleaseLease ends instance's lease at once, so that its remaining
	// runs count as abandoned. Releasing a lease that does not exist is
	// not an error.
	ReleaseLease(ctx context.Context, instance string) error

	// LiveInstances returns the ids of the instances whose lease has not
	// expired by the store's clock, in no particular order.
	LiveInstances(ctx context.Context) ([]string, error)
}

// Notifier is an optional Store capability: notice of record changes
// made by any process sharing the store, so that a runtime learns of a
// cancel, a re-run or an outcome written elsewhere without polling. The
// runtime finds it by type assertion, and keeps its polling as the
// fallback for a notice that never comes.
//
// Every write that changes a record (InsertTask, ReplaceTask, SetTask,
// a TransitionTask or AddWatcher that reports true) notifies every
// listener, in every process, once it is durable. DeleteFinished does not
// notify. A store may also announce a live record deleted outside its
// methods (the SQL stores' triggers announce an operator's DELETE), with
// a Change that names the task alone, or with a Resync when the records
// deleted at once are many; a listener reads the record, finds it gone,
// and ends the runs it holds for it. A notice is a hint: it names the
// task and, where the store knows it, the run and status the record
// holds after the change; a listener reads the record for the rest.
type Notifier interface {
	// Listen calls changed for each notice until ctx ends, and then
	// returns ctx's error. It returns another error if it cannot listen
	// at all, or can no longer: a store that cannot reopen a dropped
	// connection soon (within a second or so) returns, so that a runtime
	// stops counting on notices, polls meanwhile, and calls Listen again
	// later. Once it listens, and before any other notice, it calls
	// changed with a Change whose Resync is set: a listener that starts
	// after writes it cares about re-reads them then, and loses nothing.
	// A dropped connection that it reopens inside Listen is followed by
	// another Resync, since notices may have been lost meanwhile; so may
	// a store that drops a slow listener's queue.
	// When ctx ends, Listen leaves no goroutine or connection of its own
	// behind. Notices for one task arrive in the order their writes
	// became durable, but may be coalesced. changed is called from one
	// goroutine at a time and must not block: a slow listener delays
	// every later notice.
	Listen(ctx context.Context, changed func(Change)) error
}

// Change is one notice from a Notifier.
type Change struct {
	ID     string // the task id whose record changed; "" with Resync
	RunID  string // the record's run id after the change, or "" if unknown
	Status Status // the record's status after the change, or "" if unknown

	// Resync reports that notices may have been lost (a reconnect): the
	// listener should re-read whatever it cares about.
	Resync bool
}

// InstanceOf returns the id of the instance (the runtime) that minted
// runID: the part before its last ".", or "" for a run id with no "."
// past its first byte. A run id no runtime of this package minted may
// still have such a part, which names no instance that ever held a
// lease: recovery takes its record for another process's, and ends it
// once it finds no live lease of that name.
func InstanceOf(runID string) string {
	for i := len(runID) - 1; i > 0; i-- {
		if runID[i] == '.' {
			return runID[:i]
		}
	}
	return ""
}
