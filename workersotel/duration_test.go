package workersotel_test

import (
	"context"
	"testing"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/workersotel"
)

// A run cancelled between its registration (RUNNING, admitted at once)
// and its start: its callback never runs and no start is reported, so
// workers.task.duration should not count a run "from its start".
func TestCancelledBeforeStartHasNoDuration(t *testing.T) {
	var rt *workers.Runtime[*workers.MemStore]
	canceller := workers.ObserverFunc(func(_ context.Context, e workers.Event) {
		if e.Kind == workers.EventSubmitted {
			if err := rt.Cancel(context.Background(), e.TaskID, workers.System); err != nil {
				t.Error(err)
			}
		}
	})
	f := setupOver(t, workers.NewMemStore(), func(inst *workersotel.Instrumentation) workers.Config {
		return workers.Config{Observers: []workers.Observer{canceller, inst.Observer()}}
	})
	rt = f.rt
	called := false
	sub, err := rt.Submit(context.Background(), "k", func(context.Context, *workers.Task) (any, error) { called = true; return nil, nil }, workers.MustOwner("alice"))
	if err != nil {
		t.Fatal(err)
	}
	f.wait(t, sub.ID)
	onceCheck(t, f, 0)
	if called {
		t.Error("callback ran")
	}
}
