package workers

import (
	"context"
	"strconv"
	"sync"
	"testing"
)

// BenchmarkSubmitToCompletion measures the hot path on MemStore: submit,
// run on its own goroutine, terminal record.
func BenchmarkSubmitToCompletion(b *testing.B) {
	rt := memRuntime(b)
	var wg sync.WaitGroup
	fn := func(context.Context, *Task) (any, error) { wg.Done(); return nil, nil }
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		wg.Add(1)
		if _, err := rt.Submit(ctx, strconv.Itoa(i), fn, alice); err != nil {
			b.Fatal(err)
		}
	}
	wg.Wait()
}

// BenchmarkSubmitSequential measures the queue path: submit and hand over
// to the queue's processor.
func BenchmarkSubmitSequential(b *testing.B) {
	rt := memRuntime(b)
	var wg sync.WaitGroup
	fn := func(context.Context, *Task) (any, error) { wg.Done(); return nil, nil }
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		wg.Add(1)
		if _, err := rt.SubmitSequential(ctx, "q", strconv.Itoa(i), fn, alice); err != nil {
			b.Fatal(err)
		}
	}
	wg.Wait()
}

// BenchmarkStatus measures a status read of a finished task.
func BenchmarkStatus(b *testing.B) {
	rt := memRuntime(b)
	sub, err := rt.Submit(ctx, "k", noop, alice)
	if err != nil {
		b.Fatal(err)
	}
	settled(b, rt, sub.ID)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := rt.Status(ctx, sub.ID, alice); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSubmitLatency measures one task at a time: submit, then wait
// for its callback to run.
func BenchmarkSubmitLatency(b *testing.B) {
	rt := memRuntime(b)
	ran := make(chan struct{})
	fn := func(context.Context, *Task) (any, error) { ran <- struct{}{}; return nil, nil }
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := rt.Submit(ctx, strconv.Itoa(i), fn, alice); err != nil {
			b.Fatal(err)
		}
		<-ran
	}
}
