package workersotel_test

import (
	"context"
	"fmt"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/workersotel"
)

func Example() {
	spans := tracetest.NewSpanRecorder() // in production: an OTLP exporter
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())

	inst, err := workersotel.New(workersotel.WithTracerProvider(tp))
	if err != nil {
		panic(err)
	}
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{
		Middleware: []workers.Middleware{inst.Middleware()},
		Observers:  []workers.Observer{inst.Observer()},
	})
	defer rt.Shutdown(context.Background())

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sub, err := rt.Submit(ctx, "report", func(context.Context, *workers.Task) (any, error) {
		return "done", nil
	}, workers.MustOwner("alice"))
	if err != nil {
		panic(err)
	}
	snap, err := rt.Wait(ctx, sub.ID, workers.System)
	if err != nil {
		panic(err)
	}
	// The span ends just after the record, when the observer has run.
	for deadline := time.Now().Add(5 * time.Second); len(spans.Ended()) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			panic("the run's span never ended")
		}
	}
	s := spans.Ended()[0]
	fmt.Println(snap.Status, s.Name())
	// Output: completed workers.run
}
