package workersotel_test

import (
	"context"
	"errors"
	"maps"
	"slices"
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
	inst   *workersotel.Instrumentation
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	tp     *sdktrace.TracerProvider
}

// setup instruments a runtime over a new MemStore.
func setup(t *testing.T, opts ...workersotel.Option) *fixture {
	t.Helper()
	return setupOver(t, workers.NewMemStore(), func(inst *workersotel.Instrumentation) workers.Config {
		return workers.Config{
			Middleware: []workers.Middleware{inst.Middleware()},
			Observers:  []workers.Observer{inst.Observer()},
		}
	}, opts...)
}

// setupOver instruments a runtime over s, configured by config.
func setupOver(t *testing.T, s *workers.MemStore, config func(*workersotel.Instrumentation) workers.Config, opts ...workersotel.Option) *fixture {
	t.Helper()
	f := &fixture{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	f.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(f.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(f.reader))
	inst, err := workersotel.New(append(opts, workersotel.WithTracerProvider(f.tp), workersotel.WithMeterProvider(mp))...)
	if err != nil {
		t.Fatal(err)
	}
	f.inst = inst
	f.rt = workers.NewRuntime(s, config(inst))
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

// metrics collects the sums (counters, up-down counters) and the
// histograms' counts, by name; workers.tasks.finished is also summed by
// status, as "workers.tasks.finished/<status>".
func (f *fixture) metrics(t *testing.T) (sums map[string]int64, counts map[string]uint64) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := f.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	sums, counts = map[string]int64{}, map[string]uint64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					sums[m.Name] += p.Value
					if st, ok := p.Attributes.Value("workers.task.status"); ok && m.Name == "workers.tasks.finished" {
						sums[m.Name+"/"+st.AsString()] += p.Value
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					counts[m.Name] += p.Count
				}
			}
		}
	}
	return sums, counts
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
	if retries := events(f.span(t, retried.RunID), "retry"); retries != 2 {
		t.Errorf("retried run: %d retry events, want 2", retries)
	}
	<-childSeen
	for _, s := range f.spans.Ended() {
		if s.Name() == "inside" && s.Parent().SpanID() != f.span(t, ok.RunID).SpanContext().SpanID() {
			t.Error("a span started by the callback is not a child of the run's span")
		}
	}

	sums, hist := f.metrics(t)
	for name, v := range map[string]int64{
		"workers.tasks.submitted": 4, "workers.tasks.started": 4, "workers.tasks.finished": 4,
		"workers.tasks.running": 0, "workers.tasks.waiting": 0,
	} {
		if sums[name] != v {
			t.Errorf("%s = %d, want %d", name, sums[name], v)
		}
	}
	if sums["workers.tasks.finished/completed"] != 2 || sums["workers.tasks.finished/failed"] != 1 || sums["workers.tasks.finished/cancelled"] != 1 {
		t.Errorf("finished by status: %v", sums)
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
	got, _ := f.metrics(t)
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

// A panic and the error a run failed with are recorded as OpenTelemetry
// exceptions: events named "exception", the panic's with its stack.
func TestPanicsAndFailuresAreExceptions(t *testing.T) {
	f := setup(t)
	calls := 0
	sub, err := f.rt.Submit(context.Background(), "k", func(context.Context, *workers.Task) (any, error) {
		if calls++; calls == 1 {
			panic("first attempt")
		}
		return nil, errors.New("broken")
	}, workers.MustOwner("alice"), workers.WithRetry(workers.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Microsecond}))
	if err != nil {
		t.Fatal(err)
	}
	f.wait(t, sub.ID)
	var panics, failures int
	for _, ev := range f.span(t, sub.RunID).Events() {
		if ev.Name != "exception" {
			continue
		}
		switch msg := attrOf(ev.Attributes, "exception.message"); {
		case attrOf(ev.Attributes, "exception.type") == "panic" && attrOf(ev.Attributes, "exception.stacktrace") != "":
			panics++
		case msg == "broken":
			failures++
		default:
			t.Errorf("exception event %v", ev.Attributes)
		}
	}
	if panics != 1 || failures != 1 {
		t.Errorf("%d panic and %d failure exceptions, want 1 and 1", panics, failures)
	}
}

// A panic on the last attempt is one exception, the panic's with its
// stack, not a second one for the run's FAILED end that the panic is.
func TestAPanicOnTheLastAttemptIsOneException(t *testing.T) {
	f := setup(t)
	sub, err := f.rt.Submit(context.Background(), "k", func(context.Context, *workers.Task) (any, error) {
		panic("boom")
	}, workers.MustOwner("alice"))
	if err != nil {
		t.Fatal(err)
	}
	f.wait(t, sub.ID)
	sp := f.span(t, sub.RunID)
	var types []string
	for _, ev := range sp.Events() {
		if ev.Name == "exception" {
			types = append(types, attrOf(ev.Attributes, "exception.type"))
		}
	}
	if len(types) != 1 || types[0] != "panic" {
		t.Errorf("exception events of types %q, want one, the panic's", types)
	}
	if sp.Status().Code != codes.Error {
		t.Errorf("span status %v, want Error", sp.Status().Code)
	}
}

// events counts the span's events named name.
func events(sp sdktrace.ReadOnlySpan, name string) int {
	n := 0
	for _, ev := range sp.Events() {
		if ev.Name == name {
			n++
		}
	}
	return n
}

// panicsOnMarshal is a result whose encoding panics.
type panicsOnMarshal struct{}

func (panicsOnMarshal) MarshalJSON() ([]byte, error) { panic("marshal boom") }

// A run whose result's encoding panics is FAILED as panicked, with no
// panic event before its end: its end is the one exception.
func TestAPanicEncodingTheResultIsOneException(t *testing.T) {
	f := setup(t)
	sub, err := f.rt.Submit(context.Background(), "k", func(context.Context, *workers.Task) (any, error) {
		return panicsOnMarshal{}, nil
	}, workers.MustOwner("alice"))
	if err != nil {
		t.Fatal(err)
	}
	if snap := f.wait(t, sub.ID); snap.Cause != workers.CausePanicked {
		t.Fatalf("cause %q, want %q", snap.Cause, workers.CausePanicked)
	}
	if n := events(f.span(t, sub.RunID), "exception"); n != 1 {
		t.Errorf("%d exception events on the span of a run FAILED as panicked in encoding its result, want 1", n)
	}
}

// The duration histograms, in seconds, have boundaries below a second:
// with the SDK's default ones, made for milliseconds, every run under
// 5 s would fall in one bucket.
func TestDurationHistogramsResolveShortRuns(t *testing.T) {
	f := setup(t)
	sub, err := f.rt.Submit(context.Background(), "k", func(context.Context, *workers.Task) (any, error) { return nil, nil }, workers.MustOwner("alice"))
	if err != nil {
		t.Fatal(err)
	}
	f.wait(t, sub.ID)
	f.span(t, sub.RunID)
	var rm metricdata.ResourceMetrics
	if err := f.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			h, ok := m.Data.(metricdata.Histogram[float64])
			if !ok {
				continue
			}
			for _, p := range h.DataPoints {
				seen[m.Name] = true
				if !slices.Equal(p.Bounds, workersotel.DurationBuckets) {
					t.Errorf("%s: bounds %v, want %v", m.Name, p.Bounds, workersotel.DurationBuckets)
				}
				// A run of a trivial callback takes well under 5 ms.
				if len(p.BucketCounts) == 0 || p.BucketCounts[0] != 1 {
					t.Errorf("%s: bucket counts %v, want the run in the first bucket, up to %v s", m.Name, p.BucketCounts, p.Bounds[0])
				}
			}
		}
	}
	if !seen["workers.task.duration"] || !seen["workers.task.queue_wait"] {
		t.Errorf("histograms seen: %v, want workers.task.duration and workers.task.queue_wait", seen)
	}
}

// A run cancelled by another replica is measured once, by the replica
// that executes it: the sum over the replicas counts it once.
func TestARunIsMeasuredByTheReplicaThatExecutesIt(t *testing.T) {
	s := workers.NewMemStore()
	config := func(inst *workersotel.Instrumentation) workers.Config {
		return workers.Config{Observers: []workers.Observer{inst.Observer()}, SyncInterval: 2 * time.Millisecond}
	}
	here, there := setupOver(t, s, config), setupOver(t, s, config)
	started := make(chan struct{})
	sub, err := here.rt.Submit(context.Background(), "k", func(ctx context.Context, _ *workers.Task) (any, error) {
		close(started)
		<-ctx.Done()
		return nil, ctx.Err()
	}, workers.MustOwner("alice"))
	if err != nil {
		t.Fatal(err)
	}
	<-started
	if err := there.rt.Cancel(context.Background(), sub.ID, workers.System); err != nil {
		t.Fatal(err)
	}
	here.span(t, sub.RunID) // ended once here learns of the cancel
	hs, hc := here.metrics(t)
	ts, tc := there.metrics(t)
	if hs["workers.tasks.finished"] != 1 || ts["workers.tasks.finished"] != 0 {
		t.Errorf("finished: %d here, %d on the replica that cancelled; want 1 and 0", hs["workers.tasks.finished"], ts["workers.tasks.finished"])
	}
	if hc["workers.task.duration"] != 1 || tc["workers.task.duration"] != 0 {
		t.Errorf("durations: %d here, %d on the replica that cancelled; want 1 and 0", hc["workers.task.duration"], tc["workers.task.duration"])
	}
}

// A run cancelled as it is submitted, by an observer that hears of the
// submission first, still has its span ended and leaves no run waiting.
func TestARunCancelledAsItIsSubmittedEndsItsSpan(t *testing.T) {
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
	sub, err := rt.Submit(context.Background(), "k", func(context.Context, *workers.Task) (any, error) { return nil, nil }, workers.MustOwner("alice"))
	if err != nil {
		t.Fatal(err)
	}
	if snap := f.wait(t, sub.ID); snap.Status != workers.StatusCancelled {
		t.Fatalf("status %s, want cancelled", snap.Status)
	}
	if got := attrOf(f.span(t, sub.RunID).Attributes(), "workers.task.status"); got != "cancelled" {
		t.Errorf("span status attribute %q, want cancelled", got)
	}
	sums, _ := f.metrics(t)
	if sums["workers.tasks.waiting"] != 0 || sums["workers.tasks.running"] != 0 || sums["workers.tasks.finished"] != 1 {
		t.Errorf("waiting %d, running %d, finished %d; want 0, 0, 1", sums["workers.tasks.waiting"], sums["workers.tasks.running"], sums["workers.tasks.finished"])
	}
}

// metricQueues returns the values of workers.queue on every metric's
// data points, each with the count of workers.tasks.submitted it has.
func (f *fixture) metricQueues(t *testing.T) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := f.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	queues := map[string]int64{}
	add := func(set attribute.Set) {
		v, _ := set.Value("workers.queue")
		queues[v.AsString()] += 0 // listed, whichever metric it is on
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					add(p.Attributes)
					if m.Name == "workers.tasks.submitted" {
						v, _ := p.Attributes.Value("workers.queue")
						queues[v.AsString()] += p.Value
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					add(p.Attributes)
				}
			}
		}
	}
	return queues
}

// Queues made per tenant add no series to the metrics: they say
// "sequential" of every sequential queue, one named "default" included,
// while each run's span names its queue. WithQueueLabel names the queues
// a service wants apart, and is given "" for the async path.
func TestMetricsDoNotGrowWithTheQueues(t *testing.T) {
	run := func(f *fixture) {
		t.Helper()
		fn := func(context.Context, *workers.Task) (any, error) { return nil, nil }
		for _, q := range []string{"emails", "tenant-1", "tenant-2", "tenant-3", workers.DefaultQueue} {
			sub, err := f.rt.SubmitSequential(context.Background(), q, "k", fn, workers.MustOwner("alice"))
			if err != nil {
				t.Fatal(err)
			}
			f.wait(t, sub.ID)
			if got := attrOf(f.span(t, sub.RunID).Attributes(), "workers.queue"); got != q {
				t.Errorf("span of a run of queue %q says workers.queue %q", q, got)
			}
		}
		sub, err := f.rt.Submit(context.Background(), "k", fn, workers.MustOwner("alice"))
		if err != nil {
			t.Fatal(err)
		}
		f.wait(t, sub.ID)
		f.span(t, sub.RunID)
	}

	f := setup(t)
	run(f)
	if got, want := f.metricQueues(t), map[string]int64{"default": 1, "sequential": 5}; !maps.Equal(got, want) {
		t.Errorf("workers.queue on metrics, with the runs submitted: %v, want %v", got, want)
	}

	f = setup(t, workersotel.WithQueueLabel(func(q string) string {
		switch q {
		case "":
			return "async"
		case "emails":
			return q
		}
		return "other"
	}))
	run(f)
	if got, want := f.metricQueues(t), map[string]int64{"async": 1, "emails": 1, "other": 4}; !maps.Equal(got, want) {
		t.Errorf("workers.queue on metrics with WithQueueLabel, with the runs submitted: %v, want %v", got, want)
	}
}

// noClearing is a MemStore seen as a durable store: Runtime.Reset keeps
// its records.
type noClearing struct{ workers.Store }

// A run whose handle Runtime.Reset forgot, then cancelled through the same
// runtime, is reported without its Task; its span, opened here, ends, and
// the gauges let go of it.
func TestARunForgottenByResetThenCancelledEndsItsSpan(t *testing.T) {
	spans, reader := tracetest.NewSpanRecorder(), sdkmetric.NewManualReader()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	inst, err := workersotel.New(workersotel.WithTracerProvider(tp), workersotel.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	rt := workers.NewRuntime(noClearing{workers.NewMemStore()}, workers.Config{Observers: []workers.Observer{inst.Observer()}})
	started, release, returned := make(chan struct{}), make(chan struct{}), make(chan struct{})
	sub, err := rt.Submit(context.Background(), "k", func(context.Context, *workers.Task) (any, error) {
		defer close(returned)
		close(started)
		<-release // ignores its context
		return nil, nil
	}, workers.MustOwner("alice"))
	if err != nil {
		t.Fatal(err)
	}
	<-started
	if err := rt.Reset(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := rt.Cancel(context.Background(), sub.ID, workers.MustOwner("alice")); err != nil {
		t.Fatal(err)
	}
	ended := false
	for _, s := range spans.Ended() {
		ended = ended || attrOf(s.Attributes(), "workers.run.id") == sub.RunID
	}
	if !ended {
		t.Error("the run's span is still open after its cancel landed")
	}
	f := &fixture{reader: reader}
	sums, _ := f.metrics(t)
	if sums["workers.tasks.running"] != 0 || sums["workers.tasks.finished"] != 1 {
		t.Errorf("running %d, finished %d; want 0 and 1", sums["workers.tasks.running"], sums["workers.tasks.finished"])
	}
	close(release)
	<-returned
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rt.Shutdown(ctx); err != nil {
		t.Error(err)
	}
	_ = tp.Shutdown(ctx)
	_ = mp.Shutdown(ctx)
}

// A nil Option sets nothing, as the runtime's options do.
func TestNewSkipsANilOption(t *testing.T) {
	if _, err := workersotel.New(nil); err != nil {
		t.Fatal(err)
	}
}
