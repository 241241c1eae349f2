package workers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A listener is not told of the writes made for its own origin: a
// runtime's run writes (its context names it) and the records it inserts
// under its own run ids. It is told of everyone else's, in order.
func TestMemStoreSparesAListenerItsOwnWrites(t *testing.T) {
	s := NewMemStore()
	mine := context.WithValue(ctx, originKey{}, "inst-a")
	theirs := context.WithValue(ctx, originKey{}, "inst-b")
	lctx, stop := context.WithCancel(mine)
	heard := make(chan Change, 16)
	done := make(chan error, 1)
	go func() { done <- s.Listen(lctx, func(c Change) { heard <- c }) }()
	require.True(t, (<-heard).Resync, "the first notice is a Resync")

	require.NoError(t, s.InsertTask(ctx, Record{ID: "mine", RunID: "inst-a.1", State: State{Status: StatusPending}}))
	ok, err := s.TransitionTask(mine, "mine", "inst-a.1", fromPending, State{Status: StatusRunning, Attempt: 1})
	require.True(t, ok)
	require.NoError(t, err)
	require.NoError(t, s.InsertTask(theirs, Record{ID: "theirs", RunID: "inst-b.1", State: State{Status: StatusPending}}))
	require.NoError(t, s.InsertTask(ctx, Record{ID: "anyone", RunID: "x.1", State: State{Status: StatusPending}}))
	assert.Equal(t, Change{ID: "theirs", RunID: "inst-b.1", Status: StatusPending}, <-heard)
	assert.Equal(t, Change{ID: "anyone", RunID: "x.1", Status: StatusPending}, <-heard)
	stop()
	assert.ErrorIs(t, <-done, context.Canceled)
	assert.Empty(t, heard, "the listener's own write was not queued")
}

// errorCounter is a slog.Handler that counts the errors logged.
type errorCounter struct{ n *atomic.Int32 }

func (h errorCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelError }
func (h errorCounter) Handle(context.Context, slog.Record) error    { h.n.Add(1); return nil }
func (h errorCounter) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h errorCounter) WithGroup(string) slog.Handler                { return h }

// Over a MemStore, a runtime takes a lease with its first submission,
// and the Shutdown that settles everything releases it, once: a second
// Shutdown does not try again with its spent context (which logged an
// error).
func TestShutdownReleasesTheLeaseOnce(t *testing.T) {
	var errs atomic.Int32
	s := NewMemStore()
	rt := NewRuntime(s, Config{Logger: slog.New(errorCounter{&errs})})
	sub, err := rt.Submit(ctx, "k", noop, alice)
	require.NoError(t, err)
	settled(t, rt, sub.ID)
	live, err := s.LiveInstances(ctx)
	require.NoError(t, err)
	assert.Contains(t, live, rt.instance)
	require.NoError(t, rt.Shutdown(ctx))
	require.NoError(t, rt.Shutdown(ctx))
	live, err = s.LiveInstances(ctx)
	require.NoError(t, err)
	assert.NotContains(t, live, rt.instance)
	assert.Zero(t, errs.Load(), "errors logged")
}

// A writer never waits for a listener: while one is busy, notices of a
// task coalesce into its latest, and past maxPendingNotices tasks the
// queue is dropped for a single Resync, so memory stays bounded.
func TestMemStoreNoticesCoalesceAndStayBounded(t *testing.T) {
	for _, c := range []struct {
		name  string
		tasks int
		want  []Change
	}{
		{"Coalesced", 2, []Change{
			{ID: "t0", RunID: "r.1", Status: StatusRunning},
			{ID: "t1", RunID: "r.1", Status: StatusRunning},
		}},
		{"Overflow", maxPendingNotices + 1, []Change{{Resync: true}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := NewMemStore()
			lctx, stop := context.WithCancel(ctx)
			busy, release := make(chan struct{}), make(chan struct{})
			var heard []Change
			done := make(chan error, 1)
			go func() {
				done <- s.Listen(lctx, func(ch Change) {
					if ch.Resync && len(heard) == 0 {
						close(busy)
						<-release // the listener is busy while the writes happen
					}
					heard = append(heard, ch)
					if len(heard) == 1+len(c.want) {
						stop()
					}
				})
			}()
			<-busy
			for i := range c.tasks {
				id := fmt.Sprint("t", i)
				require.NoError(t, s.InsertTask(ctx, Record{ID: id, RunID: "r.1", State: State{Status: StatusPending}}))
				ok, err := s.TransitionTask(ctx, id, "r.1", fromPending, State{Status: StatusRunning, Attempt: 1})
				require.True(t, ok)
				require.NoError(t, err)
			}
			close(release)
			assert.ErrorIs(t, <-done, context.Canceled)
			assert.Equal(t, c.want, heard[1:])
		})
	}
}

// fullState returns a State with every field set to a value that is not
// its zero, found by reflection, so that a field added to State and
// forgotten by the compact record fails the round trip below.
func fullState(t *testing.T, status Status) State {
	st := State{Status: status}
	v := reflect.ValueOf(&st).Elem()
	at := time.Date(2026, 12, 3, 10, 0, 0, 123456000, time.UTC)
	for i := range v.NumField() {
		f := v.Field(i)
		switch {
		case v.Type().Field(i).Name == "Status":
		case f.Type() == reflect.TypeOf(time.Time{}):
			f.Set(reflect.ValueOf(at.Add(time.Duration(i) * time.Second)))
		case f.Type() == reflect.TypeOf(json.RawMessage(nil)):
			f.SetBytes([]byte(`{"n":1}`))
		case f.Kind() == reflect.String:
			f.SetString(fmt.Sprintf("text %d", i))
		case v.Type().Field(i).Name == "Progress":
			f.SetInt(100) // the largest CheckState allows, kept whole
		case v.Type().Field(i).Name == "Attempt":
			f.SetInt(math.MaxInt32)
		default:
			t.Fatalf("fullState does not know State.%s (%s)", v.Type().Field(i).Name, f.Type())
		}
	}
	return st
}

// A MemStore keeps a waiting record small and apart from what only a
// started or ended one has, but gives back every field as written, and
// nothing it hands out changes with a later write.
func TestMemStoreCompactRecordKeepsEveryField(t *testing.T) {
	s := NewMemStore()
	full := fullState(t, StatusFailed)
	rec := Record{ID: "alice::k", RunID: "i.1", Queue: "q", Watchers: []string{"alice", "bob", "carol"},
		CreatedAt: time.Date(2026, 12, 3, 9, 0, 0, 1000, time.UTC), State: full}
	require.NoError(t, s.InsertTask(ctx, rec))
	got, err := s.GetTask(ctx, rec.ID)
	require.NoError(t, err)
	require.Equal(t, rec, got, "a record inserted whole comes back whole")

	// Back to PENDING: the outcome is gone, and what was handed out stays.
	ok, err := s.TransitionTask(ctx, rec.ID, rec.RunID, []Status{StatusFailed}, State{Status: StatusPending})
	require.NoError(t, err)
	require.True(t, ok)
	again, err := s.GetTask(ctx, rec.ID)
	require.NoError(t, err)
	require.Equal(t, State{Status: StatusPending}, again.State)
	require.Equal(t, full, got.State, "a record handed out does not change with a later write")

	// And whole again, through each writer.
	full = fullState(t, StatusCancelled)
	ok, err = s.TransitionTask(ctx, rec.ID, rec.RunID, []Status{StatusPending}, full)
	require.NoError(t, err)
	require.True(t, ok)
	again, err = s.GetTask(ctx, rec.ID)
	require.NoError(t, err)
	require.Equal(t, full, again.State)
	rec.State = fullState(t, StatusRunning)
	require.NoError(t, s.SetTask(ctx, rec))
	listed, err := s.ListTasks(ctx, Filter{VisibleTo: "bob"})
	require.NoError(t, err)
	require.Equal(t, []Record{rec}, listed)
}

// A run that completed plainly (no result, no error, the cause its
// status implies) keeps only its times apart from its record: its start
// and its end cost no allocation once the record has room for its times,
// and every field still comes back as written, a cause that differs from
// its status's included.
func TestMemStorePlainOutcomeKeepsOnlyItsTimes(t *testing.T) {
	s, rec := storeWithARun(t)
	at := rec.CreatedAt
	r, _ := s.shard(rec.ID).recs.get(rec.ID)
	require.NotNil(t, r.rest)
	require.Nil(t, r.rest.outcome, "a RUNNING record keeps no outcome")

	running, completed := []Status{StatusRunning}, []Status{StatusCompleted}
	done := State{Status: StatusCompleted, Attempt: 1, Progress: 100, StartedAt: at, CompletedAt: at.Add(time.Second), Cause: CauseCompleted}
	allocs := testing.AllocsPerRun(20, func() {
		ok, err := s.TransitionTask(ctx, rec.ID, rec.RunID, running, done)
		require.NoError(t, err)
		require.True(t, ok)
		ok, err = s.TransitionTask(ctx, rec.ID, rec.RunID, completed, rec.State)
		require.NoError(t, err)
		require.True(t, ok)
	})
	assert.Zero(t, allocs, "a plain end and a start keep their times in place")

	for _, st := range []State{
		done,
		{Status: StatusCompleted, Attempt: 1, StartedAt: at, CompletedAt: at, Cause: CauseCompleted, Result: json.RawMessage(`{"n":1}`)},
		{Status: StatusCompleted, Attempt: 1, StartedAt: at, CompletedAt: at}, // a cause other than its status implies
		fullState(t, StatusFailed),
		done,
	} {
		from := []Status{StatusRunning, StatusCompleted, StatusFailed}
		ok, err := s.TransitionTask(ctx, rec.ID, rec.RunID, from, st)
		require.NoError(t, err)
		require.True(t, ok)
		got, err := s.GetTask(ctx, rec.ID)
		require.NoError(t, err)
		require.Equal(t, st, got.State)
		plain := st.Result == nil && st.Cause == CauseCompleted && st.Error == ""
		assert.Equal(t, plain, r.rest.outcome == nil, "an outcome is kept apart only when it says more than its status: %+v", st)
	}
}

// A waiting queue item holds little: its Task (and, only once someone
// subscribes to events, its runState), and a PENDING record the
// MemStore keeps in one small allocation, watchers included. These are
// the budgets BenchmarkQueued's bytes per task rest on.
func TestWaitingItemFootprint(t *testing.T) {
	assert.LessOrEqual(t, unsafe.Sizeof(Task{}), uintptr(144), "a Task fits the 144-byte size class")
	assert.LessOrEqual(t, unsafe.Sizeof(asyncTask{}), uintptr(240), "an async Task and its state fit the 240-byte size class")
	assert.LessOrEqual(t, unsafe.Sizeof(memRecord{}), uintptr(96), "a PENDING record fits the 96-byte size class")

	s := NewMemStore()
	ids := make([]string, 400) // for leastAllocsPerRun's 3*101 calls
	for i := range ids {
		ids[i] = fmt.Sprintf("alice::%d", i)
	}
	watchers := []string{"alice"}
	i := 0
	joined := make([]string, len(ids)) // a run's ids, as its runtime inserts them (see runIDs)
	for i, id := range ids {
		joined[i] = id + "i.1"
	}
	allocs := leastAllocsPerRun(100, func() {
		rec := Record{ID: ids[i], RunID: "i.1", Queue: "q", Watchers: watchers,
			CreatedAt: time.Unix(int64(i), 0), State: State{Status: StatusPending}}
		if _, err := s.insert(ctx, rec, joined[i]); err != nil {
			t.Fatal(err)
		}
		i++
	})
	// Beyond the record, the indexes and the map grow by amortized
	// appends. InsertTask joins the ids itself, in one more.
	assert.LessOrEqual(t, allocs, 1.2, "a PENDING record costs one allocation")
	r, _ := s.shard("alice::7").recs.get("alice::7")
	require.NotNil(t, r)
	assert.Nil(t, r.rest, "a PENDING record has nothing apart")
}

// A record's one watcher, kept inline, becomes a list of its own with a
// join; what was handed out before is unchanged.
func TestMemStoreWatcherJoinsKeepHandedOutRecords(t *testing.T) {
	s := NewMemStore()
	rec := Record{ID: "alice::k", RunID: "i.1", Watchers: []string{"alice"}, State: State{Status: StatusRunning, Attempt: 1}}
	require.NoError(t, s.InsertTask(ctx, rec))
	one, err := s.GetTask(ctx, rec.ID)
	require.NoError(t, err)
	for _, w := range []string{"bob", "carol"} {
		added, err := s.AddWatcher(ctx, rec.ID, rec.RunID, w)
		require.NoError(t, err)
		require.True(t, added)
	}
	again, err := s.AddWatcher(ctx, rec.ID, rec.RunID, "bob")
	require.NoError(t, err)
	require.False(t, again, "a watcher is added once")
	all, err := s.GetTask(ctx, rec.ID)
	require.NoError(t, err)
	assert.Equal(t, []string{"alice", "bob", "carol"}, all.Watchers)
	assert.Equal(t, []string{"alice"}, one.Watchers, "a record handed out before the joins")
	for _, u := range []string{"alice", "bob", "carol"} {
		listed, err := s.ListTasks(ctx, Filter{VisibleTo: u})
		require.NoError(t, err)
		require.Len(t, listed, 1, "%s's listing", u)
		assert.Equal(t, all, listed[0])
	}
}

// A MemStore keeps times to the microsecond and gives them back in UTC,
// the zero time and times before 1970 included, and refuses a time it
// cannot hold without writing anything.
func TestMemStoreKeepsTimesToTheMicrosecond(t *testing.T) {
	s := NewMemStore()
	east := time.FixedZone("east", 5*3600)
	for i, at := range []time.Time{
		time.Date(2026, 12, 4, 9, 0, 0, 123456789, east),
		time.Date(1500, 2, 3, 4, 5, 6, 999, time.UTC),
		{},
	} {
		rec := Record{ID: fmt.Sprintf("alice::t%d", i), RunID: "i.1", CreatedAt: at,
			State: State{Status: StatusRunning, Attempt: 1, StartedAt: at}}
		require.NoError(t, s.InsertTask(ctx, rec))
		got, err := s.GetTask(ctx, rec.ID)
		require.NoError(t, err)
		want := at.Truncate(time.Microsecond).UTC()
		if at.IsZero() {
			want = time.Time{}
		}
		assert.Equal(t, want, got.CreatedAt, "CreatedAt of %v", at)
		assert.Equal(t, want, got.StartedAt, "StartedAt of %v", at)
	}

	kept := Record{ID: "alice::kept", RunID: "i.1", CreatedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		State: State{Status: StatusPending}}
	require.NoError(t, s.InsertTask(ctx, kept))
	for _, far := range []time.Time{time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-300000, 1, 1, 0, 0, 0, 0, time.UTC)} {
		rec := Record{ID: "alice::far", RunID: "i.1", CreatedAt: far, State: State{Status: StatusPending}}
		assert.ErrorIs(t, s.InsertTask(ctx, rec), ErrInvalidData, "CreatedAt %v", far)
		st := State{Status: StatusRunning, Attempt: 1, StartedAt: far}
		_, err := s.TransitionTask(ctx, kept.ID, kept.RunID, []Status{StatusPending}, st)
		assert.ErrorIs(t, err, ErrInvalidData, "StartedAt %v", far)
		kept2 := kept
		kept2.State = State{Status: StatusFailed, CompletedAt: far}
		assert.ErrorIs(t, s.SetTask(ctx, kept2), ErrInvalidData, "CompletedAt %v", far)
		replacement := rec
		replacement.ID = kept.ID
		assert.ErrorIs(t, s.ReplaceTask(ctx, replacement, kept.RunID), ErrInvalidData, "CreatedAt %v", far)
	}
	// A time within the zero time's microsecond would read back as the
	// zero time: refused too.
	nearZero := Record{ID: "alice::far", RunID: "i.1", CreatedAt: time.Time{}.Add(time.Nanosecond), State: State{Status: StatusPending}}
	assert.ErrorIs(t, s.InsertTask(ctx, nearZero), ErrInvalidData)
	_, err := s.GetTask(ctx, "alice::far")
	assert.ErrorIs(t, err, ErrNotFound)
	got, err := s.GetTask(ctx, kept.ID)
	require.NoError(t, err)
	assert.Equal(t, kept, got, "a refused write leaves the record as it was")
}

// A cursor finer than a microsecond pages exactly as Filter.Match says,
// in either order: the records a MemStore keeps to the microsecond sit
// strictly on one side of it.
func TestMemStorePagesFromACursorFinerThanItsTimes(t *testing.T) {
	s := NewMemStore()
	at := time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)
	var all []Record
	for i, id := range []string{"alice::a", "alice::b", "alice::c", "alice::d"} {
		rec := Record{ID: id, RunID: "i.1", Watchers: []string{"alice"},
			CreatedAt: at.Add(time.Duration(i/2) * time.Microsecond), State: State{Status: StatusPending}}
		require.NoError(t, s.InsertTask(ctx, rec))
		all = append(all, rec)
	}
	for _, order := range []Order{OldestFirst, NewestFirst} {
		for _, user := range []string{"", "alice"} {
			for _, cursor := range []Position{
				{CreatedAt: at.Add(500 * time.Nanosecond), ID: "alice::a"},
				{CreatedAt: at.Add(500 * time.Nanosecond), ID: "alice::z"},
				{CreatedAt: at.Add(-500 * time.Nanosecond), ID: "alice::c"},
				{CreatedAt: at, ID: "alice::a"},
			} {
				f := Filter{VisibleTo: user, Order: order, After: &cursor}
				var want []Record
				for _, r := range all {
					if f.Match(&r) {
						want = append(want, r)
					}
				}
				slices.SortFunc(want, func(a, b Record) int { return f.Compare(&a, &b) })
				got, err := s.ListTasks(ctx, f)
				require.NoError(t, err)
				assert.Equal(t, want, got, "order %v, user %q, after %v", order, user, cursor)
			}
		}
	}
}

// DeleteFinished walks a large store in batches: it deletes exactly the
// terminal records completed before the cutoff across every batch, and
// a context that ends between two batches stops it there, with the count
// deleted so far.
func TestMemStoreDeleteFinishedInBatches(t *testing.T) {
	s := NewMemStore()
	t0 := time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)
	const n = 2*pruneBatchSize + 500
	statuses := []Status{StatusPending, StatusRunning, StatusCompleted, StatusFailed, StatusCancelled}
	old := 0
	for i := range n {
		st := State{Status: statuses[i%len(statuses)]}
		if st.Status.Terminal() {
			st.StartedAt, st.CompletedAt = t0, t0.Add(time.Duration(i%3)*time.Hour) // 0 h, 1 h, 2 h
			if i%3 == 0 {
				old++
				st.Error = "done" // and not plain: the outcome apart goes too
			}
		}
		rec := Record{ID: fmt.Sprintf("alice::k%05d", i), RunID: "i.1", Watchers: []string{"alice", "bob"}, CreatedAt: t0.Add(-time.Duration(n-i) * time.Second), State: st}
		require.NoError(t, s.InsertTask(ctx, rec))
	}
	cutoff := t0.Add(30 * time.Minute)

	stop := &endsAfter{Context: ctx, checks: 2} // ends before the second batch
	deleted, err := s.DeleteFinished(stop, cutoff)
	require.ErrorIs(t, err, context.Canceled)
	require.Positive(t, deleted)
	require.Less(t, deleted, old, "stopped after the first batch")

	more, err := s.DeleteFinished(ctx, cutoff)
	require.NoError(t, err)
	require.Equal(t, old, deleted+more)
	left, err := s.ListTasks(ctx, Filter{})
	require.NoError(t, err)
	require.Len(t, left, n-old)
	for _, rec := range left {
		require.False(t, rec.Status.Terminal() && rec.CompletedAt.Before(cutoff), "%s kept", rec.ID)
	}
	for _, u := range []string{"alice", "bob"} {
		mine, err := s.ListTasks(ctx, Filter{VisibleTo: u})
		require.NoError(t, err)
		require.Len(t, mine, n-old, "%s's index", u)
	}
}

// endsAfter is a context whose Err is nil for its first checks-1 calls
// and context.Canceled from then on.
type endsAfter struct {
	context.Context
	checks int
}

func (c *endsAfter) Err() error {
	if c.checks--; c.checks > 0 {
		return nil
	}
	return context.Canceled
}

// DeleteFinished walks up to the record that was the newest when it
// began: records written meanwhile, after it, are left for the next call,
// so a stream of new records cannot keep the walk going.
func TestMemStoreDeleteFinishedEndsAtTheNewestRecordItFound(t *testing.T) {
	s := NewMemStore()
	t0 := time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)
	expired := func(i int) Record {
		return Record{ID: fmt.Sprintf("alice::k%05d", i), RunID: "i.1", Watchers: []string{"alice"},
			CreatedAt: t0.Add(time.Duration(i) * time.Second),
			State:     State{Status: StatusCompleted, Attempt: 1, StartedAt: t0, CompletedAt: t0, Cause: CauseCompleted}}
	}
	const n = 2*pruneBatchSize + 10
	for i := range n {
		require.NoError(t, s.InsertTask(ctx, expired(i)))
	}
	// Between batches, a newer expired record arrives.
	next := n
	between := &hookedErr{Context: ctx, hook: func(call int) {
		if call > 1 {
			require.NoError(t, s.InsertTask(ctx, expired(next)))
			next++
		}
	}}
	deleted, err := s.DeleteFinished(between, t0.Add(time.Hour))
	require.NoError(t, err)
	require.Equal(t, n, deleted)
	left, err := s.ListTasks(ctx, Filter{})
	require.NoError(t, err)
	require.Len(t, left, next-n, "the records that arrived during the walk")
}

// hookedErr is a context that calls hook with the call's number each time
// its Err is checked.
type hookedErr struct {
	context.Context
	hook  func(call int)
	calls int
}

func (c *hookedErr) Err() error {
	c.calls++
	c.hook(c.calls)
	return c.Context.Err()
}

// A write of a record's state takes only its shard's lock: an insert
// (which holds the lock of the listing indexes) does not hold it up.
func TestMemStoreStateWriteDoesNotWaitForAnInsert(t *testing.T) {
	s, rec := storeWithARun(t)
	at := rec.CreatedAt

	s.mu.Lock() // an insert of another record under way
	wrote := make(chan error, 1)
	go func() {
		_, err := s.TransitionTask(ctx, rec.ID, rec.RunID, []Status{StatusRunning},
			State{Status: StatusCompleted, Attempt: 1, Progress: 100, StartedAt: at, CompletedAt: at, Cause: CauseCompleted})
		wrote <- err
	}()
	select {
	case err := <-wrote:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("a state write waited for an insert")
	}
	s.mu.Unlock()
	got, err := s.GetTask(ctx, rec.ID)
	require.NoError(t, err)
	assert.Equal(t, StatusCompleted, got.Status)
}

// A run's writes go to the record it registered (MemStore.transition)
// only while the store still holds that record: once it was replaced,
// pruned or cleared they go by the id, as TransitionTask's do.
func TestMemStoreWriteToAKeptRecordFollowsTheStore(t *testing.T) {
	at := time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)
	running := Record{ID: "alice::k", RunID: "i.1", Watchers: []string{"alice"}, CreatedAt: at,
		State: State{Status: StatusRunning, Attempt: 1, StartedAt: at}}
	done := State{Status: StatusCompleted, Attempt: 1, StartedAt: at, CompletedAt: at, Cause: CauseCompleted}

	t.Run("replaced", func(t *testing.T) {
		s := NewMemStore()
		r, err := s.insert(ctx, running, "")
		require.NoError(t, err)
		next := running
		next.RunID, next.State = "i.2", State{Status: StatusPending}
		nr, err := s.replace(ctx, next, "", "i.1")
		require.NoError(t, err)

		ok, err := s.transition(ctx, running.ID, r, "i.1", []Status{StatusRunning}, done)
		require.NoError(t, err)
		assert.False(t, ok, "the replaced run is fenced out")
		ok, err = s.transition(ctx, running.ID, r, "i.2", []Status{StatusPending}, State{Status: StatusRunning, Attempt: 1, StartedAt: at})
		require.NoError(t, err)
		assert.True(t, ok, "a write by id finds the record that replaced it")
		got, err := s.GetTask(ctx, running.ID)
		require.NoError(t, err)
		assert.Equal(t, "i.2", got.RunID)
		assert.Equal(t, StatusRunning, got.Status)
		assert.Equal(t, StatusRunning, nr.Status(), "the record kept by the new run is the stored one")
	})
	t.Run("cleared", func(t *testing.T) {
		s := NewMemStore()
		r, err := s.insert(ctx, running, "")
		require.NoError(t, err)
		require.NoError(t, s.ClearRecords(ctx))
		_, err = s.transition(ctx, running.ID, r, "i.1", []Status{StatusRunning}, done)
		assert.ErrorIs(t, err, ErrNotFound)
	})
	t.Run("pruned", func(t *testing.T) {
		s := NewMemStore()
		ended := running
		ended.State = done
		r, err := s.insert(ctx, ended, "")
		require.NoError(t, err)
		n, err := s.DeleteFinished(ctx, at.Add(time.Hour))
		require.NoError(t, err)
		require.Equal(t, 1, n)
		_, err = s.transition(ctx, running.ID, r, "i.1", []Status{StatusCompleted}, done)
		assert.ErrorIs(t, err, ErrNotFound)
	})
}

// The calls that hand a runtime its record, and the write to a kept
// record, fail before they land when their context has ended, as the
// Store methods do: the store is left as it was. (A MemStore call
// cannot fail after it lands; the fault cases of storetest put the store
// behind a wrapper, which takes the runtime's path by id.)
func TestMemStoreKeptRecordCallsFailBeforeLanding(t *testing.T) {
	at := time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)
	running := Record{ID: "alice::k", RunID: "i.1", Watchers: []string{"alice"}, CreatedAt: at,
		State: State{Status: StatusRunning, Attempt: 1, StartedAt: at}}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	s := NewMemStore()

	_, err := s.insert(ended, running, "")
	require.ErrorIs(t, err, context.Canceled)
	_, err = s.GetTask(ctx, running.ID)
	require.ErrorIs(t, err, ErrNotFound, "a failed insert stores nothing")

	r, err := s.insert(ctx, running, "")
	require.NoError(t, err)
	next := running
	next.RunID, next.State = "i.2", State{Status: StatusPending}
	_, err = s.replace(ended, next, "", "i.1")
	require.ErrorIs(t, err, context.Canceled)
	ok, err := s.transition(ended, running.ID, r, "i.1", []Status{StatusRunning},
		State{Status: StatusCompleted, Attempt: 1, StartedAt: at, CompletedAt: at, Cause: CauseCompleted})
	require.ErrorIs(t, err, context.Canceled)
	assert.False(t, ok)
	got, err := s.GetTask(ctx, running.ID)
	require.NoError(t, err)
	assert.Equal(t, running, got, "neither the failed replace nor the failed write landed")
}

// A queue item whose record is deleted while it waits never starts,
// though the run kept the record it registered.
func TestQueueItemWhoseRecordWasDeletedDoesNotStart(t *testing.T) {
	s := NewMemStore()
	rt := newRuntime(t, s, Config{})
	g := newGate()
	_, err := rt.SubmitSequential(ctx, "q", "first", g.fn, alice)
	require.NoError(t, err)
	wait(t, g.started, "the first item to start")
	ran := make(chan struct{})
	_, err = rt.SubmitSequential(ctx, "q", "second", func(context.Context, *Task) (any, error) {
		close(ran)
		return nil, nil
	}, alice)
	require.NoError(t, err)
	second := rt.runs.get("alice::second")
	require.NotNil(t, second)
	kept, err := s.GetTask(ctx, "alice::second")
	require.NoError(t, err)
	require.NotNil(t, second.rec, "the run keeps its record")
	require.Equal(t, kept.RunID, second.rec.runID())
	require.NoError(t, s.ClearRecords(ctx))
	g.open()
	eventually(t, func() bool {
		info, err := rt.QueueStatus(ctx, "q", System)
		require.NoError(t, err)
		return info.State == QueueIdle
	}, "the queue to drain")
	select {
	case <-ran:
		t.Fatal("an item whose record was deleted started")
	default:
	}
	_, err = s.GetTask(ctx, "alice::second")
	assert.ErrorIs(t, err, ErrNotFound)
}

// Inserts, state writes, joins, re-runs, reads, listings and pruning run
// at once (the race detector checks the locking), and what is left reads
// the same through GetTask and ListTasks.
func TestMemStoreConcurrentCallsAgree(t *testing.T) {
	s := NewMemStore()
	at := time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)
	const writers, keys = 4, 256
	var wg, listers sync.WaitGroup
	var done atomic.Bool
	for w := range writers {
		wg.Go(func() {
			for i := range keys {
				id := fmt.Sprintf("alice::%d", (w*keys+i)%(keys*writers/2)) // writers share half the ids
				run := fmt.Sprintf("i%d.%d", w, i)
				rec := Record{ID: id, RunID: run, Watchers: []string{"alice"}, CreatedAt: at.Add(time.Duration(i) * time.Microsecond),
					State: State{Status: StatusRunning, Attempt: 1, StartedAt: at}}
				if err := s.InsertTask(ctx, rec); errors.Is(err, ErrConflict) {
					old, err := s.GetTask(ctx, id)
					if err != nil {
						continue // pruned since
					}
					if err := s.ReplaceTask(ctx, rec, old.RunID); err != nil && !errors.Is(err, ErrConflict) && !errors.Is(err, ErrNotFound) {
						t.Error(err)
					}
				} else if err != nil {
					t.Error(err)
				}
				if _, err := s.AddWatcher(ctx, id, run, fmt.Sprint("w", w)); err != nil && !errors.Is(err, ErrConflict) && !errors.Is(err, ErrNotFound) {
					t.Error(err)
				}
				if _, err := s.TransitionTask(ctx, id, run, []Status{StatusRunning},
					State{Status: StatusCompleted, Attempt: 1, Progress: 100, StartedAt: at, CompletedAt: at, Cause: CauseCompleted}); err != nil && !errors.Is(err, ErrNotFound) {
					t.Error(err)
				}
			}
		})
	}
	listers.Go(func() {
		for !done.Load() {
			if _, err := s.ListTasks(ctx, Filter{VisibleTo: "alice", Statuses: []Status{StatusCompleted}}); err != nil {
				t.Error(err)
			}
			if _, err := s.DeleteFinished(ctx, at.Add(time.Nanosecond)); err != nil {
				t.Error(err)
			}
		}
	})
	wg.Wait()
	done.Store(true)
	listers.Wait()

	listed, err := s.ListTasks(ctx, Filter{})
	require.NoError(t, err)
	for _, rec := range listed {
		got, err := s.GetTask(ctx, rec.ID)
		require.NoError(t, err)
		assert.Equal(t, rec, got)
	}
	n, err := s.DeleteFinished(ctx, at.Add(time.Nanosecond))
	require.NoError(t, err)
	assert.Equal(t, len(listed), n, "every record left had completed")
	listed, err = s.ListTasks(ctx, Filter{})
	require.NoError(t, err)
	assert.Empty(t, listed)
}

// storeWithARun returns a MemStore holding one RUNNING record, and the
// record.
func storeWithARun(t *testing.T) (*MemStore, Record) {
	t.Helper()
	s := NewMemStore()
	at := time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)
	rec := Record{ID: "alice::k", RunID: "i.1", Watchers: []string{"alice"}, CreatedAt: at,
		State: State{Status: StatusRunning, Attempt: 1, StartedAt: at}}
	require.NoError(t, s.InsertTask(ctx, rec))
	return s, rec
}

// A runtime builds its runs' records for a MemStore itself, without the
// checks a record from outside passes: each must be what those checks
// pass and newMemRecord makes of the run's Record.
func TestRunRecordIsWhatTheStoreWouldMake(t *testing.T) {
	rt := memRuntime(t)
	for _, tc := range []struct {
		name    string
		queue   string
		c       caller
		o       submitOptions
		started bool
	}{
		{"async", "", caller{userID: "alice"}, submitOptions{}, true},
		{"queued", "q", caller{userID: "alice"}, submitOptions{}, false},
		{"watched", "", caller{userID: "alice"}, submitOptions{watchers: []string{"bob", "carol"}}, true},
		{"system", "q", caller{system: true}, submitOptions{watchers: []string{"bob"}}, false},
		{"unwatched system", "", caller{system: true}, submitOptions{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tk := rt.newRun(ctx, "alice::k", tc.queue, tc.c, tc.o, noop)
			tk.startsRegistered = tc.started
			rec := tk.record()
			require.NoError(t, checkRecord(&rec))
			require.NoError(t, checkMemTimes(rec.CreatedAt, rec.StartedAt, rec.CompletedAt))
			want := newMemRecord(&rec, tk.ids)
			got := tk.memRecord()
			if tc.started {
				require.NotNil(t, got.rest)
				require.Equal(t, *want.rest, *got.rest)
				want.rest, got.rest = nil, nil
			}
			require.Equal(t, want, got)
		})
	}
}

// A MemStore keeps watchers as a set: a watcher InsertTask or ReplaceTask
// is given twice is kept once, where it first appears. A list without
// duplicates, every list a runtime gives, is kept without a copy more.
func TestMemStoreKeepsWatchersOnce(t *testing.T) {
	s := NewMemStore()
	rec := Record{ID: "alice::k", RunID: "i.1", Watchers: []string{"bob", "alice", "bob", "carol", "alice"},
		State: State{Status: StatusCompleted, CompletedAt: time.Now()}}
	require.NoError(t, s.InsertTask(ctx, rec))
	got, err := s.GetTask(ctx, rec.ID)
	require.NoError(t, err)
	assert.Equal(t, []string{"bob", "alice", "carol"}, got.Watchers)
	assert.Equal(t, []string{"bob", "alice", "bob", "carol", "alice"}, rec.Watchers, "the caller's slice is left as it was")

	next := Record{ID: rec.ID, RunID: "i.2", Watchers: []string{"dave", "dave"}, State: State{Status: StatusPending}}
	require.NoError(t, s.ReplaceTask(ctx, next, rec.RunID))
	got, err = s.GetTask(ctx, rec.ID)
	require.NoError(t, err)
	assert.Equal(t, []string{"dave"}, got.Watchers)

	once := []string{"bob", "alice", "carol"}
	assert.Zero(t, testing.AllocsPerRun(100, func() { _ = distinct(once) }))
}

// distinct keeps each watcher's first appearance, in order, for lists
// on either side of distinctSet, with and without repeats, and returns a
// list without repeats as it is.
func TestDistinctKeepsFirstAppearances(t *testing.T) {
	naive := func(w []string) []string {
		out := []string{}
		for _, x := range w {
			if !slices.Contains(out, x) {
				out = append(out, x)
			}
		}
		return out
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, distinctSet, distinctSet + 1, 100, 1000} {
		for _, names := range []int{max(n, 1), max(n/3, 1)} { // no repeats (mostly), many
			w := make([]string, n)
			for i := range w {
				w[i] = "u" + strconv.Itoa(rng.IntN(names))
			}
			orig := slices.Clone(w)
			got := distinct(w)
			assert.Equal(t, naive(orig), append([]string{}, got...), "n=%d names=%d", n, names)
			assert.Equal(t, orig, w, "the caller's slice is left as it was")
			if len(got) == len(w) && n > 0 {
				assert.Same(t, &w[0], &got[0], "a list without repeats is returned as it is")
			}
		}
	}
}

// WithWatchers names each owner once, in the order of first appearance,
// however many it is given, across several of its options too.
func TestWithWatchersNamesEachOwnerOnce(t *testing.T) {
	var owners []Owner
	var want []string
	for i := range 100 {
		id := "u" + strconv.Itoa(i%60)
		owners = append(owners, MustOwner(id))
		if i < 60 {
			want = append(want, id)
		}
	}
	var o submitOptions
	require.NoError(t, WithWatchers(owners[:50]...)(&o))
	require.NoError(t, WithWatchers(owners[50:]...)(&o))
	assert.Equal(t, want, o.watchers)
}
