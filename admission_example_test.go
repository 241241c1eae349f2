package workers_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/taskgate/workers"
)

// With limits, an owner's tasks past its running cap wait as PENDING
// records, and a submission past its waiting cap is refused before
// anything is written; an HTTP service answers that with 429 and a
// Retry-After of RetryAfter.
func ExampleLimits() {
	ctx := context.Background()
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{
		Limits: workers.Limits{
			MaxRunning: 8,
			Owner:      workers.OwnerLimits{Running: 1, Waiting: 1},
		},
	})
	defer rt.Shutdown(ctx)

	alice := workers.MustOwner("alice")
	release := make(chan struct{})
	slow := func(ctx context.Context, _ *workers.Task) (any, error) {
		<-release
		return "done", nil
	}
	first, _ := rt.Submit(ctx, "first", slow, alice)
	second, _ := rt.Submit(ctx, "second", slow, alice)
	_, err := rt.Submit(ctx, "third", slow, alice)

	var qe *workers.QuotaError
	if errors.As(err, &qe) {
		fmt.Println("refused:", qe.Limit, qe.Max, qe.RetryAfter() > 0)
	}
	waiting, _ := rt.Status(ctx, second.ID, alice)
	fmt.Println("second:", waiting.Status)

	close(release)
	for _, id := range []string{first.ID, second.ID} {
		snap, _ := rt.Wait(ctx, id, alice)
		fmt.Println(id, snap.Status)
	}
	// Output:
	// refused: owner waiting 1 true
	// second: pending
	// alice::first completed
	// alice::second completed
}
