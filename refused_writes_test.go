package workers_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/storetest"
)

// errReadOnly is a store's refusal of every write while it still
// answers reads: a database gone read-only (a failover to a standby), or
// one whose disk is full.
var errReadOnly = errors.New("cannot execute INSERT in a read-only transaction (SQLSTATE 25006)")

// A submission whose insert a read-only store refused leaves no record,
// and its run, retired in case the insert landed, finds that out with a
// read, which still works: it ends there, instead of retrying the write
// of its end for as long as writes are refused, logging each submission
// so refused, and being counted by a Shutdown during the outage as a
// live record left unwritten, for a task that has no record at all.
func TestASubmissionARefusingStoreDidNotRegisterLeavesNothingToWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt, mem, f := faulty(workers.Config{})
		f.Add(storetest.Rule{Op: storetest.OpInsertTask, Fault: storetest.FailBefore, Err: errReadOnly})
		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Fault: storetest.FailBefore, Err: errReadOnly})
		f.Add(storetest.Rule{Op: storetest.OpReplaceTask, Fault: storetest.FailBefore, Err: errReadOnly})

		_, err := rt.Submit(context.Background(), "k", result(1), owner)
		require.ErrorIs(t, err, errReadOnly)
		assert.NotErrorIs(t, err, workers.ErrInvalidData, "a store refusing writes is not the caller's data")
		_, err = mem.GetTask(context.Background(), scoped(t, "k"))
		require.ErrorIs(t, err, workers.ErrNotFound)

		time.Sleep(time.Minute) // fake time: writes are still refused
		synctest.Wait()
		assert.LessOrEqual(t, f.Calls(storetest.OpTransitionTask), 1, "the retired run kept writing its end over no record")

		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		require.NoError(t, rt.Shutdown(ctx), "Shutdown counted the record of a submission that wrote none")
	})
}
