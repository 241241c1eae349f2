package workersotel_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/workersotel"
)

// BenchmarkSubmitToCompletion measures the root package's hot path
// (submit, run, terminal record on MemStore) without hooks and with this
// package's observer and middleware recording to the SDK (spans to an
// in-memory recorder, metrics to a manual reader), in one run.
func BenchmarkSubmitToCompletion(b *testing.B) {
	b.Run("NoHooks", func(b *testing.B) { benchSubmit(b, workers.Config{}) })
	b.Run("OTel", func(b *testing.B) {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		defer tp.Shutdown(context.Background())
		defer mp.Shutdown(context.Background())
		inst, err := workersotel.New(workersotel.WithTracerProvider(tp), workersotel.WithMeterProvider(mp))
		if err != nil {
			b.Fatal(err)
		}
		benchSubmit(b, workers.Config{Middleware: []workers.Middleware{inst.Middleware()}, Observers: []workers.Observer{inst.Observer()}})
	})
}

func benchSubmit(b *testing.B, cfg workers.Config) {
	rt := workers.NewRuntime(workers.NewMemStore(), cfg)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := rt.Shutdown(ctx); err != nil {
			b.Error(err)
		}
	}()
	alice := workers.MustOwner("alice")
	var wg sync.WaitGroup
	fn := func(context.Context, *workers.Task) (any, error) { wg.Done(); return nil, nil }
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		wg.Add(1)
		if _, err := rt.Submit(context.Background(), strconv.Itoa(i), fn, alice); err != nil {
			b.Fatal(err)
		}
	}
	wg.Wait()
}
