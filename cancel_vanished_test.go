package workers_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/storetest"
)

// A Cancel of a run executing here whose record is gone (an operator's
// DELETE, a failover to a replica that never had it) returns ErrNotFound
// and cancels the run at once, as the sync loop's next pass would, with
// ErrDeleted: the callback is told now, not a SyncInterval later. A
// caller who may not see the task leaves the run alone.
func TestCancelOfARunWhoseRecordIsGoneCancelsItNow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		f := &storetest.Faults{}
		rt := workers.NewRuntime(storetest.Faulty(workers.NewMemStore(), f), workers.Config{Logger: quiet})
		cause := make(chan error, 1)
		sub, err := rt.Submit(ctx, "report", func(ctx context.Context, _ *workers.Task) (any, error) {
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return nil, context.Cause(ctx)
		}, owner)
		require.NoError(t, err)
		synctest.Wait()
		// The record is gone: every call on it finds none.
		f.Add(storetest.Rule{Fault: storetest.FailBefore, Err: workers.ErrNotFound, Match: func(c *storetest.Call) bool {
			return c.ID == sub.ID
		}})
		begun := time.Now()

		err = rt.Cancel(ctx, sub.ID, workers.MustOwner("mallory"))
		assert.ErrorIs(t, err, workers.ErrNotFound)
		synctest.Wait()
		select {
		case c := <-cause:
			t.Errorf("a caller who may not see the task cancelled its run (%v)", c)
			require.NoError(t, rt.Shutdown(ctx))
			return
		default:
		}

		err = rt.Cancel(ctx, sub.ID, owner)
		assert.ErrorIs(t, err, workers.ErrNotFound, "the record is gone")
		synctest.Wait()
		select {
		case c := <-cause:
			assert.ErrorIs(t, c, workers.ErrDeleted)
			assert.Zero(t, time.Since(begun), "the run waited for the sync loop")
		default:
			t.Error("the callback runs on past a Cancel that found its record gone")
			<-cause // the sync loop's pass cancels it
		}
		_, err = rt.Wait(ctx, sub.ID, owner)
		assert.ErrorIs(t, err, workers.ErrNotFound)
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// A Cancel of a run waiting here for a slot under Limits whose record is
// gone returns ErrNotFound and ends the run at once: it gives its waiting
// place back and never starts, rather than wait for its turn.
func TestCancelOfAWaitingRunWhoseRecordIsGoneEndsItNow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		f := &storetest.Faults{}
		rt := workers.NewRuntime(storetest.Faulty(workers.NewMemStore(), f), workers.Config{Logger: quiet, Limits: workers.Limits{MaxRunning: 1}})
		release := make(chan struct{})
		_, err := rt.Submit(ctx, "first", func(context.Context, *workers.Task) (any, error) {
			<-release
			return nil, nil
		}, owner)
		require.NoError(t, err)
		ran := make(chan struct{}, 1)
		sub, err := rt.Submit(ctx, "second", func(context.Context, *workers.Task) (any, error) {
			ran <- struct{}{}
			return nil, nil
		}, owner)
		require.NoError(t, err)
		synctest.Wait()
		stats, err := rt.Stats(ctx, workers.System)
		require.NoError(t, err)
		require.Equal(t, 1, stats.Waiting)
		f.Add(storetest.Rule{Fault: storetest.FailBefore, Err: workers.ErrNotFound, Match: func(c *storetest.Call) bool {
			return c.ID == sub.ID
		}})

		assert.ErrorIs(t, rt.Cancel(ctx, sub.ID, owner), workers.ErrNotFound)
		synctest.Wait()
		stats, err = rt.Stats(ctx, workers.System)
		require.NoError(t, err)
		assert.Zero(t, stats.Waiting, "the run whose record is gone keeps its waiting place")

		close(release)
		synctest.Wait()
		select {
		case <-ran:
			t.Error("the run whose record is gone started")
		default:
		}
		require.NoError(t, rt.Shutdown(ctx))
	})
}

// A Cancel that found no record, and whose check of the run here then
// fails to read it (the store lost its connection), leaves the run
// alone: a failed read says nothing of the record, which may be there.
// Cancel still returns ErrNotFound, and the run goes on to its end.
func TestCancelWhoseCheckOfTheRunFailsLeavesItAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		f := &storetest.Faults{}
		rt := workers.NewRuntime(storetest.Faulty(workers.NewMemStore(), f), workers.Config{Logger: quiet})
		release := make(chan struct{})
		sub, err := rt.Submit(ctx, "report", func(ctx context.Context, _ *workers.Task) (any, error) {
			select {
			case <-release:
				return "done", nil
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		}, owner)
		require.NoError(t, err)
		synctest.Wait()
		ofTask := func(c *storetest.Call) bool { return c.Op == storetest.OpGetTask && c.ID == sub.ID }
		// Cancel's read finds no record; the check's read after it fails.
		f.Add(storetest.Rule{Op: storetest.OpGetTask, Times: 1, Fault: storetest.FailBefore, Err: workers.ErrNotFound, Match: ofTask})
		f.Add(storetest.Rule{Op: storetest.OpGetTask, Times: 1, Fault: storetest.FailBefore, Err: workers.ErrUnavailable, Match: ofTask})

		assert.ErrorIs(t, rt.Cancel(ctx, sub.ID, owner), workers.ErrNotFound)
		synctest.Wait()
		assert.Equal(t, 2, f.Injected(storetest.OpGetTask), "Cancel's read, then the check's")
		close(release)
		snap, err := rt.Wait(ctx, sub.ID, owner)
		require.NoError(t, err)
		assert.Equal(t, workers.StatusCompleted, snap.Status, "the run whose check failed to read was cut off")
		require.NoError(t, rt.Shutdown(ctx))
	})
}
