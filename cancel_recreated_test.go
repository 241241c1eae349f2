package workers_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
)

// afterGetStore is a store whose GetTask calls afterGet, when set, with
// the id read and the read's error, before it returns.
type afterGetStore struct {
	workers.Store
	afterGet func(id string, err error)
}

func (s *afterGetStore) GetTask(ctx context.Context, id string) (workers.Record, error) {
	rec, err := s.Store.GetTask(ctx, id)
	if s.afterGet != nil {
		s.afterGet(id, err)
	}
	return rec, err
}

// A run whose record is found deleted, and re-created by a newer run of
// the same task before the finding cancels it, ends superseded: the
// newer run's registration cancelled it first, and its observers hear
// the cause its context keeps, not that of a record deleted.
func TestARunWhoseDeletedRecordANewerRunReCreatedEndsSuperseded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		mem := workers.NewMemStore()
		s := &afterGetStore{Store: mem}
		var mu sync.Mutex
		var ends []workers.Event
		obs := workers.ObserverFunc(func(_ context.Context, e workers.Event) {
			if e.Kind == workers.EventFinished {
				mu.Lock()
				ends = append(ends, e)
				mu.Unlock()
			}
		})
		rt := workers.NewRuntime(s, workers.Config{Logger: quiet, Observers: []workers.Observer{obs}})
		block := func(cause chan<- error) workers.Func {
			return func(ctx context.Context, _ *workers.Task) (any, error) {
				<-ctx.Done()
				cause <- context.Cause(ctx)
				return nil, context.Cause(ctx)
			}
		}
		oldCause, newCause := make(chan error, 1), make(chan error, 1)
		old, err := rt.Submit(ctx, "report", block(oldCause), owner)
		require.NoError(t, err)
		synctest.Wait()
		require.NoError(t, mem.ClearRecords(ctx))

		// Cancel finds no record, and checks the run here: between its
		// read, which finds none, and its cancel, a newer run of the
		// task is submitted, and re-creates the record.
		reads := 0
		var newer workers.Submission
		s.afterGet = func(id string, err error) {
			if id != old.ID || !errors.Is(err, workers.ErrNotFound) {
				return
			}
			if reads++; reads == 2 {
				s.afterGet = nil
				newer, err = rt.Submit(ctx, "report", block(newCause), owner)
				require.NoError(t, err)
			}
		}
		assert.ErrorIs(t, rt.Cancel(ctx, old.ID, owner), workers.ErrNotFound)
		require.NotEmpty(t, newer.RunID, "the newer run was submitted during the check")
		synctest.Wait()
		assert.ErrorIs(t, <-oldCause, workers.ErrSuperseded, "the run's context")

		mu.Lock()
		var oldEnds []workers.Event
		for _, e := range ends {
			if e.RunID == old.RunID {
				oldEnds = append(oldEnds, e)
			}
		}
		mu.Unlock()
		if assert.Len(t, oldEnds, 1, "the older run's ends heard") {
			assert.Equal(t, workers.StatusCancelled, oldEnds[0].Status)
			assert.Equal(t, workers.CauseSuperseded, oldEnds[0].Cause, "the end heard of the older run")
		}

		require.NoError(t, rt.Cancel(ctx, newer.ID, owner))
		assert.ErrorIs(t, <-newCause, workers.ErrCancelled)
		require.NoError(t, rt.Shutdown(ctx))
	})
}
