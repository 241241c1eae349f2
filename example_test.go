package workers_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/taskgate/workers"
)

func Example() {
	ctx := context.Background()
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	defer rt.Shutdown(ctx)

	alice := workers.MustOwner("alice")
	sub, err := rt.Submit(ctx, "report-42", func(ctx context.Context, t *workers.Task) (any, error) {
		t.SetProgress(100)
		return map[string]int{"rows": 42}, nil
	}, alice)
	if err != nil {
		fmt.Println(err)
		return
	}
	snap, _ := rt.Wait(ctx, sub.ID, alice)
	rows, _ := workers.ResultAs[map[string]int](snap)
	fmt.Println(sub.ID, snap.Status, snap.Progress, rows["rows"])
	// Output: alice::report-42 completed 100 42
}

func ExampleRuntime_Submit_join() {
	ctx := context.Background()
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	defer rt.Shutdown(ctx)

	alice := workers.MustOwner("alice")
	release := make(chan struct{})
	first, _ := rt.Submit(ctx, "export", func(ctx context.Context, t *workers.Task) (any, error) {
		<-release
		return nil, nil
	}, alice)
	// The key is live: a second submission joins the same run.
	second, _ := rt.Submit(ctx, "export", func(ctx context.Context, t *workers.Task) (any, error) {
		panic("never runs")
	}, alice)
	close(release)
	fmt.Println(first.Joined, second.Joined, first.RunID == second.RunID)
	// Output: false true true
}

func ExampleRuntime_Status() {
	ctx := context.Background()
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	defer rt.Shutdown(ctx)

	alice, bob := workers.MustOwner("alice"), workers.MustOwner("bob")
	sub, _ := rt.Submit(ctx, "payroll", func(ctx context.Context, t *workers.Task) (any, error) {
		return "done", nil
	}, alice)
	rt.Wait(ctx, sub.ID, alice)

	_, err := rt.Status(ctx, sub.ID, bob)
	fmt.Println("bob:", err)
	_, err = rt.Status(ctx, "alice::no-such-task", alice)
	fmt.Println("missing:", err)
	snap, _ := rt.Status(ctx, sub.ID, workers.System)
	fmt.Println("system:", snap.Status)
	// Output:
	// bob: workers: task not found
	// missing: workers: task not found
	// system: completed
}

func ExampleRuntime_Cancel() {
	ctx := context.Background()
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	defer rt.Shutdown(ctx)

	alice := workers.MustOwner("alice")
	started := make(chan struct{})
	sub, _ := rt.Submit(ctx, "reindex", func(ctx context.Context, t *workers.Task) (any, error) {
		close(started)
		<-ctx.Done()
		return nil, context.Cause(ctx)
	}, alice)
	<-started

	if err := rt.Cancel(ctx, sub.ID, alice, workers.WithReason("wrong input file")); err != nil {
		fmt.Println(err)
	}
	snap, _ := rt.Wait(ctx, sub.ID, alice)
	fmt.Printf("%s: %s\n", snap.Status, snap.Error)
	fmt.Printf("by %s: %s\n", snap.CancelledBy, snap.CancelReason)
	fmt.Println(errors.Is(snap.Err(), workers.ErrCancelled))
	fmt.Println(rt.Cancel(ctx, sub.ID, alice))
	// Output:
	// cancelled: Cancelled by user
	// by alice: wrong input file
	// true
	// workers: task already finished
}

func ExampleRuntime_Watch() {
	ctx := context.Background()
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	defer rt.Shutdown(ctx)

	alice := workers.MustOwner("alice")
	next := make(chan struct{})
	sub, _ := rt.Submit(ctx, "import", func(ctx context.Context, t *workers.Task) (any, error) {
		for p := 25; p <= 100; p += 25 {
			<-next // one step per snapshot seen, so that none is coalesced away
			t.SetProgress(p)
		}
		<-next
		return "imported", nil
	}, alice)

	for snap, err := range rt.Watch(ctx, sub.ID, alice) {
		if err != nil {
			fmt.Println(err)
			break
		}
		if snap.Status == workers.StatusRunning || snap.Status.Terminal() {
			fmt.Println(snap.Status, snap.Progress)
		}
		if snap.Status == workers.StatusRunning {
			next <- struct{}{}
		}
	}
	// Output:
	// running 0
	// running 25
	// running 50
	// running 75
	// running 100
	// completed 100
}

// A dashboard's view of the caller's live tasks: each snapshot updates
// a row, and a task leaves the view with its end, or with a snapshot
// marked Gone when the caller may no longer see it (its key re-run
// without the caller, say). This example stops after its one task; a
// dashboard keeps ranging.
func ExampleRuntime_Subscribe() {
	ctx := context.Background()
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	defer rt.Shutdown(ctx)

	alice := workers.MustOwner("alice")
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := rt.Subscribe(sctx, alice) // subscribed from here on

	sub, _ := rt.Submit(ctx, "report", func(ctx context.Context, t *workers.Task) (any, error) {
		t.SetProgress(50)
		return "done", nil
	}, alice)

	rows := map[string]workers.Snapshot{}
	for snap, err := range events {
		if err != nil {
			fmt.Println(err)
			break
		}
		switch {
		case snap.Gone:
			delete(rows, snap.ID)
			fmt.Println(snap.ID, "is gone")
		case snap.Status.Terminal():
			delete(rows, snap.ID)
			fmt.Println(snap.ID, snap.Status)
		default:
			rows[snap.ID] = snap
		}
		if _, live := rows[sub.ID]; !live {
			break
		}
	}
	fmt.Println(len(rows), "live")
	// Output:
	// alice::report completed
	// 0 live
}

func ExampleRuntime_SubmitSequential() {
	ctx := context.Background()
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	defer rt.Shutdown(ctx)

	alice := workers.MustOwner("alice")
	var last workers.Submission
	for _, name := range []string{"first", "second", "third"} {
		last, _ = rt.SubmitSequential(ctx, "mail", name, func(ctx context.Context, t *workers.Task) (any, error) {
			fmt.Println("sending", name)
			return nil, nil
		}, alice)
	}
	rt.Wait(ctx, last.ID, alice)
	// Output:
	// sending first
	// sending second
	// sending third
}

func ExampleWithWatchers() {
	ctx := context.Background()
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	defer rt.Shutdown(ctx)

	alice, support := workers.MustOwner("alice"), workers.MustOwner("support")
	sub, _ := rt.Submit(ctx, "migration", func(ctx context.Context, t *workers.Task) (any, error) {
		return nil, nil
	}, alice, workers.WithWatchers(support))
	snap, _ := rt.Wait(ctx, sub.ID, support)
	fmt.Println(snap.Status, snap.WatcherCount)
	// Output: completed 2
}

func ExampleRuntime_Shutdown() {
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	alice := workers.MustOwner("alice")
	started := make(chan struct{})
	sub, _ := rt.Submit(context.Background(), "long", func(ctx context.Context, t *workers.Task) (any, error) {
		close(started)
		<-ctx.Done() // a well-behaved callback stops when asked
		return nil, context.Cause(ctx)
	}, alice)
	<-started

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	fmt.Println(rt.Shutdown(ctx))
	snap, _ := rt.Status(ctx, sub.ID, alice)
	fmt.Println(snap.Status, snap.Error, errors.Is(snap.Err(), workers.ErrShutdown))
	_, err := rt.Submit(ctx, "late", func(context.Context, *workers.Task) (any, error) { return nil, nil }, alice)
	fmt.Println(err)
	// Output:
	// <nil>
	// cancelled Cancelled by worker shutdown true
	// workers: runtime closed
}

func ExampleScopedTaskKey() {
	alice := workers.MustOwner("alice")
	id, _ := workers.ScopedTaskKey("report-42", alice)
	owner, ok := workers.OwnerOf(id)
	fmt.Println(id, owner, ok)

	global, _ := workers.GlobalTaskKey("warm-cache")
	_, ok = workers.OwnerOf(global)
	fmt.Println(global, ok)
	// Output:
	// alice::report-42 alice true
	// warm-cache false
}

func ExampleNewOwner() {
	for _, id := range []string{"user_123", "", "a::b", "alice:"} {
		_, err := workers.NewOwner(id)
		fmt.Println(err)
	}
	// Output:
	// <nil>
	// workers: invalid owner "": empty
	// workers: invalid owner "a::b": contains "::"
	// workers: invalid owner "alice:": ends in ":"
}

func ExamplePermanent() {
	ctx := context.Background()
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	defer rt.Shutdown(ctx)

	errDeclined := errors.New("card declined")
	attempts := 0
	sub, _ := rt.Submit(ctx, "charge", func(context.Context, *workers.Task) (any, error) {
		attempts++
		return nil, workers.Permanent(errDeclined) // retrying cannot help
	}, workers.MustOwner("alice"), workers.WithRetry(workers.RetryPolicy{MaxAttempts: 5}))
	snap, _ := rt.Wait(ctx, sub.ID, workers.System)
	fmt.Println(snap.Status, snap.Cause, attempts, snap.Error)
	// Output: failed permanent 1 card declined
}

func ExampleRuntime_ListPage() {
	ctx := context.Background()
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	defer rt.Shutdown(ctx)

	alice := workers.MustOwner("alice")
	for _, key := range []string{"a", "b", "c", "d", "e"} {
		sub, _ := rt.Submit(ctx, key, func(context.Context, *workers.Task) (any, error) { return nil, nil }, alice)
		rt.Wait(ctx, sub.ID, alice)
	}
	cursor := ""
	for {
		page, err := rt.ListPage(ctx, alice, workers.WithLimit(2), workers.WithCursor(cursor))
		if err != nil {
			fmt.Println(err)
			return
		}
		for _, t := range page.Tasks {
			fmt.Print(t.ID, " ")
		}
		fmt.Println("|")
		if page.Next == "" {
			break
		}
		cursor = page.Next
	}
	// Output:
	// alice::e alice::d |
	// alice::c alice::b |
	// alice::a |
}

func ExampleObserverFunc() {
	ctx := context.Background()
	events := make(chan string, 8)
	logEvents := workers.ObserverFunc(func(_ context.Context, e workers.Event) {
		events <- e.Kind.String() + " " + string(e.Status)
	})
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{Observers: []workers.Observer{logEvents}})

	sub, _ := rt.Submit(ctx, "k", func(context.Context, *workers.Task) (any, error) { return "ok", nil }, workers.MustOwner("alice"))
	rt.Wait(ctx, sub.ID, workers.System)
	rt.Shutdown(ctx) // every observer call has returned
	close(events)
	for e := range events {
		fmt.Println(e)
	}
	// Output:
	// submitted running
	// started running
	// finished completed
}

// A timeout fails the run at once and is never retried; the callback's
// context carries a *TimeoutError as its cause.
func ExampleWithTimeout() {
	ctx := context.Background()
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	defer rt.Shutdown(ctx)

	alice := workers.MustOwner("alice")
	sub, _ := rt.Submit(ctx, "slow", func(ctx context.Context, t *workers.Task) (any, error) {
		<-ctx.Done()
		return nil, context.Cause(ctx)
	}, alice, workers.WithTimeout(10*time.Millisecond), workers.WithRetry(workers.RetryPolicy{MaxAttempts: 3}))
	snap, _ := rt.Wait(ctx, sub.ID, alice)

	var te *workers.TimeoutError
	fmt.Println(snap.Status, snap.Cause, snap.Attempt, snap.Error)
	fmt.Println(errors.Is(snap.Err(), workers.ErrTimeout), errors.As(snap.Err(), &te), te.Timeout)
	// Output:
	// failed timeout 1 Timed out after 10ms
	// true true 10ms
}

// A service that is given its store, a MemStore in its tests and a SQL
// store in production, holds a *Runtime[workers.Store]: one type,
// whatever the store.
func ExampleNewRuntime() {
	type service struct {
		tasks *workers.Runtime[workers.Store]
	}
	newService := func(store workers.Store) *service {
		return &service{tasks: workers.NewRuntime[workers.Store](store, workers.Config{})}
	}

	svc := newService(workers.NewMemStore()) // postgres.Open and Migrate in production
	defer svc.tasks.Shutdown(context.Background())
	fmt.Printf("%T\n", svc.tasks.Store())
	// Output: *workers.MemStore
}
