package storetest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
)

// RunFaults runs the fault cases against stores from newStore, each a
// fresh, empty store (the cases run in parallel): every store call on a
// run's path is failed through Faulty, once before it reaches the store
// and once after it landed (the write whose acknowledgement was lost),
// and each case checks what must hold whatever the store does: every
// acknowledged submission reaches a terminal record, Wait returns, a
// resubmission never joins a dead run, a refused outcome ends the run
// FAILED, and Shutdown, once the store heals, settles everything.
func RunFaults(t *testing.T, newStore func(t *testing.T) workers.Store) {
	for _, c := range []struct {
		name string
		run  func(*testing.T, func(*testing.T) workers.Store)
	}{
		{"RegisterInsert", faultRegisterInsert},
		{"GhostInsertIsReplacedNotJoined", faultGhostInsertIsReplacedNotJoined},
		{"RegisterReplace", faultRegisterReplace},
		{"RunWrites", faultRunWrites},
		{"ProgressWrite", faultProgressWrite},
		{"CancelWrite", faultCancelWrite},
		{"CancelWriteOfAWaitingItem", faultCancelWriteOfAWaitingItem},
		{"RecoveryWrite", faultRecoveryWrite},
		{"ShutdownBacklogWrites", faultShutdownBacklogWrites},
		{"PermanentRefusalFailsTheRun", faultPermanentRefusalFailsTheRun},
		{"RegisterRead", faultRegisterRead},
		{"JoinWatcher", faultJoinWatcher},
		{"LeaseRenewal", faultLeaseRenewal},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, newStore)
		})
	}
}

var (
	owner      = workers.MustOwner("alice")
	quiet      = slog.New(slog.DiscardHandler)
	bothFaults = []Fault{FailBefore, FailAfter}
	liveStates = []workers.Status{workers.StatusPending, workers.StatusRunning}
)

// faultEnv is a runtime over a store behind a fault schedule.
type faultEnv struct {
	t   *testing.T
	f   *Faults
	mem workers.Store
	rt  *workers.Runtime[workers.Store]
}

// newFaultEnv builds the runtime. Its cleanup heals the store, shuts the
// runtime down, which must settle everything, and checks that no record
// is left live.
func newFaultEnv(t *testing.T, newStore func(*testing.T) workers.Store, cfg workers.Config) *faultEnv {
	t.Helper()
	e := &faultEnv{t: t, f: &Faults{}, mem: newStore(t)}
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	e.rt = workers.NewRuntime(Faulty(e.mem, e.f), cfg)
	t.Cleanup(func() {
		e.f.Heal()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		assert.NoError(t, e.rt.Shutdown(ctx), "Shutdown after the store healed")
		e.noLiveRecords()
	})
	return e
}

// noLiveRecords fails the test if a record is PENDING or RUNNING: once
// the runtime has shut down cleanly, none may be.
func (e *faultEnv) noLiveRecords() {
	e.t.Helper()
	recs, err := e.mem.ListTasks(context.Background(), workers.Filter{Statuses: liveStates})
	require.NoError(e.t, err)
	for _, r := range recs {
		e.t.Errorf("record %q is left %s under run %q", r.ID, r.Status, r.RunID)
	}
}

// wait waits for the task to end, and returns its final snapshot.
func (e *faultEnv) wait(id string) workers.Snapshot {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	snap, err := e.rt.Wait(ctx, id, owner)
	require.NoError(e.t, err, "Wait for %q", id)
	return snap
}

// completes submits key and requires a new run that completes.
func (e *faultEnv) completes(key string) workers.Snapshot {
	e.t.Helper()
	sub, err := e.rt.Submit(context.Background(), key, result("done"), owner)
	require.NoError(e.t, err)
	require.False(e.t, sub.Joined, "a resubmission joined run %q", sub.RunID)
	snap := e.wait(sub.ID)
	require.Equal(e.t, workers.StatusCompleted, snap.Status, "error %q", snap.Error)
	require.Equal(e.t, sub.RunID, snap.RunID)
	return snap
}

func result(v any) workers.Func {
	return func(context.Context, *workers.Task) (any, error) { return v, nil }
}

func scoped(t *testing.T, key string) string {
	id, err := workers.ScopedTaskKey(key, owner)
	require.NoError(t, err)
	return id
}

// once adds a rule that fires once.
func (e *faultEnv) once(fault Fault, op Op, match func(*Call) bool) {
	e.f.Add(Rule{Op: op, Match: match, Times: 1, Fault: fault})
}

func to(s workers.Status) func(*Call) bool {
	return func(c *Call) bool { return c.Next.Status == s }
}

func inject(t *testing.T, f *Faults, op Op) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, f.WaitInjected(ctx, op, 1), "the fault was never injected")
}

// The register's insert fails: Submit returns the error, and a record the
// insert may have left is ended or replaced, never joined.
func faultRegisterInsert(t *testing.T, newStore func(*testing.T) workers.Store) {
	for _, fault := range bothFaults {
		t.Run(fault.String(), func(t *testing.T) {
			t.Parallel()
			e := newFaultEnv(t, newStore, workers.Config{})
			e.once(fault, OpInsertTask, nil)
			_, err := e.rt.Submit(context.Background(), "k", result("lost"), owner)
			require.ErrorIs(t, err, ErrInjected)
			id := scoped(t, "k")
			if fault == FailAfter {
				// The ghost is ended by the retired run, fenced on its id.
				snap := e.wait(id)
				assert.ErrorIs(t, snap.Err(), workers.ErrAbandoned)
			} else {
				_, err := e.mem.GetTask(context.Background(), id)
				require.ErrorIs(t, err, workers.ErrNotFound)
			}
			e.completes("k")
		})
	}
}

// The ghost an ambiguous insert left is replaced by a resubmission that
// comes before its retired run ended it.
func faultGhostInsertIsReplacedNotJoined(t *testing.T, newStore func(*testing.T) workers.Store) {
	for _, fault := range bothFaults {
		t.Run(fault.String(), func(t *testing.T) {
			t.Parallel()
			e := newFaultEnv(t, newStore, workers.Config{})
			e.once(FailAfter, OpInsertTask, nil)
			// The retired run's ending write fails too, once.
			e.once(fault, OpTransitionTask, func(c *Call) bool {
				return slices.Equal(c.From, []workers.Status{workers.StatusPending}) && c.Next.Status.Terminal()
			})
			_, err := e.rt.Submit(context.Background(), "k", result("lost"), owner)
			require.ErrorIs(t, err, ErrInjected)
			e.completes("k")
		})
	}
}

// The re-run of a finished key fails to replace its record: Submit
// returns the error, and the key runs again on the next submission.
func faultRegisterReplace(t *testing.T, newStore func(*testing.T) workers.Store) {
	for _, fault := range bothFaults {
		t.Run(fault.String(), func(t *testing.T) {
			t.Parallel()
			e := newFaultEnv(t, newStore, workers.Config{})
			first := e.completes("k")
			e.once(fault, OpReplaceTask, nil)
			_, err := e.rt.Submit(context.Background(), "k", result("lost"), owner)
			require.ErrorIs(t, err, ErrInjected)
			if fault == FailAfter {
				snap := e.wait(first.ID)
				assert.NotEqual(t, first.RunID, snap.RunID, "the replace landed")
				assert.ErrorIs(t, snap.Err(), workers.ErrAbandoned)
			}
			e.completes("k")
		})
	}
}

// One test per write of a run's own: it fails once, the submission was
// acknowledged, and the run still completes, its callback called once
// per attempt. A run with a start write of its own is a queue item: an
// async run admitted at once is registered RUNNING.
func faultRunWrites(t *testing.T, newStore func(*testing.T) workers.Store) {
	for _, c := range []struct {
		name  string
		match func(*Call) bool
		opts  []workers.SubmitOption
		fails int    // attempts that fail before one succeeds
		queue string // submitted to this sequential queue, if set
	}{
		{"Start", to(workers.StatusRunning), nil, 0, "q"},
		{"Finish", to(workers.StatusCompleted), nil, 0, ""},
		{"Retry", func(c *Call) bool { return c.Next.Status == workers.StatusRunning && c.Next.Attempt == 2 },
			[]workers.SubmitOption{workers.WithRetry(workers.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond})}, 1, ""},
	} {
		for _, fault := range bothFaults {
			t.Run(c.name+"/"+fault.String(), func(t *testing.T) {
				t.Parallel()
				e := newFaultEnv(t, newStore, workers.Config{})
				e.once(fault, OpTransitionTask, c.match)
				var calls atomic.Int32
				fn := func(context.Context, *workers.Task) (any, error) {
					if int(calls.Add(1)) <= c.fails {
						return nil, errors.New("try again")
					}
					return "done", nil
				}
				var sub workers.Submission
				var err error
				if c.queue != "" {
					sub, err = e.rt.SubmitSequential(context.Background(), c.queue, "k", fn, owner, c.opts...)
				} else {
					sub, err = e.rt.Submit(context.Background(), "k", fn, owner, c.opts...)
				}
				require.NoError(t, err)
				snap := e.wait(sub.ID)
				require.Equal(t, workers.StatusCompleted, snap.Status, "error %q", snap.Error)
				assert.JSONEq(t, `"done"`, string(snap.Result))
				assert.Equal(t, c.fails+1, snap.Attempt)
				assert.EqualValues(t, c.fails+1, calls.Load(), "the callback ran once per attempt")
				assert.Equal(t, 1, e.f.Injected(OpTransitionTask))
			})
		}
	}
}

// A progress write that fails is made again by the next pass of the
// loop that made it, the sync loop's (workers.Config.SyncInterval) or
// the share pass's (workers.Config.ProgressInterval), with the other
// loop too slow to make it: the callback sets its progress once and
// then waits. Before the write landed, the store holds the progress only
// from the second try; after, the second try writes it again, which
// changes nothing. The store's notices are hidden, so that no pass of
// the sync loop that a listener's Resync makes writes it instead.
func faultProgressWrite(t *testing.T, newStore func(*testing.T) workers.Store) {
	deaf := func(t *testing.T) workers.Store {
		s := newStore(t)
		if l, ok := s.(workers.Leaser); ok {
			return struct {
				workers.Store
				workers.Leaser
			}{s, l}
		}
		return struct{ workers.Store }{s}
	}
	loops := map[string]workers.Config{
		"sync":  {SyncInterval: 5 * time.Millisecond, ProgressInterval: time.Hour},
		"share": {SyncInterval: time.Hour, ProgressInterval: 5 * time.Millisecond},
	}
	for name, cfg := range loops {
		for _, fault := range bothFaults {
			t.Run(name+"/"+fault.String(), func(t *testing.T) {
				t.Parallel()
				e := newFaultEnv(t, deaf, cfg)
				require.NoError(t, e.rt.Start(context.Background()))
				fifty := func(c *Call) bool { return c.Next.Status == workers.StatusRunning && c.Next.Progress == 50 }
				e.once(fault, OpTransitionTask, fifty)
				var tries atomic.Int32
				e.f.Add(Rule{Op: OpTransitionTask, Fault: Delay, Match: func(c *Call) bool { // counts, selects nothing
					if fifty(c) {
						tries.Add(1)
					}
					return false
				}})
				release := make(chan struct{})
				sub, err := e.rt.Submit(context.Background(), "k", func(ctx context.Context, tk *workers.Task) (any, error) {
					tk.SetProgress(50)
					<-release
					return "done", nil
				}, owner)
				require.NoError(t, err)
				inject(t, e.f, OpTransitionTask)
				require.Eventually(t, func() bool {
					r, err := e.mem.GetTask(context.Background(), sub.ID)
					return err == nil && r.Progress == 50 && tries.Load() >= 1
				}, 10*time.Second, time.Millisecond, "the failed progress write was not made again")
				close(release)
				assert.Equal(t, workers.StatusCompleted, e.wait(sub.ID).Status)
			})
		}
	}
}

// Cancel's write fails. Before it landed, Cancel returns the error, the
// run goes on and a second Cancel ends it. After it landed, Cancel reads
// the record, finds its write there and succeeds, cancelling the run as
// usual. Either way Wait returns CANCELLED and the callback's context
// ends with ErrCancelled.
func faultCancelWrite(t *testing.T, newStore func(*testing.T) workers.Store) {
	for _, fault := range bothFaults {
		t.Run(fault.String(), func(t *testing.T) {
			t.Parallel()
			e := newFaultEnv(t, newStore, workers.Config{})
			started, ended := make(chan struct{}), make(chan error, 1)
			sub, err := e.rt.Submit(context.Background(), "k", func(ctx context.Context, _ *workers.Task) (any, error) {
				close(started)
				<-ctx.Done()
				ended <- context.Cause(ctx)
				return nil, ctx.Err()
			}, owner)
			require.NoError(t, err)
			<-started
			e.once(fault, OpTransitionTask, to(workers.StatusCancelled))
			err = e.rt.Cancel(context.Background(), sub.ID, owner)
			if fault == FailAfter {
				require.NoError(t, err, "the cancel landed: Cancel read the record and says so")
				require.ErrorIs(t, e.rt.Cancel(context.Background(), sub.ID, owner), workers.ErrFinished)
			} else {
				require.ErrorIs(t, err, ErrInjected)
				snap, err := e.rt.Status(context.Background(), sub.ID, owner)
				require.NoError(t, err)
				require.Equal(t, workers.StatusRunning, snap.Status, "a cancel that never landed changed nothing")
				require.NoError(t, e.rt.Cancel(context.Background(), sub.ID, owner))
			}
			snap := e.wait(sub.ID)
			assert.Equal(t, workers.StatusCancelled, snap.Status)
			assert.ErrorIs(t, snap.Err(), workers.ErrCancelled)
			select {
			case cause := <-ended:
				assert.ErrorIs(t, cause, workers.ErrCancelled)
			case <-time.After(10 * time.Second):
				t.Fatal("the callback's context never ended")
			}
		})
	}
}

// Cancel's write of a queue item still waiting for its turn (PENDING)
// fails. Before it landed, Cancel returns the error and the item still
// waits; a second Cancel ends it. After it landed, Cancel finds its write
// there and succeeds. Either way the item never runs: its turn finds the
// record CANCELLED, and Wait returns that.
func faultCancelWriteOfAWaitingItem(t *testing.T, newStore func(*testing.T) workers.Store) {
	for _, fault := range bothFaults {
		t.Run(fault.String(), func(t *testing.T) {
			t.Parallel()
			e := newFaultEnv(t, newStore, workers.Config{})
			started, release := make(chan struct{}), make(chan struct{})
			head, err := e.rt.SubmitSequential(context.Background(), "q", "head", blocked(started, release), owner)
			require.NoError(t, err)
			<-started
			var calls atomic.Int32
			item, err := e.rt.SubmitSequential(context.Background(), "q", "item", func(context.Context, *workers.Task) (any, error) {
				calls.Add(1)
				return "ran", nil
			}, owner)
			require.NoError(t, err)
			e.once(fault, OpTransitionTask, func(c *Call) bool { return c.ID == item.ID && c.Next.Status == workers.StatusCancelled })
			err = e.rt.Cancel(context.Background(), item.ID, owner)
			if fault == FailAfter {
				require.NoError(t, err, "the cancel landed: Cancel read the record and says so")
			} else {
				require.ErrorIs(t, err, ErrInjected)
				snap, err := e.rt.Status(context.Background(), item.ID, owner)
				require.NoError(t, err)
				require.Equal(t, workers.StatusPending, snap.Status, "a cancel that never landed changed nothing")
				require.NoError(t, e.rt.Cancel(context.Background(), item.ID, owner))
			}
			require.ErrorIs(t, e.rt.Cancel(context.Background(), item.ID, owner), workers.ErrFinished)
			close(release)
			assert.Equal(t, workers.StatusCompleted, e.wait(head.ID).Status)
			snap := e.wait(item.ID)
			assert.Equal(t, workers.StatusCancelled, snap.Status)
			assert.ErrorIs(t, snap.Err(), workers.ErrCancelled)
			assert.Equal(t, "alice", snap.CancelledBy)
			assert.Equal(t, item.RunID, snap.RunID)
			assert.Zero(t, calls.Load(), "a cancelled item ran")
		})
	}
}

// Recovery's write fails. Before it landed, Start returns the error and
// can be called again; after it landed, recovery reads the record, finds
// its end there, and Start succeeds. Either way the dead run's record
// ends, and its key runs again.
func faultRecoveryWrite(t *testing.T, newStore func(*testing.T) workers.Store) {
	for _, fault := range bothFaults {
		t.Run(fault.String(), func(t *testing.T) {
			t.Parallel()
			e := newFaultEnv(t, newStore, workers.Config{})
			id := scoped(t, "k")
			require.NoError(t, e.mem.InsertTask(context.Background(), workers.Record{
				ID: id, RunID: "dead-instance.1", Watchers: []string{"alice"}, CreatedAt: time.Now().UTC(),
				State: workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: time.Now().UTC()},
			}))
			e.once(fault, OpTransitionTask, func(c *Call) bool { return c.Next.Cause == workers.CauseAbandoned })
			err := e.rt.Start(context.Background())
			if fault == FailAfter {
				require.NoError(t, err, "the write landed: recovery read the record and says so")
			} else {
				require.ErrorIs(t, err, ErrInjected)
				require.NoError(t, e.rt.Start(context.Background()))
			}
			snap := e.wait(id)
			assert.Equal(t, "dead-instance.1", snap.RunID)
			assert.ErrorIs(t, snap.Err(), workers.ErrAbandoned)
			e.completes("k")
		})
	}
}

// Shutdown's writes of the backlog, queue items and runs waiting for a
// slot under workers.Limits, fail: they are retried while Shutdown's
// context lasts, and every item ends CANCELLED.
func faultShutdownBacklogWrites(t *testing.T, newStore func(*testing.T) workers.Store) {
	for _, path := range []string{"queue", "slot"} {
		for _, fault := range bothFaults {
			t.Run(path+"/"+fault.String(), func(t *testing.T) {
				t.Parallel()
				e := newFaultEnv(t, newStore, workers.Config{ShutdownGrace: -1, Limits: workers.Limits{MaxRunning: 1}})
				submit := func(key string, fn workers.Func) (workers.Submission, error) {
					if path == "queue" {
						return e.rt.SubmitSequential(context.Background(), "q", key, fn, owner)
					}
					return e.rt.Submit(context.Background(), key, fn, owner)
				}
				started := make(chan struct{})
				head, err := submit("head", func(ctx context.Context, _ *workers.Task) (any, error) {
					close(started)
					<-ctx.Done()
					return nil, ctx.Err()
				})
				require.NoError(t, err)
				<-started
				var items []string
				for i := range 3 {
					sub, err := submit(fmt.Sprint("item-", i), result("never"))
					require.NoError(t, err)
					items = append(items, sub.ID)
				}
				e.f.Add(Rule{Op: OpTransitionTask, Times: 2, Fault: fault, Match: func(c *Call) bool {
					return c.Next.Cause == workers.CauseShutdown && slices.Equal(c.From, []workers.Status{workers.StatusPending})
				}})
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				require.NoError(t, e.rt.Shutdown(ctx))
				assert.Equal(t, 2, e.f.Injected(OpTransitionTask))
				for _, id := range append(items, head.ID) {
					r, err := e.mem.GetTask(context.Background(), id)
					require.NoError(t, err)
					assert.Equal(t, workers.StatusCancelled, r.Status, "%s", id)
					assert.Equal(t, workers.CauseShutdown, r.Cause, "%s", id)
				}
			})
		}
	}
}

// A store that refuses a run's outcome for good (ErrInvalidData) gets a
// FAILED record saying so, with the store cause, instead of a stranded
// one; so does a run whose start it refuses, whose callback never runs.
func faultPermanentRefusalFailsTheRun(t *testing.T, newStore func(*testing.T) workers.Store) {
	refusal := fmt.Errorf("%w: SQLSTATE 22P05: unsupported Unicode escape sequence", workers.ErrInvalidData)
	retry := []workers.SubmitOption{workers.WithRetry(workers.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond})}
	for _, c := range []struct {
		name  string
		match func(*Call) bool
		opts  []workers.SubmitOption
		ran   int32
	}{
		{"Outcome", to(workers.StatusCompleted), nil, 1},
		{"Start", to(workers.StatusRunning), nil, 0}, // a queue item's start: see faultRunWrites
		// A retry's start (RUNNING, attempt 2), after a first attempt that
		// failed: the second attempt never begins.
		{"Retry", func(c *Call) bool { return c.Next.Status == workers.StatusRunning && c.Next.Attempt == 2 }, retry, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newFaultEnv(t, newStore, workers.Config{})
			e.f.Add(Rule{Op: OpTransitionTask, Match: c.match, Fault: FailBefore, Err: refusal})
			var calls atomic.Int32
			sub, err := e.rt.SubmitSequential(context.Background(), "q", "k", func(context.Context, *workers.Task) (any, error) {
				if calls.Add(1) == 1 && c.opts != nil {
					return nil, errors.New("try again")
				}
				return "a result the store refuses", nil
			}, owner, c.opts...)
			require.NoError(t, err)
			snap := e.wait(sub.ID)
			assert.Equal(t, workers.StatusFailed, snap.Status)
			assert.Equal(t, workers.CauseStore, snap.Cause)
			assert.Contains(t, snap.Error, "the store refused the run's outcome")
			assert.Contains(t, snap.Error, "SQLSTATE 22P05")
			assert.Equal(t, c.ran, calls.Load())
		})
	}
}

// blocked returns a callback that runs until release is closed, and
// closes started when it starts.
func blocked(started, release chan struct{}) workers.Func {
	return func(ctx context.Context, _ *workers.Task) (any, error) {
		close(started)
		select {
		case <-release:
			return "released", nil
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// A submission of a live key finds the insert refused and reads the
// record to join it; that read fails: Submit returns the error, the live
// run goes on, and the next submission joins it.
func faultRegisterRead(t *testing.T, newStore func(*testing.T) workers.Store) {
	for _, fault := range bothFaults {
		t.Run(fault.String(), func(t *testing.T) {
			t.Parallel()
			e := newFaultEnv(t, newStore, workers.Config{})
			started, release := make(chan struct{}), make(chan struct{})
			sub, err := e.rt.Submit(context.Background(), "k", blocked(started, release), owner)
			require.NoError(t, err)
			<-started
			// The runtime's own loops may read the record too (a notice,
			// the sync loop) and take the fault first: then the
			// submission joins, and the fault is set again.
			for try := 1; ; try++ {
				e.once(fault, OpGetTask, func(c *Call) bool { return c.ID == sub.ID })
				_, err = e.rt.Submit(context.Background(), "k", result("never"), owner)
				if err != nil || try == 10 {
					break
				}
			}
			require.ErrorIs(t, err, ErrInjected)
			again, err := e.rt.Submit(context.Background(), "k", result("never"), owner)
			require.NoError(t, err)
			assert.True(t, again.Joined, "the resubmission joins the live run")
			assert.Equal(t, sub.RunID, again.RunID)
			close(release)
			snap := e.wait(sub.ID)
			assert.Equal(t, workers.StatusCompleted, snap.Status)
		})
	}
}

// Another owner joins a live global task and the append of its watcher
// fails: Submit returns the error, the run goes on, and the join, made
// again, lands (or finds the watcher already there) and grants access.
func faultJoinWatcher(t *testing.T, newStore func(*testing.T) workers.Store) {
	for _, fault := range bothFaults {
		t.Run(fault.String(), func(t *testing.T) {
			t.Parallel()
			e := newFaultEnv(t, newStore, workers.Config{})
			e.mem.SetWatchAuthorizer(func(string, []string, string) bool { return true })
			joiner := workers.MustOwner("bob")
			global := workers.WithScope(workers.ScopeGlobal)
			started, release := make(chan struct{}), make(chan struct{})
			sub, err := e.rt.Submit(context.Background(), "shared", blocked(started, release), owner, global)
			require.NoError(t, err)
			<-started
			e.once(fault, OpAddWatcher, nil)
			_, err = e.rt.Submit(context.Background(), "shared", result("never"), joiner, global)
			require.ErrorIs(t, err, ErrInjected)
			again, err := e.rt.Submit(context.Background(), "shared", result("never"), joiner, global)
			require.NoError(t, err)
			assert.True(t, again.Joined)
			assert.Equal(t, sub.RunID, again.RunID)
			close(release)
			snap := e.wait(sub.ID)
			assert.Equal(t, workers.StatusCompleted, snap.Status)
			_, err = e.rt.Status(context.Background(), sub.ID, joiner)
			assert.NoError(t, err, "the joiner is a watcher")
		})
	}
}

// Every lease renewal fails, before it reaches the store or after it
// extended the lease: the runtime cannot tell that its lease lives, so
// once a TTL has passed it abandons its runs, which end FAILED as
// abandoned instead of staying live, and a submission, whose own renewal
// fails, registers nothing; once the store heals, the keys run. Skipped
// for a store without leases.
func faultLeaseRenewal(t *testing.T, newStore func(*testing.T) workers.Store) {
	if _, ok := newStore(t).(workers.Leaser); !ok {
		t.Skip("the store does not implement workers.Leaser")
	}
	for _, fault := range bothFaults {
		t.Run(fault.String(), func(t *testing.T) {
			t.Parallel()
			e := newFaultEnv(t, newStore, workers.Config{LeaseInterval: 50 * time.Millisecond})
			started, release := make(chan struct{}), make(chan struct{})
			defer close(release)
			sub, err := e.rt.Submit(context.Background(), "k", blocked(started, release), owner)
			require.NoError(t, err)
			// On a loaded machine the lease, renewed every 50 ms, may lapse
			// before the run begins: the run is then abandoned without
			// starting, as the assertions below expect of it anyway.
			ended := make(chan struct{})
			go func() {
				defer close(ended)
				_, _ = e.rt.Wait(t.Context(), sub.ID, workers.System)
			}()
			select {
			case <-started:
			case <-ended:
			}
			e.f.Add(Rule{Op: OpRenewLease, Fault: fault})
			snap := e.wait(sub.ID)
			assert.Equal(t, workers.StatusFailed, snap.Status)
			assert.ErrorIs(t, snap.Err(), workers.ErrAbandoned)
			// A run abandoned because the lease lapsed before the fault
			// (on a loaded machine) ends before the lease, taken anew,
			// is lost under the fault: wait for Ready to say it is.
			require.Eventually(t, func() bool { return e.rt.Ready(context.Background()) != nil },
				10*time.Second, 5*time.Millisecond, "the lease still held while every renewal fails")
			// The lease is lost: a submission renews it first, that renewal
			// fails too (landed or not), and nothing is registered.
			_, err = e.rt.Submit(context.Background(), "during", result("done"), owner)
			assert.ErrorContains(t, err, "renewing the instance lease")
			id, err := workers.ScopedTaskKey("during", owner)
			require.NoError(t, err)
			_, err = e.mem.GetTask(context.Background(), id)
			assert.ErrorIs(t, err, workers.ErrNotFound, "registered on a lost lease")
			e.f.Heal()
			e.completesOnceLeased("k")
			e.completesOnceLeased("during")
		})
	}
}

// completesOnceLeased is completes for a runtime whose lease may be
// lost: the store healed, but a renewal made once the lease ran out is
// bounded by one LeaseInterval, 50 ms in these tests, which
// a loaded database may miss, and the lease may lapse again. Such a
// submission fails with the lease's error and registers nothing, or, if
// the lease lapses once it registered, its run ends FAILED as abandoned;
// key is submitted again until it completes, for at most 10 s.
func (e *faultEnv) completesOnceLeased(key string) {
	e.t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for {
		sub, err := e.rt.Submit(context.Background(), key, result("done"), owner)
		if err == nil {
			require.False(e.t, sub.Joined, "a resubmission joined run %q", sub.RunID)
			snap := e.wait(sub.ID)
			if snap.Status == workers.StatusFailed && errors.Is(snap.Err(), workers.ErrAbandoned) {
				err = fmt.Errorf("run %s abandoned: %w", sub.RunID, snap.Err())
			} else {
				require.Equal(e.t, workers.StatusCompleted, snap.Status, "error %q", snap.Error)
				return
			}
		} else {
			require.ErrorContains(e.t, err, "the instance lease")
		}
		select {
		case <-tick.C:
		case <-deadline:
			e.t.Fatalf("%q did not complete within 10s of the store healing: %v", key, err)
		}
	}
}
