// Package storetest is the conformance suite for [workers.Store]
// implementations. Every store, MemStore included, runs the same cases,
// which is how the stores are known to behave alike.
//
// The suite has three entry points. [Run] checks the Store contract method
// by method. [RunRuntime] drives real [workers.Runtime] values over the
// store, through the scenarios in which backends have been seen to differ:
// joins, cancels, re-runs that supersede a run still executing, sequential
// queues, shutdown, zombie recovery, cleanup. [RunFaults] puts the store
// behind [Faulty] and fails each store call on a run's path, before and
// after it lands, checking that no task is ever stranded. A store passes
// all three. Call them from tests in the store's package, with a factory
// that returns a fresh, empty store and registers its teardown with
// t.Cleanup:
//
//	package mystore_test
//
//	import (
//		"testing"
//
//		"example.com/mystore"
//		"github.com/taskgate/workers"
//		"github.com/taskgate/workers/storetest"
//	)
//
//	func TestMyStore(t *testing.T) {
//		storetest.Run(t, newStore, storetest.Durable())
//	}
//
//	func TestMyStoreRuntime(t *testing.T) {
//		storetest.RunRuntime(t, newStore, storetest.Durable())
//	}
//
//	func TestMyStoreFaults(t *testing.T) {
//		storetest.RunFaults(t, newStore)
//	}
//
//	// newStore returns a store with a database of its own: the cases run
//	// in parallel.
//	func newStore(t *testing.T) workers.Store {
//		s, err := mystore.Open(t.Context(), mystore.TempDatabase(t))
//		if err != nil {
//			t.Fatal(err)
//		}
//		t.Cleanup(func() { s.Close() })
//		return s
//	}
//
// A store whose records outlive the process, as a SQL store's do, passes
// [Durable], as above: the suite then requires that it does not implement
// [workers.RecordClearer], and that Runtime.Reset leaves its records in
// place. A volatile store leaves it out, and if it implements
// RecordClearer the suite checks that ClearRecords, and Runtime.Reset,
// empty it.
//
// Run the suite with the race detector (go test -race). Several cases race
// goroutines against one record or one lock, and a store that shares
// memory unsafely shows up only there.
//
// # Optional capabilities
//
// [Run] also checks the optional capabilities a store implements:
// [workers.Leaser] (leases created, extended, released and expired by
// the store's clock) and [workers.Notifier] (a Resync first, then a
// notice of every changing write, in write order, to every listener).
// Their cases skip for a store without them. A store shared by processes
// passes [Peer], so that the notice cases write through a second handle.
// The runtime cases see the store with its capabilities, so [RunRuntime]
// drives runtimes that hold leases and listen wherever the store offers
// them.
//
// # Faults
//
// [Faulty] wraps any store in a fault schedule ([Faults]): rules select
// calls (a method, its Nth call, a predicate on its arguments) and fail
// them before they reach the store, after they landed (the write whose
// acknowledgement was lost), hang them until released, or slow them. The
// wrapper keeps exactly the optional capabilities of the store it wraps.
// Use it to test what a service, or a store's own retry logic, does when
// the database misbehaves; the workers package's fault and chaos tests
// are built on it.
//
// # Isolation and parallelism
//
// Every case is a subtest with a behaviour name, such as
// "Fencing/StaleRunRejected", so one case can be rerun with
// go test -run 'TestMyStore/Fencing/StaleRunRejected'. A failing case logs
// the one sentence of contract it checks.
//
// The factory is called once per case of either entry point, and the
// cases run in parallel (t.Parallel), so the factory is called from many
// goroutines at once and the stores it returns are used concurrently.
// Each call must therefore return a store that shares no records with any
// other: a SQL store needs a database, schema or table set of its own per
// call, created by the factory and dropped in its cleanup. A backend that
// cannot isolate stores that way (a factory that truncates one shared set
// of tables, say) passes [Serial].
//
// # What the suite assumes
//
// The suite writes times as the runtime does: UTC, truncated to the
// microsecond. Stores keep times to at least microsecond precision and
// return zero times as zero; the suite compares them with time.Time.Equal,
// so a store may return them in any location. The times it compares
// stored ones with, a listing's position and a cleanup's cutoff, may
// fall between two microseconds: a store compares them as given, as
// Filter.Match and DeleteFinished's contract do, not rounded to what it
// keeps. Results are compared byte
// for byte, as CheckState promises: a store must not re-encode them (as
// a jsonb column would). Watcher order is not part of the contract, and
// an empty watcher list or result may come back nil or empty.
//
// # Runtime cases
//
// A RunRuntime case builds its runtimes with workers.NewRuntime over the
// one store the factory gave it; two runtimes over it stand for two
// processes sharing a database. It sets the store's authorizers, reads
// and writes records directly where an operator or another process
// would, and shuts every runtime down before it ends, so no goroutine
// outlives it. It waits on channels and on the store's state, never on
// the clock, except where real time is the point (a 50ms task timeout, a
// cleanup scheduler ticking every 10ms): a SQL store cannot run inside a
// synctest bubble.
//
// The runtimes see the store through a recorder that passes every call
// through unchanged and notes each write, so that a case can wait for a
// run's write; it has exactly the optional capabilities of the store
// ([workers.RecordClearer], [workers.Leaser], [workers.Notifier]), so a
// runtime over it takes the lease and listens as it would over the store.
// A runtime logs only store errors that no caller sees, such as a failed
// write on a run's behalf, so every error a runtime logs fails the case.
//
// # Watchdog
//
// Cases that run goroutines, and every RunRuntime case, run under a
// watchdog: if one has not finished within the [Timeout] (30 seconds by
// default), it fails, and the context it passes to the store is
// cancelled. A store that honours cancellation then returns and the case
// ends; goroutines stuck in a store that ignores it are abandoned.
package storetest
