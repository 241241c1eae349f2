package workers

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// checkLive checks a MemStore's live records against its records: every
// PENDING or RUNNING record is among its shard's live records, at the
// place it says, and nothing else is.
func checkLive(t *testing.T, s *MemStore) {
	t.Helper()
	s.mu.RLock()
	defer s.mu.RUnlock()
	s.lockShards(false)
	defer s.unlockShards(false)
	for i := range s.shards {
		sh := &s.shards[i]
		for at, r := range sh.live {
			require.Equal(t, int32(at+1), r.livePos, "%s: its place among the live records", r.id())
			require.True(t, r.live(), "%s is %s, among the live records", r.id(), r.Status())
			require.False(t, r.removed, "%s, removed, is among the live records", r.id())
		}
		for r := range sh.recs.all() {
			if r.live() {
				require.NotZero(t, r.livePos, "%s is %s, not among the live records", r.id(), r.Status())
			} else {
				require.Zero(t, r.livePos, "%s is %s, among the live records", r.id(), r.Status())
			}
		}
	}
}

// A listing of live tasks alone (Subscribe's first read, the HTTP event
// stream's check, recovery) reads the store's live records, not every
// record the caller may see: over a long history of ended tasks kept for
// Retention it costs what is live, and holds the store's lock no longer.
// It lists exactly what a walk of every record would, in either order,
// from any position, with any limit, for any caller and queue; and the
// live records follow every write that makes or ends one.
func TestMemStoreListsLiveRecordsWithoutWalkingTheHistory(t *testing.T) {
	s := NewMemStore()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Millisecond) }
	done := State{Status: StatusCompleted, StartedAt: t0, CompletedAt: t0}
	for i := range 600 {
		require.NoError(t, s.InsertTask(ctx, Record{ID: fmt.Sprint("alice::old-", i), RunID: "x.1", Watchers: []string{"alice"}, CreatedAt: at(i), State: done}))
	}
	live := []Record{
		{ID: "alice::a", RunID: "x.2", Watchers: []string{"alice"}, CreatedAt: at(6000), State: State{Status: StatusPending}},
		{ID: "alice::b", RunID: "x.3", Watchers: []string{"alice"}, Queue: "q", CreatedAt: at(6001), State: State{Status: StatusRunning, StartedAt: at(6001), Attempt: 1}},
		{ID: "bob::c", RunID: "x.4", Watchers: []string{"bob", "alice"}, CreatedAt: at(6001), State: State{Status: StatusPending}},
		{ID: "bob::d", RunID: "x.5", Watchers: []string{"bob"}, Queue: "q", CreatedAt: at(6002), State: State{Status: StatusRunning, StartedAt: at(6002), Attempt: 1}},
		{ID: "global", RunID: "x.6", CreatedAt: at(2500), State: State{Status: StatusPending}},
	}
	for _, rec := range live {
		require.NoError(t, s.InsertTask(ctx, rec))
	}
	checkLive(t, s)

	s.mu.RLock()
	s.lockShards(false)
	seen := s.liveRecords("alice", s.byUser["alice"].len())
	s.unlockShards(false)
	s.mu.RUnlock()
	require.NotNil(t, seen, "alice's live listing reads the live records, not her 603")
	require.Equal(t, 3, seen.len(), "alice's live records")

	// Every live filter lists what a walk of every record lists.
	same := func(f Filter) {
		t.Helper()
		all, err := s.ListTasks(ctx, Filter{Order: f.Order})
		require.NoError(t, err)
		want := []string{}
		for _, r := range all {
			if f.Match(&r) && (f.Limit <= 0 || len(want) < f.Limit) {
				want = append(want, r.ID)
			}
		}
		got, err := s.ListTasks(ctx, f)
		require.NoError(t, err)
		ids := make([]string, 0, len(got))
		for _, r := range got {
			ids = append(ids, r.ID)
		}
		require.Equal(t, want, ids, "%+v", f)
	}
	positions := []*Position{nil, {CreatedAt: at(6001), ID: "alice::b"}, {CreatedAt: at(6001), ID: "b"}, {CreatedAt: at(2500), ID: "global"}, {CreatedAt: at(9000)}}
	each := func() {
		for _, statuses := range [][]Status{{StatusPending}, {StatusRunning}, {StatusPending, StatusRunning}} {
			for _, user := range []string{"alice", "bob", "carol", ""} {
				for _, order := range []Order{OldestFirst, NewestFirst} {
					for _, after := range positions {
						for _, limit := range []int{0, 1, 2} {
							for _, queue := range []string{"", "q"} {
								same(Filter{VisibleTo: user, Statuses: statuses, Order: order, After: after, Limit: limit, Queue: queue})
							}
						}
					}
				}
			}
		}
	}
	each()

	// The live records follow each write: a start, an end, a re-run, a
	// join, a delete, a rewrite.
	ok, err := s.TransitionTask(ctx, "alice::a", "x.2", []Status{StatusPending}, State{Status: StatusRunning, StartedAt: at(7000), Attempt: 1})
	require.True(t, ok)
	require.NoError(t, err)
	ok, err = s.TransitionTask(ctx, "alice::b", "x.3", []Status{StatusRunning}, State{Status: StatusFailed, StartedAt: at(6001), CompletedAt: at(7000), Attempt: 1, Error: "boom"})
	require.True(t, ok)
	require.NoError(t, err)
	require.NoError(t, s.ReplaceTask(ctx, Record{ID: "alice::old-7", RunID: "x.7", Watchers: []string{"alice"}, CreatedAt: at(7001), State: State{Status: StatusPending}}, "x.1"))
	require.NoError(t, s.ReplaceTask(ctx, Record{ID: "bob::d", RunID: "x.8", Watchers: []string{"bob"}, CreatedAt: at(7002), State: done}, "x.5"))
	joined, err := s.AddWatcher(ctx, "global", "x.6", "carol")
	require.True(t, joined)
	require.NoError(t, err)
	require.NoError(t, s.SetTask(ctx, Record{ID: "bob::c", State: State{Status: StatusCancelled, CompletedAt: at(7003)}}))
	_, err = s.DeleteFinished(ctx, at(8000))
	require.NoError(t, err)
	checkLive(t, s)
	each()

	require.NoError(t, s.ClearRecords(ctx))
	checkLive(t, s)
	for i := range s.shards {
		assert.Empty(t, s.shards[i].live)
	}
}

// A runtime's own runs, registered, started, ended and re-run through
// its fast path, keep the live records right.
func TestMemStoreLiveRecordsFollowARuntimesRuns(t *testing.T) {
	s := NewMemStore()
	rt := newRuntime(t, s, Config{})
	release := make(chan struct{})
	var subs []Submission
	for i := range 20 {
		fn := noop
		if i%2 == 0 {
			fn = func(ctx context.Context, _ *Task) (any, error) { <-release; return nil, nil }
		}
		sub, err := rt.SubmitSequential(ctx, fmt.Sprint("q", i%3), fmt.Sprint("k", i), fn, alice)
		require.NoError(t, err)
		subs = append(subs, sub)
	}
	checkLive(t, s)
	close(release)
	for _, sub := range subs {
		settled(t, rt, sub.ID)
	}
	checkLive(t, s)
	sub, err := rt.Submit(ctx, "k0", noop, alice) // a re-run replaces the ended record
	require.NoError(t, err)
	settled(t, rt, sub.ID)
	checkLive(t, s)
	recs, err := s.ListTasks(ctx, Filter{Statuses: []Status{StatusPending, StatusRunning}})
	require.NoError(t, err)
	assert.Empty(t, recs)
	assert.True(t, slices.IndexFunc(subs, func(x Submission) bool { return x.ID == sub.ID }) >= 0)
}
