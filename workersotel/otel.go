// Package workersotel traces and measures the runs of a workers.Runtime
// with OpenTelemetry. It is built on the runtime's two hooks: an Observer,
// which sees every run's lifecycle, and a Middleware, which puts the run's
// span into the context each attempt's callback receives.
//
//	inst, err := workersotel.New() // the global providers, or WithTracerProvider / WithMeterProvider
//	if err != nil { ... }
//	rt := workers.NewRuntime(store, workers.Config{
//		Middleware: []workers.Middleware{inst.Middleware()},
//		Observers:  []workers.Observer{inst.Observer()},
//	})
//
// # Traces
//
// Each run submitted through the runtime gets one span, "workers.run",
// from its submission to its terminal record. It is a child of the span
// in the context passed to Submit (the run's context keeps the
// submission's values), so a task shows up under the request that
// submitted it even though it outlives it. Starts and retries are span
// events; a panic, and the error a callback made its run FAILED with,
// are recorded as exceptions (events named "exception", a panic's with
// its stack; a run that panicked on its last attempt has the one), and a
// FAILED run sets the span's status to Error, described by its error or,
// for a run that failed with no error of its callback's (a timeout, an
// abandon), by its cause. The callback's ctx carries
// the span, so spans it starts are its children.
//
// Attributes: workers.queue (the queue's name, "default" for the async
// path), workers.run.id, workers.task.status, workers.task.cause and
// workers.task.attempt. Task ids hold user ids ("alice::report"), so
// neither the task id nor its owner is recorded unless WithTaskIDs asks
// for them.
//
// # Metrics
//
// Metrics say "by queue" with the attribute workers.queue, whose value is
// "default" for the async path and "sequential" for every sequential
// queue, unless WithQueueLabel names them: queues are often made per
// tenant or per entity, and a name per queue would grow every metric by
// a series per queue ever used.
//
//   - workers.tasks.submitted, workers.tasks.started: counters, by queue.
//   - workers.tasks.finished: counter, by queue, status and cause.
//   - workers.task.duration: histogram (seconds) of a run from its start
//     to its end, by queue and status.
//   - workers.task.queue_wait: histogram (seconds) from submission to
//     start, by queue.
//   - workers.tasks.running, workers.tasks.waiting: up-down counters of
//     this runtime's runs started and not yet ended, and waiting to
//     start, by queue. A run ends when its terminal record lands: a
//     callback that outlives its run's end (one that ignores the
//     cancellation of a timeout, say) is no longer counted, though it
//     may still hold a slot under workers.Limits (see Runtime.Stats).
//
// Both histograms have the bucket boundaries of DurationBuckets: from
// 5 ms to an hour, where the SDK's default boundaries, made for
// milliseconds, would put every run under 5 s in one bucket.
//
// A run's measurements are made in a context carrying its span, so the
// exemplars the SDK keeps of them (by default, of those made in a
// sampled span) are of the run's span, whether or not its submitter had
// one.
//
// Each run is measured by the runtime that executes it, so that the sum
// over the replicas of a store counts each run once. A run another
// process executes is counted there, even when this runtime cancels it;
// one whose process ended is counted, under workers.tasks.finished and
// workers.task.duration, by the runtime that recovers it. A run recovered
// while its process still executed it (that process lost its lease to a
// partition or a long pause, and did not crash) is counted by both.
package workersotel

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/taskgate/workers"
)

// ScopeName is the instrumentation scope of the tracer and the meter.
const ScopeName = "github.com/taskgate/workers/workersotel"

// DurationBuckets are the bucket boundaries, in seconds, of the
// workers.task.duration and workers.task.queue_wait histograms:
// OpenTelemetry's advice for durations in seconds (5 ms to 10 s), then
// on to an hour, since a task may run that long. A View may set others.
var DurationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 30, 60, 300, 900, 3600}

// Option configures New.
type Option func(*config)

type config struct {
	tp      trace.TracerProvider
	mp      metric.MeterProvider
	withIDs bool
	label   func(queue string) string
}

// WithTracerProvider sets the tracer provider. Defaults to
// otel.GetTracerProvider().
func WithTracerProvider(tp trace.TracerProvider) Option { return func(c *config) { c.tp = tp } }

// WithMeterProvider sets the meter provider. Defaults to
// otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option { return func(c *config) { c.mp = mp } }

// WithTaskIDs adds the task id (workers.task.id) and, for a user-scoped
// task, its owner's user id (workers.task.owner) to each span. They are
// left out by default because they identify users; never add them to
// metrics, whose cardinality they would explode.
func WithTaskIDs() Option { return func(c *config) { c.withIDs = true } }

// WithQueueLabel sets the value of the workers.queue attribute of the
// metrics: label is called with a sequential queue's name, or with "" for
// the async path, and should map the queues to a small fixed set of
// values, such as the name of each queue of a fixed list and "other" for
// the rest. Without it, metrics say "default" for the async path and
// "sequential" for every sequential queue, one named "default" included.
// Spans carry the queue's name either way ("default" for the async path).
func WithQueueLabel(label func(queue string) string) Option {
	return func(c *config) { c.label = label }
}

// queueKind is the default queue label of the metrics.
func queueKind(queue string) string {
	if queue == "" {
		return workers.DefaultQueue
	}
	return "sequential"
}

// Instrumentation holds the tracer, the instruments and the spans of the
// runs in flight. Build one with New and give its Observer and Middleware
// to one Runtime's Config.
type Instrumentation struct {
	tracer  trace.Tracer
	withIDs bool
	label   func(queue string) string

	submitted, started, finished metric.Int64Counter
	duration, wait               metric.Float64Histogram
	running, waiting             metric.Int64UpDownCounter

	mu   sync.Mutex
	runs map[string]*run // guarded by mu: run id -> its span and gauges
}

// run is what the instrumentation keeps for a run between its submission
// and its end.
type run struct {
	span     trace.Span
	waiting  bool // counted in workers.tasks.waiting
	running  bool // counted in workers.tasks.running
	panicked int  // the last attempt whose panic was recorded as an exception
}

// withSpan returns ctx carrying the run's span, for the measurements of
// the run to have exemplars of it; ctx itself if r is nil (another
// process's run).
func (r *run) withSpan(ctx context.Context) context.Context {
	if r == nil {
		return ctx
	}
	return trace.ContextWithSpan(ctx, r.span)
}

// New returns an Instrumentation, or the error of creating an instrument.
func New(opts ...Option) (*Instrumentation, error) {
	var c config
	for _, o := range opts {
		if o != nil { // as the runtime's options: a nil one sets nothing
			o(&c)
		}
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	if c.label == nil {
		c.label = queueKind
	}
	m := c.mp.Meter(ScopeName)
	i := &Instrumentation{tracer: c.tp.Tracer(ScopeName), withIDs: c.withIDs, label: c.label, runs: make(map[string]*run)}
	var err error
	mk := func(f func() error) {
		if err == nil {
			err = f()
		}
	}
	mk(func() (e error) {
		i.submitted, e = m.Int64Counter("workers.tasks.submitted", metric.WithDescription("Runs submitted."), metric.WithUnit("{run}"))
		return
	})
	mk(func() (e error) {
		i.started, e = m.Int64Counter("workers.tasks.started", metric.WithDescription("Runs started."), metric.WithUnit("{run}"))
		return
	})
	mk(func() (e error) {
		i.finished, e = m.Int64Counter("workers.tasks.finished", metric.WithDescription("Runs ended, by status and cause."), metric.WithUnit("{run}"))
		return
	})
	mk(func() (e error) {
		i.duration, e = m.Float64Histogram("workers.task.duration", metric.WithDescription("Time from a run's start to its end."), metric.WithUnit("s"),
			metric.WithExplicitBucketBoundaries(DurationBuckets...))
		return
	})
	mk(func() (e error) {
		i.wait, e = m.Float64Histogram("workers.task.queue_wait", metric.WithDescription("Time from a run's submission to its start."), metric.WithUnit("s"),
			metric.WithExplicitBucketBoundaries(DurationBuckets...))
		return
	})
	mk(func() (e error) {
		i.running, e = m.Int64UpDownCounter("workers.tasks.running", metric.WithDescription("Runs started and not yet ended."), metric.WithUnit("{run}"))
		return
	})
	mk(func() (e error) {
		i.waiting, e = m.Int64UpDownCounter("workers.tasks.waiting", metric.WithDescription("Runs waiting to start."), metric.WithUnit("{run}"))
		return
	})
	if err != nil {
		return nil, err
	}
	return i, nil
}

// Observer returns the observer that records spans and metrics. Put it in
// Config.Observers.
func (i *Instrumentation) Observer() workers.Observer { return workers.ObserverFunc(i.observe) }

// Middleware returns the middleware that hands each attempt's callback a
// context carrying its run's span. Put it in Config.Middleware; without
// it, spans the callback starts are children of the submitter's span
// instead.
func (i *Instrumentation) Middleware() workers.Middleware {
	return func(next workers.Func) workers.Func {
		return func(ctx context.Context, t *workers.Task) (any, error) {
			i.mu.Lock()
			r := i.runs[t.RunID()]
			i.mu.Unlock()
			return next(r.withSpan(ctx), t)
		}
	}
}

// queueOf returns the name of e's queue, workers.DefaultQueue for the
// async path.
func queueOf(e *workers.Event) string {
	if e.Queue == "" {
		return workers.DefaultQueue
	}
	return e.Queue
}

func (i *Instrumentation) observe(ctx context.Context, e workers.Event) {
	name := queueOf(&e)
	q := attribute.String("workers.queue", i.label(e.Queue))
	qset := metric.WithAttributes(q)
	switch e.Kind {
	case workers.EventSubmitted:
		attrs := []attribute.KeyValue{attribute.String("workers.queue", name), attribute.String("workers.run.id", e.RunID)}
		if i.withIDs {
			attrs = append(attrs, attribute.String("workers.task.id", e.TaskID))
			if o, ok := workers.OwnerOf(e.TaskID); ok {
				attrs = append(attrs, attribute.String("workers.task.owner", o.ID()))
			}
		}
		ctx, span := i.tracer.Start(ctx, "workers.run", trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithTimestamp(e.CreatedAt), trace.WithAttributes(attrs...))
		i.mu.Lock()
		i.runs[e.RunID] = &run{span: span, waiting: true}
		i.mu.Unlock()
		i.submitted.Add(ctx, 1, qset)
		i.waiting.Add(ctx, 1, qset)

	case workers.EventStarted:
		i.mu.Lock()
		r := i.runs[e.RunID]
		if r != nil {
			r.waiting, r.running = false, true
		}
		i.mu.Unlock()
		ctx = r.withSpan(ctx)
		i.started.Add(ctx, 1, qset)
		if !e.CreatedAt.IsZero() {
			i.wait.Record(ctx, e.StartedAt.Sub(e.CreatedAt).Seconds(), qset)
		}
		if r != nil {
			i.waiting.Add(ctx, -1, qset)
			i.running.Add(ctx, 1, qset)
			r.span.AddEvent("started", trace.WithTimestamp(e.StartedAt))
			r.span.SetAttributes(attribute.Int("workers.task.attempt", e.Attempt))
		}

	case workers.EventRetrying, workers.EventPanicked:
		i.mu.Lock()
		r := i.runs[e.RunID]
		if r != nil && e.Kind == workers.EventPanicked {
			r.panicked = e.Attempt
		}
		i.mu.Unlock()
		if r != nil {
			attrs := []attribute.KeyValue{attribute.Int("workers.task.attempt", e.Attempt)}
			if e.Err != nil {
				attrs = append(attrs, attribute.String("exception.message", safeError(e.Err).Error()))
			}
			if e.Kind == workers.EventPanicked {
				// OpenTelemetry's form for an exception: an event named
				// "exception", with the panic's own stack.
				attrs = append(attrs, attribute.String("exception.type", "panic"),
					attribute.String("exception.stacktrace", string(e.Stack)))
				r.span.AddEvent("exception", trace.WithAttributes(attrs...))
			} else {
				r.span.AddEvent("retry", trace.WithAttributes(attrs...))
				r.span.SetAttributes(attribute.Int("workers.task.attempt", e.Attempt))
			}
		}

	case workers.EventFinished, workers.EventRecovered:
		i.mu.Lock()
		r := i.runs[e.RunID]
		delete(i.runs, e.RunID)
		i.mu.Unlock()
		if e.Kind == workers.EventFinished && e.Task == nil && r == nil {
			// Another process's run, which that process measures. (A run
			// of this runtime's whose handle Runtime.Reset forgot is
			// reported without its Task too: its span is here.)
			return
		}
		ctx = r.withSpan(ctx)
		status := attribute.String("workers.task.status", string(e.Status))
		cause := attribute.String("workers.task.cause", string(e.Cause))
		i.finished.Add(ctx, 1, metric.WithAttributes(q, status, cause))
		// A run opened here is timed once its start was reported here: one
		// cancelled between its registration and its start never ran.
		// Another process's run is timed when its record says it started.
		if r == nil && !e.StartedAt.IsZero() || r != nil && r.running {
			i.duration.Record(ctx, e.Duration.Seconds(), metric.WithAttributes(q, status))
		}
		if r == nil {
			return
		}
		if r.waiting {
			i.waiting.Add(ctx, -1, qset)
		}
		if r.running {
			i.running.Add(ctx, -1, qset)
		}
		r.span.SetAttributes(status, cause, attribute.Int("workers.task.attempt", e.Attempt))
		if e.Status == workers.StatusFailed {
			msg := string(e.Cause)
			// The callback's error describes the run only when it is
			// what failed it: an abandoned or timed-out run whose
			// callback answered its cancel with ctx.Err() failed by
			// its cause.
			if e.Err != nil && e.Cause != workers.CauseAbandoned && e.Cause != workers.CauseTimeout {
				err := safeError(e.Err)
				msg = err.Error()
				// A panic of the callback's was recorded as it
				// happened, with its stack; one in encoding its result
				// was not.
				if e.Cause != workers.CausePanicked || r.panicked != e.Attempt {
					r.span.RecordError(err)
				}
			}
			r.span.SetStatus(codes.Error, msg)
		}
		end := e.CompletedAt
		if end.IsZero() {
			r.span.End()
			return
		}
		r.span.End(trace.WithTimestamp(end))
	}
}

// safeError returns err, or, if its Error method panics (a nil pointer of a
// type whose method reads it, say), the *workers.PanicError of that panic,
// whose text is what the run's record holds: the run still has its span
// ended and its events recorded.
func safeError(err error) (safe error) {
	defer func() {
		if r := recover(); r != nil {
			safe = &workers.PanicError{Value: r}
		}
	}()
	_ = err.Error()
	return err
}
