package storetest_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/storetest"
)

// A write that lands but whose caller hears it failed: the ambiguous
// write a runtime must treat as possibly landed.
func ExampleFaulty() {
	faults := &storetest.Faults{}
	store := storetest.Faulty(workers.NewMemStore(), faults)
	faults.Add(storetest.Rule{Op: storetest.OpInsertTask, Nth: 1, Fault: storetest.FailAfter})

	ctx := context.Background()
	err := store.InsertTask(ctx, workers.Record{ID: "alice::report", RunID: "run-1", State: workers.State{Status: workers.StatusPending}})
	fmt.Println("insert failed:", errors.Is(err, storetest.ErrInjected))
	_, err = store.GetTask(ctx, "alice::report")
	fmt.Println("record stored:", err == nil)
	fmt.Println("inserts:", faults.Calls(storetest.OpInsertTask), "faults:", faults.Injected(""))
	// Output:
	// insert failed: true
	// record stored: true
	// inserts: 1 faults: 1
}
