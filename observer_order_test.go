package workers

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// afterStartStore calls after once a run's start (PENDING to RUNNING)
// has landed, before the run goes on to report it.
type afterStartStore struct {
	Store
	after atomic.Pointer[func()]
}

func (s *afterStartStore) TransitionTask(ctx context.Context, id, runID string, from []Status, next State) (bool, error) {
	ok, err := s.Store.TransitionTask(ctx, id, runID, from, next)
	if ok && next.Status == StatusRunning && slices.Contains(from, StatusPending) {
		if f := s.after.Swap(nil); f != nil {
			(*f)()
		}
	}
	return ok, err
}

// A queue item's start lands; a Cancel lands and is reported before the
// run reports its start. An observer then hears the run's end, and only
// after it the run's start ("about to call its callback", which it never
// calls): a run shown ended, then running.
func TestObserversNeverHearARunStartAfterItsEnd(t *testing.T) {
	s := &afterStartStore{Store: NewMemStore()}
	var mu sync.Mutex
	var kinds []EventKind
	var task atomic.Pointer[Task]
	obs := ObserverFunc(func(_ context.Context, e Event) {
		if e.Kind == EventSubmitted {
			task.Store(e.Task)
		}
		mu.Lock()
		kinds = append(kinds, e.Kind)
		mu.Unlock()
	})
	rt := newRuntime(t, s, Config{Observers: []Observer{obs}})
	id, err := ScopedTaskKey("job", alice)
	require.NoError(t, err)
	hook := func() {
		assert.NoError(t, rt.Cancel(ctx, id, alice))
	}
	s.after.Store(&hook)
	ran := make(chan struct{})
	sub, err2 := rt.SubmitSequential(ctx, "q", "job", func(context.Context, *Task) (any, error) {
		close(ran)
		return "ok", nil
	}, alice)
	require.NoError(t, err2)
	snap := settled(t, rt, sub.ID)
	require.Equal(t, StatusCancelled, snap.Status)
	select {
	case <-ran:
		t.Log("the callback ran")
	default:
	}
	require.NotNil(t, task.Load())
	wait(t, task.Load().doneChan(), "the run to settle")
	mu.Lock()
	defer mu.Unlock()
	fin := slices.Index(kinds, EventFinished)
	assert.NotContains(t, kinds[fin+1:], EventStarted, "observed %v", kinds)
}
