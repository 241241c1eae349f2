package workers

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A run waiting for its turn whose record is deleted gives its owner's
// waiting place back at once and ends without starting, as a cancelled
// run does, rather than hold the place until its turn: the owner's next
// submission is not refused for a run that will never start. Its
// context's cause is ErrDeleted, and the observers hear it finish
// CANCELLED with CauseDeleted. The record goes with a Reset of another
// runtime over the shared volatile store, or with a cleanup after an end
// written elsewhere whose notice was lost, which a Cancel here that
// finds the record gone then tells.
func TestADeletedWaitingRunGivesItsPlaceBackAtOnce(t *testing.T) {
	type deleter func(t *testing.T, s *droppingNotices, rt, other *Runtime[*droppingNotices], id string)
	for _, how := range []struct {
		name   string
		delete deleter
	}{
		{"ClearedElsewhere", func(t *testing.T, s *droppingNotices, rt, other *Runtime[*droppingNotices], id string) {
			require.NoError(t, other.Reset(ctx))
		}},
		{"CleanedUpAndCancelledHere", func(t *testing.T, s *droppingNotices, rt, other *Runtime[*droppingNotices], id string) {
			s.drop.Store(true) // the cancel's notice is lost
			require.NoError(t, other.Cancel(ctx, id, alice))
			synctest.Wait()
			s.drop.Store(false)
			time.Sleep(time.Second) // the fake clock: the end is a second old
			n, err := other.Cleanup(ctx, 0)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			assert.ErrorIs(t, rt.Cancel(ctx, id, alice), ErrNotFound)
		}},
	} {
		for _, c := range []struct {
			name  string
			queue string
		}{{"ForASlot", ""}, {"InAQueue", "q"}} {
			t.Run(how.name+"/"+c.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					var mu sync.Mutex
					tasks := make(map[string]*Task)    // guarded by mu: by run id, from their submission
					finished := make(map[string]Cause) // guarded by mu: by run id
					obs := ObserverFunc(func(_ context.Context, e Event) {
						mu.Lock()
						defer mu.Unlock()
						switch e.Kind {
						case EventSubmitted:
							tasks[e.RunID] = e.Task
						case EventFinished:
							finished[e.RunID] = e.Cause
						}
					})
					s := &droppingNotices{MemStore: NewMemStore(), cut: make(chan struct{})}
					logger := slog.New(slog.DiscardHandler)
					rt := NewRuntime(s, Config{Logger: logger, SyncInterval: time.Hour, Observers: []Observer{obs},
						Limits: Limits{MaxRunning: 1, Owner: OwnerLimits{Waiting: 1}}})
					other := NewRuntime(s, Config{Logger: logger})
					head, old, fn, ran := waitingBehindAHead(t, rt, c.queue)

					how.delete(t, s, rt, other, old.ID)
					synctest.Wait()

					st, err := rt.Stats(ctx, System)
					require.NoError(t, err)
					assert.Equal(t, 0, st.Waiting, "the run whose record was deleted still holds a waiting place")
					_, err = submitOn(rt, c.queue, "next", fn, alice)
					assert.NoError(t, err, "the owner's waiting cap counts a run that will never start")
					synctest.Wait()
					mu.Lock()
					task := tasks[old.RunID]
					cause, ended := finished[old.RunID]
					mu.Unlock()
					require.NotNil(t, task)
					assert.ErrorIs(t, task.CancelCause(), ErrDeleted)
					assert.True(t, ended, "the observers heard of the run's end")
					assert.Equal(t, CauseDeleted, cause)

					head.open()
					synctest.Wait()
					assert.EqualValues(t, 1, ran.Load(), "the next ran, the deleted one never")
					require.NoError(t, rt.Shutdown(ctx))
					require.NoError(t, other.Shutdown(ctx))
				})
			})
		}
	}
}

// A run waiting for its turn whose record is deleted with no word of it
// reaching the runtime (here, a store without notices) learns of it at
// its turn: its start is fenced out, its callback never runs, and its
// context's cause is ErrDeleted, as a notice of the delete would have
// made it.
func TestADeletedWaitingRunFoundAtItsTurnHasItsCause(t *testing.T) {
	for _, c := range []struct {
		name  string
		queue string
	}{{"ForASlot", ""}, {"InAQueue", "q"}} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var mu sync.Mutex
				tasks := make(map[string]*Task) // guarded by mu: by run id, from their submission
				obs := ObserverFunc(func(_ context.Context, e Event) {
					if e.Kind == EventSubmitted {
						mu.Lock()
						tasks[e.RunID] = e.Task
						mu.Unlock()
					}
				})
				mem := NewMemStore()
				rt := NewRuntime(bareStore{mem}, Config{Logger: slog.New(slog.DiscardHandler), SyncInterval: time.Hour,
					Observers: []Observer{obs}, Limits: Limits{MaxRunning: 1}})
				head, k, _, ran := waitingBehindAHead(t, rt, c.queue)

				require.NoError(t, mem.ClearRecords(ctx))
				head.open()
				synctest.Wait()

				mu.Lock()
				task := tasks[k.RunID]
				mu.Unlock()
				require.NotNil(t, task)
				assert.ErrorIs(t, task.CancelCause(), ErrDeleted)
				assert.Zero(t, ran.Load(), "the callback of a run whose record was deleted ran")
				require.NoError(t, rt.Shutdown(ctx))
			})
		})
	}
}

// waitingBehindAHead starts on rt, in a synctest bubble, a run "head"
// that holds the one running slot (Limits.MaxRunning 1), or with queue
// set its queue's turn, until head opens, and submits "k" behind it to
// wait for its turn. It returns head, k's submission, and the callback
// k was given, which counts its calls in ran and which later
// submissions may share.
func waitingBehindAHead[S Store](t *testing.T, rt *Runtime[S], queue string) (head *gate, k Submission, fn Func, ran *atomic.Int64) {
	t.Helper()
	head = newGate()
	_, err := submitOn(rt, queue, "head", head.fn, alice)
	require.NoError(t, err)
	<-head.started
	ran = new(atomic.Int64)
	fn = func(context.Context, *Task) (any, error) { ran.Add(1); return nil, nil }
	k, err = submitOn(rt, queue, "k", fn, alice)
	require.NoError(t, err)
	synctest.Wait()
	return head, k, fn, ran
}
