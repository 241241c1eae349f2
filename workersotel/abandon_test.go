package workersotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/storetest"
	"github.com/taskgate/workers/workersotel"
)

// A run abandoned because its runtime lost its lease, whose callback
// answers the cancel with ctx.Err() as callbacks do: the package doc says
// a FAILED run's span status is described "for a run that failed with no
// error of its callback's (a timeout, an abandon), by its cause", and that
// only "the error a callback made its run FAILED with" is an exception.
// The callback's "context canceled" did not make the run FAILED; its
// abandonment did.
func TestAnAbandonedRunIsDescribedByItsCause(t *testing.T) {
	spans, reader := tracetest.NewSpanRecorder(), sdkmetric.NewManualReader()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	inst, err := workersotel.New(workersotel.WithTracerProvider(tp), workersotel.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	faults := &storetest.Faults{}
	rt := workers.NewRuntime(storetest.Faulty(workers.NewMemStore(), faults), workers.Config{
		LeaseInterval: 10 * time.Millisecond, LeaseTTL: 50 * time.Millisecond,
		Observers: []workers.Observer{inst.Observer()},
	})
	defer func() {
		faults.Heal()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = rt.Shutdown(ctx)
		_ = tp.Shutdown(ctx)
		_ = mp.Shutdown(ctx)
	}()
	started, cancelled := make(chan struct{}), make(chan error, 1)
	sub, err := rt.Submit(context.Background(), "k", func(ctx context.Context, _ *workers.Task) (any, error) {
		close(started)
		<-ctx.Done()
		cancelled <- context.Cause(ctx)
		return nil, ctx.Err()
	}, workers.MustOwner("alice"))
	if err != nil {
		t.Fatal(err)
	}
	<-started
	faults.Add(storetest.Rule{Op: storetest.OpRenewLease, Fault: storetest.FailBefore})
	select {
	case cause := <-cancelled:
		if !errors.Is(cause, workers.ErrAbandoned) {
			t.Fatalf("cause %v, want ErrAbandoned", cause)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the run was not abandoned")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	snap, err := rt.Wait(ctx, sub.ID, workers.System)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Status != workers.StatusFailed || snap.Cause != workers.CauseAbandoned {
		t.Fatalf("record %s/%s, want failed/abandoned", snap.Status, snap.Cause)
	}
	f := &fixture{spans: spans}
	sp := f.span(t, sub.RunID)
	if sp.Status().Code != codes.Error {
		t.Errorf("span status %v, want Error", sp.Status().Code)
	}
	if sp.Status().Description != string(workers.CauseAbandoned) {
		t.Errorf("span status described %q, want the cause %q", sp.Status().Description, workers.CauseAbandoned)
	}
	if n := events(sp, "exception"); n != 0 {
		t.Errorf("%d exception events for a run its abandonment failed, want 0", n)
	}
}
