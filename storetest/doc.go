// Package storetest is the conformance suite for [workers.Store]
// implementations. Every store, MemStore included, runs the same cases,
// which is how the stores are known to behave alike.
//
// Call [Run] from a test in the store's package, with a factory that
// returns a fresh, empty store and registers its teardown with t.Cleanup:
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
//		storetest.Run(t, func(t *testing.T) workers.Store {
//			// A database of its own per call: the cases run in parallel.
//			s, err := mystore.Open(t.Context(), mystore.TempDatabase(t))
//			if err != nil {
//				t.Fatal(err)
//			}
//			t.Cleanup(func() { s.Close() })
//			return s
//		}, storetest.Durable())
//	}
//
// A store whose records outlive the process, as a SQL store's do, passes
// [Durable], as above: the suite then requires that it does not implement
// [workers.RecordClearer]. A volatile store leaves it out, and if it
// implements RecordClearer the suite checks that ClearRecords empties it.
//
// Run the suite with the race detector (go test -race). Several cases race
// goroutines against one record or one lock, and a store that shares
// memory unsafely shows up only there.
//
// # Isolation and parallelism
//
// Every case is a subtest with a behaviour name, such as
// "Fencing/StaleRunRejected", so one case can be rerun with
// go test -run 'TestMyStore/Fencing/StaleRunRejected'. A failing case logs
// the one sentence of contract it checks.
//
// The factory is called once per case, and the cases run in parallel
// (t.Parallel), so the factory is called from many goroutines at once and
// the stores it returns are used concurrently. Each call must therefore
// return a store that shares no records with any other: a SQL store needs a
// database, schema or table set of its own per call, created by the factory
// and dropped in its cleanup. A backend that cannot isolate stores that way
// (a factory that truncates one shared set of tables, say) passes [Serial].
//
// # What the suite assumes
//
// The suite writes times as the runtime does: UTC, truncated to the
// microsecond. Stores keep times to at least microsecond precision and
// return zero times as zero; the suite compares them with time.Time.Equal,
// so a store may return them in any location. Results are compared as JSON
// values, so a store may re-encode them (as a jsonb column does). Watcher
// order is not part of the contract, and an empty watcher list or result
// may come back nil or empty.
//
// # Watchdog
//
// Cases that run goroutines run under a watchdog: if one has not finished
// within the [Timeout] (30 seconds by default), it fails, and the context
// it passes to the store is cancelled. A store that honours cancellation
// then returns and the case ends; goroutines stuck in a store that ignores
// it are abandoned.
package storetest
