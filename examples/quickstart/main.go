// Command quickstart shows the library's main flow on the in-memory store:
// two owners submit tasks, their progress is drawn live, a foreign owner is
// refused, a task is cancelled with its reason recorded, and the runtime
// shuts down with every goroutine ended.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/taskgate/workers"
)

func main() {
	if err := run(context.Background(), os.Stdout, isTerminal(os.Stdout), 40*time.Millisecond); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

// steps returns a task that works through n steps of d each, reporting
// progress, and stops early when its context is cancelled.
func steps(n int, d time.Duration) workers.Func {
	return func(ctx context.Context, t *workers.Task) (any, error) {
		tick := time.NewTicker(d)
		defer tick.Stop()
		for i := 1; i <= n; i++ {
			select {
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			case <-tick.C:
			}
			t.SetProgress(i * 100 / n)
		}
		return map[string]int{"steps": n}, nil
	}
}

// run shows the flow on a new runtime, which it shuts down however the
// flow ends.
func run(ctx context.Context, out io.Writer, live bool, step time.Duration) error {
	rt := workers.NewRuntime(workers.NewMemStore(), workers.Config{})
	err := show(ctx, rt, out, live, step)
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if serr := rt.Shutdown(shutdown); err == nil {
		err = serr
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "shut down; goroutines left: %d (main)\n", goroutinesSettle(1, time.Second))
	return nil
}

func show(ctx context.Context, rt *workers.Runtime[*workers.MemStore], out io.Writer, live bool, step time.Duration) error {
	alice := workers.MustOwner("alice")
	bob := workers.MustOwner("bob")

	report, err := rt.Submit(ctx, "quarterly-report", steps(25, step), alice)
	if err != nil {
		return err
	}
	exp, err := rt.SubmitSequential(ctx, "exports", "csv-export", steps(15, step), bob)
	if err != nil {
		return err
	}
	thumbs, err := rt.SubmitSequential(ctx, "exports", "thumbnails", steps(10, step), bob)
	if err != nil {
		return err
	}
	reindex, err := rt.Submit(ctx, "reindex", steps(100, step), alice)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "alice submitted %s and %s; bob queued %s and %s on \"exports\"\n\n",
		report.ID, reindex.ID, exp.ID, thumbs.ID)

	// Bob cannot see Alice's task: he is told it does not exist.
	if _, err := rt.Status(ctx, report.ID, bob); errors.Is(err, workers.ErrNotFound) {
		fmt.Fprintf(out, "bob asks for %s: %v\n", report.ID, err)
	}
	if err := rt.Cancel(ctx, reindex.ID, bob); errors.Is(err, workers.ErrNotFound) {
		fmt.Fprintf(out, "bob tries to cancel %s: %v\n\n", reindex.ID, err)
	}

	tasks := []struct {
		id    string
		owner workers.Owner
	}{{report.ID, alice}, {reindex.ID, alice}, {exp.ID, bob}, {thumbs.ID, bob}}
	cancelled := false
	for frame := 0; ; frame++ {
		var lines []string
		finished := 0
		for _, tk := range tasks {
			snap, err := rt.Status(ctx, tk.id, tk.owner)
			if err != nil {
				return err
			}
			lines = append(lines, fmt.Sprintf("%-24s %s", snap.ID, bar(snap)))
			if snap.Status.Terminal() {
				finished++
			}
		}
		last := finished == len(tasks)
		switch {
		case live:
			if frame > 0 {
				fmt.Fprintf(out, "\x1b[%dA", len(lines)) // redraw in place
			}
			fmt.Fprint(out, strings.Join(lines, "\x1b[K\n")+"\x1b[K\n")
		case frame%10 == 0 || last:
			fmt.Fprint(out, strings.Join(lines, "\n")+"\n\n")
		}
		if last {
			break
		}
		if snap, _ := rt.Status(ctx, report.ID, alice); !cancelled && snap.Progress >= 40 {
			// Alice changes her mind about the long reindex, and says why.
			if err := rt.Cancel(ctx, reindex.ID, alice, workers.WithReason("the report reads the old index")); err != nil {
				return err
			}
			cancelled = true
		}
		time.Sleep(step)
	}

	snap, err := rt.Status(ctx, reindex.ID, alice)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%s ended %s at %d%%: %q (cancelled by user: %v), by %s: %q\n",
		snap.ID, snap.Status, snap.Progress, snap.Error, errors.Is(snap.Err(), workers.ErrCancelled), snap.CancelledBy, snap.CancelReason)
	done, err := rt.Status(ctx, report.ID, alice)
	if err != nil {
		return err
	}
	result, err := workers.ResultAs[map[string]int](done)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%s result: %v\n", done.ID, result)

	mine, err := rt.List(ctx, alice)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "alice lists %d tasks; bob's are not among them\n", len(mine))
	return nil
}

// bar renders a snapshot's progress bar and status.
func bar(s workers.Snapshot) string {
	const width = 30
	filled := s.Progress * width / 100
	return fmt.Sprintf("[%s%s] %3d%% %s", strings.Repeat("#", filled), strings.Repeat(".", width-filled), s.Progress, s.Status)
}

// goroutinesSettle waits, up to limit, for the goroutine count to fall to
// want (a goroutine that has signalled it is done may still be returning),
// and returns the count.
func goroutinesSettle(want int, limit time.Duration) int {
	deadline := time.Now().Add(limit)
	for runtime.NumGoroutine() > want && time.Now().Before(deadline) {
		runtime.Gosched()
	}
	return runtime.NumGoroutine()
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
