package workersotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/workersotel"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fixture struct {
	rt     *workers.Runtime[*workers.MemStore]
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	tp     *sdktrace.TracerProvider
}

func setup(t *testing.T, opts ...workersotel.Option) *fixture {
	t.Helper()
	f := &fixture{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	f.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(f.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(f.reader))
	inst, err := workersotel.New(append(opts, workersotel.WithTracerProvider(f.tp), workersotel.WithMeterProvider(mp))...)
	if err != nil {
		t.Fatal(err)
	}
	f.rt = workers.NewRuntime(workers.NewMemStore(), workers.Config{
		Middleware: []workers.Middleware{inst.Middleware()},
		Observers:  []workers.Observer{inst.Observer()},
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := f.rt.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		_ = f.tp.Shutdown(ctx)
		_ = mp.Shutdown(ctx)
	})
	return f
}

// wait waits for the task's record to end.
func (f *fixture) wait(t *testing.T, id string) workers.Snapshot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	snap, err := f.rt.Wait(ctx, id, workers.System)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// span returns the ended span of run runID, waiting for the observer
// that ends it (it runs after the record is written).
func (f *fixture) span(t *testing.T, runID string) sdktrace.ReadOnlySpan {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, s := range f.spans.Ended() {
			if attrOf(s.Attributes(), "workers.run.id") == runID {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ended span for run %s", runID)
		}
		time.Sleep(time.Millisecond) // polling with a deadline
	}
}

func attrOf(attrs []attribute.KeyValue, key string) string {
	for _, a := range attrs {
		if string(a.Key) == key {
			return a.Value.Emit()
		}
	}
	return ""
}

func TestSpansAndMetricsForEachEnding(t *testing.T) {
	f := setup(t)
	parentCtx, parent := f.tp.Tracer("test").Start(context.Background(), "request")
	alice := workers.MustOwner("alice")

	childSeen := make(chan bool, 1)
	ok, err := f.rt.Submit(parentCtx, "ok", func(ctx context.Context, _ *workers.Task) (any, error) {
		_, child := f.tp.Tracer("test").Start(ctx, "inside")
		child.End()
		childSeen <- true
		return "done", nil
	}, alice)
	if err != nil {
		t.Fatal(err)
	}
	failed, err := f.rt.Submit(parentCtx, "fail", func(context.Context, *workers.Task) (any, error) {
		return nil, errors.New("broken")
	}, alice)
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	retried, err := f.rt.Submit(parentCtx, "retry", func(context.Context, *workers.Task) (any, error) {
		calls++
		if calls < 3 {
			return nil, errors.New("flaky")
		}
		return nil, nil
	}, alice, workers.WithRetry(workers.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Microsecond}))
	if err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}), make(chan struct{})
	cancelled, err := f.rt.Submit(parentCtx, "cancel", func(ctx context.Context, _ *workers.Task) (any, error) {
		close(started)
		select {
		case <-ctx.Done():
		case <-release:
		}
		return nil, ctx.Err()
	}, alice)
	if err != nil {
		t.Fatal(err)
	}
	defer close(release)
	<-started
	if err := f.rt.Cancel(context.Background(), cancelled.ID, alice); err != nil {
		t.Fatal(err)
	}
	parent.End()
	for _, s := range []workers.Submission{ok, failed, retried, cancelled} {
		f.wait(t, s.ID)
	}

	want := map[string]struct {
		status, cause, attempt string
		code                   codes.Code
	}{
		ok.RunID:        {"completed", "completed", "1", codes.Unset},
		failed.RunID:    {"failed", "failed", "1", codes.Error},
		retried.RunID:   {"completed", "completed", "3", codes.Unset},
		cancelled.RunID: {"cancelled", "cancelled", "1", codes.Unset},
	}
	for runID, w := range want {
		s := f.span(t, runID)
		if s.Name() != "workers.run" {
			t.Errorf("span name %q", s.Name())
		}
		if s.Parent().SpanID() != parent.SpanContext().SpanID() || s.SpanContext().TraceID() != parent.SpanContext().TraceID() {
			t.Errorf("run %s: span is not a child of the submitter's span", runID)
		}
		a := s.Attributes()
		if got := attrOf(a, "workers.task.status"); got != w.status {
			t.Errorf("run %s: status %q, want %q", runID, got, w.status)
		}
		if got := attrOf(a, "workers.task.cause"); got != w.cause {
			t.Errorf("run %s: cause %q, want %q", runID, got, w.cause)
		}
		if got := attrOf(a, "workers.task.attempt"); got != w.attempt {
			t.Errorf("run %s: attempt %q, want %q", runID, got, w.attempt)
		}
		if got := attrOf(a, "workers.queue"); got != "default" {
			t.Errorf("run %s: queue %q", runID, got)
		}
		if attrOf(a, "workers.task.id") != "" || attrOf(a, "workers.task.owner") != "" {
			t.Errorf("run %s: user ids recorded without WithTaskIDs", runID)
		}
		if s.Status().Code != w.code {
			t.Errorf("run %s: span status %v, want %v", runID, s.Status().Code, w.code)
		}
	}
	retries := 0
	for _, ev := range f.span(t, retried.RunID).Events() {
		if ev.Name == "retry" {
			retries++
		}
	}
	if retries != 2 {
		t.Errorf("retried run: %d retry events, want 2", retries)
	}
	<-childSeen
	for _, s := range f.spans.Ended() {
		if s.Name() == "inside" && s.Parent().SpanID() != f.span(t, ok.RunID).SpanContext().SpanID() {
			t.Error("a span started by the callback is not a child of the run's span")
		}
	}

	var rm metricdata.ResourceMetrics
	if err := f.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	sums := map[string]int64{}
	hist := map[string]uint64{}
	finished := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					sums[m.Name] += p.Value
					if m.Name == "workers.tasks.finished" {
						st, _ := p.Attributes.Value("workers.task.status")
						finished[st.AsString()] += p.Value
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					hist[m.Name] += p.Count
				}
			}
		}
	}
	for name, v := range map[string]int64{
		"workers.tasks.submitted": 4, "workers.tasks.started": 4, "workers.tasks.finished": 4,
		"workers.tasks.running": 0, "workers.tasks.waiting": 0,
	} {
		if sums[name] != v {
			t.Errorf("%s = %d, want %d", name, sums[name], v)
		}
	}
	if finished["completed"] != 2 || finished["failed"] != 1 || finished["cancelled"] != 1 {
		t.Errorf("finished by status: %v", finished)
	}
	if hist["workers.task.duration"] != 4 || hist["workers.task.queue_wait"] != 4 {
		t.Errorf("histogram counts: %v", hist)
	}
}

func TestGaugesWhileRunning(t *testing.T) {
	f := setup(t)
	started, release := make(chan struct{}), make(chan struct{})
	sub, err := f.rt.Submit(context.Background(), "slow", func(context.Context, *workers.Task) (any, error) {
		close(started)
		<-release
		return nil, nil
	}, workers.MustOwner("alice"))
	if err != nil {
		t.Fatal(err)
	}
	<-started
	// The started event is observed before the callback is called.
	var rm metricdata.ResourceMetrics
	if err := f.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if d, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, p := range d.DataPoints {
					got[m.Name] += p.Value
				}
			}
		}
	}
	close(release)
	f.wait(t, sub.ID)
	if got["workers.tasks.running"] != 1 || got["workers.tasks.waiting"] != 0 {
		t.Errorf("while running: running=%d waiting=%d", got["workers.tasks.running"], got["workers.tasks.waiting"])
	}
}

func TestTaskIDsAreOptIn(t *testing.T) {
	f := setup(t, workersotel.WithTaskIDs())
	sub, err := f.rt.Submit(context.Background(), "k", func(context.Context, *workers.Task) (any, error) { return nil, nil }, workers.MustOwner("alice"))
	if err != nil {
		t.Fatal(err)
	}
	f.wait(t, sub.ID)
	s := f.span(t, sub.RunID)
	if attrOf(s.Attributes(), "workers.task.id") != sub.ID || attrOf(s.Attributes(), "workers.task.owner") != "alice" {
		t.Errorf("attributes %v", s.Attributes())
	}
}
