package sqltest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// The multi-process scenarios start real OS processes: the test binary
// re-executes itself with -test.run=^TestHelperProcess$, and the
// environment tells the child which scenario role to play and which
// database to open. A child reports on stdout, one message a line; the
// parent drives it with lines on its stdin. Every wait on either side is
// bounded, so a hang fails instead of hanging.

// Opener opens a store handle of its own, over connections of its own, on
// one scenario's database, and returns the function that closes it. The
// database is already migrated.
type Opener func(ctx context.Context) (workers.Store, func(), error)

// Backend is how the multi-process scenarios reach a store package's
// databases.
type Backend struct {
	// NewDB creates a fresh, migrated database for one scenario, removed
	// in t's cleanup, and returns the environment entries ("NAME=value")
	// that name it. It may skip t.
	NewDB func(t *testing.T) []string

	// Open returns an Opener for the database that getenv names: the
	// child's os.Getenv, or in the parent a lookup of NewDB's entries
	// that falls back to os.Getenv. Parent and child thus open their
	// handles the same way.
	Open func(getenv func(string) string) Opener

	// Fault, if not nil, prepares the injection of faults into the
	// database that getenv names (as for Open), for the soak scenario of
	// RunReplicas, and returns the function that injects one: it
	// disturbs the scenario's own store handles for a moment, and never
	// another test's, for the tests run in parallel. It may skip or
	// fail t, and closes what it opens in t's cleanup.
	Fault func(t *testing.T, getenv func(string) string) func(ctx context.Context)
}

// The variables a parent sets for its children.
const (
	roleEnv  = "WORKERS_SQLTEST_ROLE"  // the scenario whose child role to play
	indexEnv = "WORKERS_SQLTEST_INDEX" // which of the scenario's children this is
)

// waitLimit bounds every wait of a scenario, in parent and child alike.
const waitLimit = 30 * time.Second

// msgPrefix starts every message line a child writes to its stdout; other
// lines (the testing package's, a race report) are kept for diagnosis.
const msgPrefix = "#sqltest "

// scenario is one multi-process test: what the parent does, and what each
// child it starts does with its own store handle.
type scenario struct {
	name   string
	parent func(p *parent)
	child  func(c *child, s workers.Store)
}

// RunProcesses runs the multi-process scenarios against b, each as a
// parallel subtest with a database of its own. The package's tests must
// also call HelperProcess from a test named TestHelperProcess.
func RunProcesses(t *testing.T, b Backend) {
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			env := b.NewDB(t)
			getenv := func(key string) string { return lookup(env, key) }
			sc.parent(&parent{t: t, scenario: sc.name, env: env, open: b.Open(getenv)})
		})
	}
}

// lookup returns the value env gives key ("KEY=value", the last one
// winning), or else os.Getenv's.
func lookup(env []string, key string) string {
	for _, kv := range slices.Backward(env) {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return os.Getenv(key)
}

// HelperProcess is the child side of RunProcesses. A store package's
// TestHelperProcess calls it; it returns at once unless a scenario
// started this process.
func HelperProcess(t *testing.T, b Backend) {
	role := os.Getenv(roleEnv)
	if role == "" {
		return
	}
	i := slices.IndexFunc(scenarios, func(sc scenario) bool { return sc.name == role })
	if i < 0 {
		t.Fatalf("unknown scenario %q", role)
	}
	index, err := strconv.Atoi(os.Getenv(indexEnv))
	if err != nil {
		t.Fatalf("%s: %v", indexEnv, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), waitLimit)
	defer cancel()
	s, closeStore, err := b.Open(os.Getenv)(ctx)
	if err != nil {
		t.Fatalf("open the store: %v", err)
	}
	t.Cleanup(closeStore)
	c := &child{t: t, ctx: ctx, index: index, in: bufio.NewScanner(os.Stdin)}
	scenarios[i].child(c, s)
}

// parent is the test side of a scenario.
type parent struct {
	t        *testing.T
	scenario string
	env      []string
	open     Opener
}

// store opens a handle of the parent's own, closed in t's cleanup.
func (p *parent) store() workers.Store {
	p.t.Helper()
	s, closeStore, err := p.open(p.t.Context())
	if err != nil {
		p.t.Fatalf("open the store: %v", err)
	}
	p.t.Cleanup(closeStore)
	return s
}

// runtime returns a runtime over s, shut down in t's cleanup.
func (p *parent) runtime(s workers.Store, cfg workers.Config) *workers.Runtime[workers.Store] {
	p.t.Helper()
	rt := workers.NewRuntime(s, cfg)
	p.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		if err := rt.Shutdown(ctx); err != nil {
			p.t.Errorf("parent runtime: %v", err)
		}
	})
	return rt
}

// ctx returns a context bounded by waitLimit.
func (p *parent) ctx() context.Context {
	ctx, cancel := context.WithTimeout(p.t.Context(), waitLimit)
	p.t.Cleanup(cancel)
	return ctx
}

// start starts child number index of the scenario. Its cleanup kills the
// child if it is still running and waits for it, and shows its output if
// the test failed.
func (p *parent) start(index int) *proc {
	t := p.t
	t.Helper()
	pr := &proc{
		t:      t,
		name:   fmt.Sprintf("%s[%d]", p.scenario, index),
		more:   make(chan struct{}, 1),
		exited: make(chan struct{}),
	}
	// The child's own -test.timeout is a last resort against an orphan:
	// the parent's waits end long before it.
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.timeout="+(4*waitLimit).String())
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Env = append(cmd.Env, roleEnv+"="+p.scenario, indexEnv+"="+strconv.Itoa(index))
	cmd.Stdout = (*stdout)(pr)
	cmd.Stderr = (*stderr)(pr)
	cmd.WaitDelay = 5 * time.Second
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", pr.name, err)
	}
	pr.cmd, pr.stdin = cmd, stdin
	go func() {
		pr.err = cmd.Wait()
		close(pr.exited)
	}()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-pr.exited:
		default:
			_ = cmd.Process.Kill()
			<-pr.exited
		}
		if t.Failed() {
			t.Logf("%s exited (%v); its output:\n%s", pr.name, pr.err, pr.transcript())
		}
	})
	return pr
}

// startAll starts n children, numbered from 0.
func (p *parent) startAll(n int) []*proc {
	p.t.Helper()
	procs := make([]*proc, n)
	for i := range procs {
		procs[i] = p.start(i)
	}
	return procs
}

// proc is a child process, as its parent sees it.
type proc struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	exited chan struct{} // closed when Wait returned
	err    error         // Wait's error; written before exited closes

	mu      sync.Mutex
	partial []byte        // guarded by mu: stdout after the last newline
	msgs    [][]string    // guarded by mu: messages not yet taken, as fields
	log     bytes.Buffer  // guarded by mu: all the child's output
	more    chan struct{} // capacity 1: a message arrived
}

type (
	stdout proc
	stderr proc
)

// Write collects the child's stdout, splitting out its messages.
func (w *stdout) Write(b []byte) (int, error) {
	p := (*proc)(w)
	p.mu.Lock()
	p.log.Write(b)
	p.partial = append(p.partial, b...)
	for {
		line, rest, ok := bytes.Cut(p.partial, []byte("\n"))
		if !ok {
			break
		}
		if m, ok := bytes.CutPrefix(line, []byte(msgPrefix)); ok {
			p.msgs = append(p.msgs, strings.Fields(string(m)))
		}
		p.partial = rest
	}
	p.mu.Unlock()
	select {
	case p.more <- struct{}{}:
	default:
	}
	return len(b), nil
}

// Write collects the child's stderr for diagnosis.
func (w *stderr) Write(b []byte) (int, error) {
	p := (*proc)(w)
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.Write(b)
}

func (p *proc) transcript() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// take removes and returns the first message whose verb is verb.
func (p *proc) take(verb string) ([]string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, m := range p.msgs {
		if len(m) > 0 && m[0] == verb {
			p.msgs = slices.Delete(p.msgs, i, i+1)
			return m[1:], true
		}
	}
	return nil, false
}

// next waits for the child's next message with verb and returns its
// nargs arguments. Messages with other verbs stay queued, so a child's
// goroutines may report in any order.
func (p *proc) next(verb string, nargs int) []string {
	p.t.Helper()
	deadline := time.NewTimer(waitLimit)
	defer deadline.Stop()
	for {
		args, ok := p.take(verb)
		if !ok {
			select {
			case <-p.more:
				continue
			case <-p.exited:
				args, ok = p.take(verb)
			case <-deadline.C:
				p.t.Fatalf("%s did not say %q within %v; its output:\n%s", p.name, verb, waitLimit, p.transcript())
			}
		}
		if !ok {
			p.t.Fatalf("%s exited (%v) without saying %q; its output:\n%s", p.name, p.err, verb, p.transcript())
		}
		if len(args) != nargs {
			p.t.Fatalf("%s said %q with arguments %q, want %d of them", p.name, verb, args, nargs)
		}
		return args
	}
}

// said reports whether the child sent a message with verb that nobody
// took yet.
func (p *proc) said(verb string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.ContainsFunc(p.msgs, func(m []string) bool { return len(m) > 0 && m[0] == verb })
}

// send writes a line to the child's stdin.
func (p *proc) send(line string) {
	p.t.Helper()
	if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
		p.t.Fatalf("write to %s: %v", p.name, err)
	}
}

// wait waits for the child to exit on its own and fails the test unless
// it exited successfully, its own test passing.
func (p *proc) wait() {
	p.t.Helper()
	select {
	case <-p.exited:
	case <-time.After(waitLimit):
		p.t.Fatalf("%s did not exit within %v; its output:\n%s", p.name, waitLimit, p.transcript())
	}
	if p.err != nil {
		p.t.Fatalf("%s failed: %v; its output:\n%s", p.name, p.err, p.transcript())
	}
}

// kill kills the child with SIGKILL and waits for it to be gone.
func (p *proc) kill() {
	p.t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		p.t.Fatalf("kill %s: %v", p.name, err)
	}
	select {
	case <-p.exited:
	case <-time.After(waitLimit):
		p.t.Fatalf("%s outlived SIGKILL by %v", p.name, waitLimit)
	}
	if st := p.cmd.ProcessState; st == nil || st.Exited() {
		p.t.Fatalf("%s exited by itself (%v) instead of being killed; its output:\n%s", p.name, p.err, p.transcript())
	}
}

// child is the child process's side of a scenario.
type child struct {
	t     *testing.T
	ctx   context.Context // bounded by waitLimit
	index int
	in    *bufio.Scanner // the parent's lines

	mu sync.Mutex // serializes messages from the child's goroutines
}

// name is the child's name in results it writes.
func (c *child) name() string { return "child-" + strconv.Itoa(c.index) }

// say sends the parent a message: a verb and its arguments, which must
// not contain spaces.
func (c *child) say(verb string, args ...any) {
	line := msgPrefix + verb
	for _, a := range args {
		line += " " + fmt.Sprint(a)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	fmt.Fprintln(os.Stdout, line)
}

// read returns the parent's next line, or "" once stdin is closed.
func (c *child) read() string {
	if c.in.Scan() {
		return strings.TrimSpace(c.in.Text())
	}
	return ""
}

// await reads the parent's next line and fails unless it is want.
func (c *child) await(want string) {
	c.t.Helper()
	if got := c.read(); got != want {
		c.t.Fatalf("waiting for %q from the parent, read %q", want, got)
	}
}

// runtime returns a runtime over s, shut down in t's cleanup (if the
// child has not shut it down already).
func (c *child) runtime(s workers.Store, cfg workers.Config) *workers.Runtime[workers.Store] {
	rt := workers.NewRuntime(s, cfg)
	c.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		if err := rt.Shutdown(ctx); err != nil {
			c.t.Errorf("child runtime: %v", err)
		}
	})
	return rt
}

// shutdown shuts rt down and fails unless every run settled.
func (c *child) shutdown(rt *workers.Runtime[workers.Store]) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := rt.Shutdown(ctx); err != nil {
		c.t.Fatalf("Shutdown: %v", err)
	}
}

// recv waits for ch to close or yield, within waitLimit.
func recv[T any](tb testing.TB, ch <-chan T, what string) T {
	tb.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitLimit):
		tb.Fatalf("%s did not happen within %v", what, waitLimit)
		var zero T
		return zero
	}
}

// eventually polls cond until it holds, failing after waitLimit.
func eventually(tb testing.TB, what string, cond func() (bool, error)) {
	tb.Helper()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(waitLimit)
	defer deadline.Stop()
	for {
		ok, err := cond()
		if err != nil {
			tb.Fatalf("waiting until %s: %v", what, err)
		}
		if ok {
			return
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			tb.Fatalf("%s did not happen within %v", what, waitLimit)
		}
	}
}
