package workersotel_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/workersotel"
)

// behindStore is the shared MemStore as a replica whose clock is d off
// sees it: the times it hands the store are shifted by d on the way in,
// and the times it reads are shifted by -d on the way out, so that they
// stand to its own clock as on a replica whose clock is off.
type behindStore struct {
	*workers.MemStore
	d time.Duration
}

func shift(t time.Time, d time.Duration) time.Time {
	if t.IsZero() {
		return t
	}
	return t.Add(d)
}

func shiftRecord(rec *workers.Record, d time.Duration) {
	rec.CreatedAt, rec.StartedAt, rec.CompletedAt = shift(rec.CreatedAt, d), shift(rec.StartedAt, d), shift(rec.CompletedAt, d)
}

func (s *behindStore) TransitionTask(ctx context.Context, id, runID string, from []workers.Status, next workers.State) (bool, error) {
	next.StartedAt, next.CompletedAt = shift(next.StartedAt, s.d), shift(next.CompletedAt, s.d)
	return s.MemStore.TransitionTask(ctx, id, runID, from, next)
}

func (s *behindStore) GetTask(ctx context.Context, id string) (workers.Record, error) {
	rec, err := s.MemStore.GetTask(ctx, id)
	shiftRecord(&rec, -s.d)
	return rec, err
}

// Replica A (instrumented) runs a task; replica B, whose clock is 10 s
// behind A's, cancels it. A's instrumentation ends the run's span 10 s
// before its start and records a negative workers.task.duration.
func TestClockSkewCancelElsewhereNegativeDuration(t *testing.T) {
	mem := workers.NewMemStore()
	f := setupOver(t, mem, func(inst *workersotel.Instrumentation) workers.Config {
		return workers.Config{Observers: []workers.Observer{inst.Observer()}}
	})
	b := workers.NewRuntime(&behindStore{mem, -10 * time.Second}, workers.Config{})
	t.Cleanup(func() {
		if err := b.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	})
	alice := workers.MustOwner("alice")
	started := make(chan struct{})
	sub, err := f.rt.Submit(context.Background(), "long", func(ctx context.Context, _ *workers.Task) (any, error) {
		close(started)
		<-ctx.Done()
		return nil, context.Cause(ctx)
	}, alice)
	if err != nil {
		t.Fatal(err)
	}
	<-started
	if err := b.Cancel(context.Background(), sub.ID, alice); err != nil {
		t.Fatal(err)
	}
	f.wait(t, sub.ID)
	s := f.span(t, sub.RunID)
	if s.EndTime().Before(s.StartTime()) {
		t.Errorf("the run's span ends %v before it starts", s.StartTime().Sub(s.EndTime()))
	}
	var rm metricdata.ResourceMetrics
	if err := f.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == "workers.task.duration" {
				for _, p := range h.DataPoints {
					if v, ok := p.Min.Value(); ok && v < 0 {
						t.Errorf("workers.task.duration recorded %vs", v)
					}
				}
			}
		}
	}
}
