package workers

import (
	"context"
	"strconv"
	"sync"
	"testing"
)

// BenchmarkSubmitAdmitted is BenchmarkSubmitToCompletion with Limits set
// but never reached: what the admission check costs a submission that
// starts at once. Compare it with BenchmarkSubmitToCompletion in the same
// run.
func BenchmarkSubmitAdmitted(b *testing.B) {
	benchLimited(b, Limits{MaxRunning: 1 << 20, Owner: OwnerLimits{Running: 1 << 20, Waiting: 1 << 20}})
}

// BenchmarkSubmitSaturated submits past a runtime cap of 8, so that most
// tasks wait and start as slots free: the cost of waiting and fair
// dispatch.
func BenchmarkSubmitSaturated(b *testing.B) {
	benchLimited(b, Limits{MaxRunning: 8})
}

func benchLimited(b *testing.B, l Limits) {
	rt := newRuntime(b, NewMemStore(), Config{Limits: l})
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

// BenchmarkAdmissionCheck is the admission work a submission that starts
// at once adds, alone: reserving a slot and giving it back when the run
// settles, with per-owner limits set.
func BenchmarkAdmissionCheck(b *testing.B) {
	a := newAdmission(Limits{MaxRunning: 1 << 20, Owner: OwnerLimits{Running: 1 << 20, Waiting: 1 << 20}}, nil)
	c := caller{userID: "alice"}
	b.ReportAllocs()
	for b.Loop() {
		r, err := a.reserve(ctx, c, false)
		if err != nil {
			b.Fatal(err)
		}
		a.release(r)
	}
}
