package workersotel_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace"

	"github.com/taskgate/workers"
)

// exemplarSpans returns, by metric name, the span ids of the exemplars of
// its data points.
func (f *fixture) exemplarSpans(t *testing.T) map[string][]trace.SpanID {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := f.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	ids := map[string][]trace.SpanID{}
	add := func(name string, spanID []byte) {
		ids[name] = append(ids[name], trace.SpanID(spanID))
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					for _, ex := range p.Exemplars {
						add(m.Name, ex.SpanID)
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					for _, ex := range p.Exemplars {
						add(m.Name, ex.SpanID)
					}
				}
			}
		}
	}
	return ids
}

// A run's measurements carry exemplars of the run's own span, which is
// what they measure: a slow workers.task.duration bucket leads to the run
// that was slow, not to the request that submitted it, and a run
// submitted with no span in its context (a scheduled job) has exemplars
// all the same.
func TestExemplarsAreTheRunsSpan(t *testing.T) {
	for _, parented := range []bool{true, false} {
		f := setup(t)
		ctx := context.Background()
		if parented {
			var parent trace.Span
			ctx, parent = f.tp.Tracer("test").Start(ctx, "request")
			defer parent.End()
		}
		sub, err := f.rt.Submit(ctx, "k", func(context.Context, *workers.Task) (any, error) { return nil, nil }, workers.MustOwner("alice"))
		if err != nil {
			t.Fatal(err)
		}
		f.wait(t, sub.ID)
		run := f.span(t, sub.RunID).SpanContext().SpanID()
		got := f.exemplarSpans(t)
		for _, name := range []string{"workers.tasks.submitted", "workers.tasks.started", "workers.tasks.finished", "workers.task.duration", "workers.task.queue_wait"} {
			if len(got[name]) != 1 || got[name][0] != run {
				t.Errorf("submitted with a parent span %v: %s has exemplars of spans %v, want the run's, %v", parented, name, got[name], run)
			}
		}
	}
}
