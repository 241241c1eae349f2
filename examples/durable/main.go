// Command durable shows task records surviving a crash, on the SQLite
// store.
//
// Phase one runs in a child process of this program: it opens a SQLite
// file, submits tasks for two owners, lets one finish and leaves the
// others mid-run or waiting in a queue, and is then killed with SIGKILL,
// as a crash or an OOM kill would end it: no Shutdown, no last write.
// Phase two, in this process, opens the same file with a new runtime.
// Once the dead process's lease has expired, the new runtime's recovery
// loop ends the runs the crash left RUNNING or PENDING: FAILED, as
// abandoned. The finished task keeps its result, authorization holds as
// before, and a recovered key runs again.
//
//	go run ./examples/durable [-db file]
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/sqlite"
)

// leaseInterval is how often each phase's runtime renews its lease; a
// lease expires five intervals after its last renewal (the default
// ratio), and the recovery loop runs every interval.
const leaseInterval = 100 * time.Millisecond

// The environment tells a re-executed copy of this program that it is
// phase one, and where the database is.
const (
	phaseEnv = "WORKERS_DURABLE_PHASE" // "1" in phase one's process
	dbEnv    = "WORKERS_DURABLE_DB"
)

// crashPoint is the line phase one prints when its tasks are where the
// demonstration wants them; its parent kills it on reading it.
const crashPoint = "-- crash point --"

// limit bounds every wait, so that a stuck phase fails instead of hanging.
const limit = 30 * time.Second

var (
	alice = workers.MustOwner("alice")
	bob   = workers.MustOwner("bob")
)

// tasks are what phase one submits, in order, and the state each must
// reach before the crash.
var tasks = []struct {
	key, queue string
	owner      workers.Owner
	fn         workers.Func
	status     workers.Status
	progress   int
}{
	{"invoice-batch", "", alice, invoices, workers.StatusCompleted, 100},
	{"thumbnails", "", alice, workUntil(40), workers.StatusRunning, 40},
	{"csv-export", "exports", bob, workUntil(70), workers.StatusRunning, 70},
	{"archive", "exports", bob, workUntil(100), workers.StatusPending, 0}, // behind csv-export
}

func id(i int) string {
	id, err := workers.ScopedTaskKey(tasks[i].key, tasks[i].owner)
	if err != nil {
		panic(err) // the keys above are valid
	}
	return id
}

func main() {
	path := flag.String("db", "",
		"the SQLite database `file`, deleted and created afresh (by default, one in a new temporary directory, removed at the end)")
	flag.Parse()
	ctx := context.Background()
	var err error
	if os.Getenv(phaseEnv) == "1" {
		err = phaseOne(ctx, os.Stdout, os.Stdin, os.Getenv(dbEnv))
	} else {
		err = runIn(ctx, *path)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "durable:", err)
		os.Exit(1)
	}
}

// runIn runs the demonstration on the database file at path, or, if
// path is empty, on one in a new temporary directory that it removes.
func runIn(ctx context.Context, path string) error {
	if path == "" {
		dir, err := os.MkdirTemp("", "workers-durable-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		path = filepath.Join(dir, "tasks.db")
	}
	return run(ctx, os.Stdout, path, []string{os.Args[0]})
}

// invoices is a task that finishes at once.
func invoices(_ context.Context, t *workers.Task) (any, error) {
	t.SetProgress(100)
	return map[string]int{"invoices": 42}, nil
}

// workUntil returns a task that works in steps of 10% up to stop, then
// waits for its context, standing for work the crash interrupts.
func workUntil(stop int) workers.Func {
	return func(ctx context.Context, t *workers.Task) (any, error) {
		for p := 10; p <= stop; p += 10 {
			select {
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			case <-time.After(5 * time.Millisecond):
			}
			t.SetProgress(p)
		}
		<-ctx.Done()
		return nil, context.Cause(ctx)
	}
}

// run is the whole demonstration: phase one in a child process started
// with the command line self, which must run phaseOne when phaseEnv says
// so, then phase two here, on the database file at path.
func run(ctx context.Context, out io.Writer, path string, self []string) error {
	for _, f := range []string{path, path + "-wal", path + "-shm"} {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	fmt.Fprintf(out, "phase 1: a process opens %s, submits four tasks and is killed mid-run\n", filepath.Base(path))
	if err := crash(ctx, out, path, self); err != nil {
		return fmt.Errorf("phase 1: %w", err)
	}
	return phaseTwo(ctx, out, path)
}

// crash runs phase one in a child process, copies its report to out and
// kills it with SIGKILL at its crash point.
func crash(ctx context.Context, out io.Writer, path string, self []string) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, self[0], self[1:]...)
	cmd.Env = append(os.Environ(), phaseEnv+"=1", dbEnv+"="+path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe() // held open: phase one waits on it
	if err != nil {
		return err
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	lines := bufio.NewScanner(stdout)
	reached := false
	for !reached && lines.Scan() {
		if reached = lines.Text() == crashPoint; !reached {
			fmt.Fprintln(out, lines.Text())
		}
	}
	if reached {
		if err := cmd.Process.Kill(); err != nil {
			return err
		}
	}
	_, _ = io.Copy(io.Discard, stdout)
	err = cmd.Wait()
	if !reached {
		return fmt.Errorf("ended before its crash point: %v\n%s", err, stderr.Bytes())
	}
	fmt.Fprintf(out, "phase 1: the process was killed (%v) with two runs executing and one queued\n\n", cmd.ProcessState)
	return nil
}

// phaseOne submits the tasks, waits until each is where the
// demonstration wants it, reports them, prints the crash point and waits
// to be killed. It returns only if parent, its stdin, closes first.
func phaseOne(ctx context.Context, out io.Writer, parent io.Reader, path string) error {
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		return err
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		return err
	}
	// Running tasks' progress is stored as they go (every 20 ms here,
	// every second by default), so what they reached survives the crash;
	// a short lease lets phase two recover the runs soon after it.
	rt := workers.NewRuntime(s, workers.Config{ProgressInterval: 20 * time.Millisecond, LeaseInterval: leaseInterval})
	if err := rt.Start(ctx); err != nil {
		return err
	}
	defer func() {
		// Reached only if the parent went away: the kill skips it, as a
		// crash would.
		ctx, cancel := context.WithTimeout(ctx, limit)
		defer cancel()
		_ = rt.Shutdown(ctx)
	}()
	for _, tk := range tasks {
		var err error
		if tk.queue == "" {
			_, err = rt.Submit(ctx, tk.key, tk.fn, tk.owner)
		} else {
			_, err = rt.SubmitSequential(ctx, tk.queue, tk.key, tk.fn, tk.owner)
		}
		if err != nil {
			return err
		}
	}
	for i, tk := range tasks {
		err := poll(func() (bool, error) {
			rec, err := s.GetTask(ctx, id(i)) // the stored record, as a crash leaves it
			return rec.Status == tk.status && rec.Progress == tk.progress, err
		})
		if err != nil {
			return fmt.Errorf("%s: %w", id(i), err)
		}
	}
	for i, tk := range tasks {
		snap, err := rt.Status(ctx, id(i), tk.owner) // live progress, from this runtime
		if err != nil {
			return err
		}
		fmt.Fprintln(out, "  "+line(snap))
	}
	fmt.Fprintln(out, crashPoint)
	_, _ = io.Copy(io.Discard, parent)
	return errors.New("the parent went away before killing phase one")
}

// phaseTwo opens the file the crashed process left, recovers its dead
// runs and shows what survived.
func phaseTwo(ctx context.Context, out io.Writer, path string) error {
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		return err
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil { // a no-op: the schema is current
		return err
	}
	fmt.Fprintln(out, "phase 2: a new process opens the same file; before recovery the records say")
	for i := range tasks {
		rec, err := s.GetTask(ctx, id(i))
		if err != nil {
			return err
		}
		fmt.Fprintln(out, "  "+line(snapshotOf(rec)))
	}
	fmt.Fprintln(out, "  no process is left to finish the running and pending ones")
	fmt.Fprintln(out)

	rt := workers.NewRuntime(s, workers.Config{LeaseInterval: leaseInterval})
	err = recovered(ctx, out, rt)
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), limit)
	defer cancel()
	if serr := rt.Shutdown(shutdown); err == nil {
		err = serr
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "shut down cleanly: every run settled")
	return nil
}

// recovered starts rt, waits for its recovery loop to end the dead
// process's runs, and shows the result.
func recovered(ctx context.Context, out io.Writer, rt *workers.Runtime[*sqlite.Store]) error {
	if err := rt.Start(ctx); err != nil {
		return err
	}
	// Wait returns when a record ends: here, when the recovery loop finds
	// the dead process's lease expired.
	wctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for i, tk := range tasks {
		if _, err := rt.Wait(wctx, id(i), tk.owner); err != nil {
			return fmt.Errorf("waiting for the recovery of %s: %w", id(i), err)
		}
	}
	return show(ctx, out, rt)
}

// show prints what the recovery loop made of the records, checks
// authorization after the restart and runs a recovered key again.
func show(ctx context.Context, out io.Writer, rt *workers.Runtime[*sqlite.Store]) error {
	fmt.Fprintf(out, "phase 2: once the dead process's lease expired (%v after its last renewal), the recovery loop ended its runs; the records now say\n",
		5*leaseInterval)
	abandoned := 0
	for i, tk := range tasks {
		snap, err := rt.Status(ctx, id(i), tk.owner)
		if err != nil {
			return err
		}
		fmt.Fprintln(out, "  "+line(snap))
		if errors.Is(snap.Err(), workers.ErrAbandoned) {
			abandoned++
		}
	}
	fmt.Fprintf(out, "  %d records abandoned by the crash, 1 completed one intact\n", abandoned)
	fmt.Fprintln(out, "  (each run's progress had been stored as it went; recovery keeps it)")
	fmt.Fprintln(out)

	mine, err := rt.List(ctx, bob)
	if err != nil {
		return err
	}
	_, err = rt.Status(ctx, id(0), bob)
	fmt.Fprintf(out, "bob lists %d tasks; asking for %s he is told: %v\n", len(mine), id(0), err)

	old, err := rt.Status(ctx, id(1), alice)
	if err != nil {
		return err
	}
	sub, err := rt.Submit(ctx, tasks[1].key, func(ctx context.Context, t *workers.Task) (any, error) {
		for p := 25; p <= 100; p += 25 {
			select {
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			case <-time.After(5 * time.Millisecond):
			}
			t.SetProgress(p)
		}
		return map[string]int{"thumbnails": 120}, nil
	}, alice)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "alice submits %s again: joined %v, new run %v\n", tasks[1].key, sub.Joined, sub.RunID != old.RunID)
	var snap workers.Snapshot
	err = poll(func() (bool, error) {
		var err error
		snap, err = rt.Status(ctx, sub.ID, alice)
		return snap.Status.Terminal(), err
	})
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "  "+line(snap))
	return nil
}

// snapshotOf renders a raw record the way Runtime.Status would.
func snapshotOf(rec workers.Record) workers.Snapshot {
	return workers.Snapshot{ID: rec.ID, RunID: rec.RunID, Status: rec.Status, Progress: rec.Progress,
		Result: rec.Result, Error: rec.Error, Queue: rec.Queue}
}

// line renders a task as one line: id, status, progress, then its
// result, its error or its queue.
func line(s workers.Snapshot) string {
	l := fmt.Sprintf("%-22s %-9s %3d%%", s.ID, s.Status, s.Progress)
	switch {
	case s.Result != nil:
		l += "  result " + string(s.Result)
	case s.Error != "":
		l += "  " + s.Error
	case s.Queue != "":
		l += "  on queue " + s.Queue
	}
	return l
}

// poll calls cond until it holds, for at most limit.
func poll(cond func() (bool, error)) error {
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(limit)
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not done after %v", limit)
		}
		<-tick.C
	}
}
