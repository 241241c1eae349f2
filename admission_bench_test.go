package workers

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
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

// BenchmarkAdmissionOwnersAtCap is one owner's run starting and settling
// while owners others are each at their running cap with a task waiting:
// tenants whose long tasks fill their caps, beside one whose short tasks
// come and go. Freeing a slot must not look at every owner that cannot
// take it.
func BenchmarkAdmissionOwnersAtCap(b *testing.B) {
	for _, owners := range []int{10, 1000, 100000} {
		b.Run(fmt.Sprintf("owners=%d", owners), func(b *testing.B) {
			a := newAdmission(Limits{Owner: OwnerLimits{Running: 1}}, func(*Task) {})
			for i := range owners {
				c := caller{userID: "o" + strconv.Itoa(i)}
				if _, err := a.reserve(ctx, c, false); err != nil { // runs
					b.Fatal(err)
				}
				r, err := a.reserve(ctx, c, false) // waits for it
				if err != nil || !r.waits {
					b.Fatal("the owner's second task should wait", err)
				}
				r.t = &Task{}
				require.True(b, a.enqueue(r))
			}
			hot := caller{userID: "hot"}
			b.ReportAllocs()
			for b.Loop() {
				r, err := a.reserve(ctx, hot, false)
				if err != nil || r.slot != slotRunning {
					b.Fatal("the hot owner's task should start at once", err)
				}
				a.release(r)
			}
		})
	}
}

// BenchmarkAdmissionWithdraw is the cancel of one waiting task of an
// owner that has many waiting (a cancel storm), with a new one submitted
// for each, so that the owner's backlog stays the same size.
func BenchmarkAdmissionWithdraw(b *testing.B) {
	for _, backlog := range []int{10, 1000, 100000} {
		b.Run(fmt.Sprintf("waiting=%d", backlog), func(b *testing.B) {
			a := newAdmission(Limits{MaxRunning: 1}, func(*Task) {})
			c := caller{userID: "alice"}
			if _, err := a.reserve(ctx, c, false); err != nil { // holds the one slot
				b.Fatal(err)
			}
			wait := func() *admit {
				r, err := a.reserve(ctx, c, false)
				if err != nil || !r.waits {
					b.Fatal("the task should wait", err)
				}
				r.t = &Task{}
				require.True(b, a.enqueue(r))
				return r
			}
			for range backlog - 1 {
				wait()
			}
			newest := wait()
			b.ReportAllocs()
			for b.Loop() {
				// Cancel the newest: the whole backlog lies before it.
				if !a.cancelWaiting(newest) {
					b.Fatal("the task was not waiting")
				}
				newest = wait()
			}
		})
	}
}
