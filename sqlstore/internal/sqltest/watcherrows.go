package sqltest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/internal/sqlcore"
)

// Since version 4 a watcher row keeps its task's created_at, which the
// listings read the watcher index by. These checks hold the listings to
// the rows that lack it or disagree with their task: rows that a replica
// of a release before version 4, still running beside a newer one during
// a rollout, writes with its own statements.

// oldAddWatcher is AddWatcher's statement in the releases before version
// 4, which write no created_at.
const oldAddWatcher = `INSERT INTO {watchers} (task_id, user_id)
SELECT id, $3 FROM {tasks} WHERE id = $1 AND run_id = $2
ON CONFLICT DO NOTHING`

// watchedTasks inserts n tasks of bob's, a minute apart from the start of
// 2025, with ids bob::prefix0, bob::prefix1, ..., each listing alice as a
// watcher if watched, and an undated one of alice's own before them; it
// returns the ids in alice's listing, oldest first.
func watchedTasks(t *testing.T, s workers.Store, prefix string, n int, watched bool) []string {
	t.Helper()
	own := workers.Record{ID: "alice::" + prefix + "undated", RunID: "run-u", State: workers.State{Status: workers.StatusPending}}
	if err := s.InsertTask(t.Context(), own); err != nil {
		t.Fatal(err)
	}
	ids := []string{own.ID}
	base := time.Date(2025, time.January, 1, 0, 0, 0, 0, time.UTC)
	for i := range n {
		rec := workers.Record{ID: fmt.Sprintf("bob::%s%d", prefix, i), RunID: fmt.Sprintf("run-%d", i),
			CreatedAt: base.Add(time.Duration(i) * time.Minute), State: workers.State{Status: workers.StatusRunning}}
		if watched {
			rec.Watchers = []string{"alice"}
		}
		if err := s.InsertTask(t.Context(), rec); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, rec.ID)
	}
	return ids
}

// walkPages pages through f with pages of two and returns the ids listed,
// failing t if a page lists a record not after the one before it or the
// walk goes on for more pages than there are records.
func walkPages(t *testing.T, s workers.Store, f workers.Filter, records int) []string {
	t.Helper()
	f.Limit = 2
	var got []string
	var last *workers.Record
	for pages := 0; ; pages++ {
		if pages > records {
			t.Fatalf("%s pages of %q go on: %q so far", orderName(f.Order), f.VisibleTo, got)
		}
		page, err := s.ListTasks(t.Context(), f)
		if err != nil {
			t.Fatal(err)
		}
		for i := range page {
			if last != nil && f.Compare(&page[i], last) <= 0 {
				t.Fatalf("%s pages of %q list %q after %q: out of order, or listed again (so far %q)", orderName(f.Order), f.VisibleTo, page[i].ID, last.ID, got)
			}
			last = &page[i]
			got = append(got, page[i].ID)
		}
		if len(page) < f.Limit {
			return got
		}
		f.After = workers.PositionOf(last)
	}
}

// CheckDisagreeingWatcherRows lists alice's tasks, newest and oldest
// first, in pages of two, over watcher rows whose created_at is not their
// task's (NULL, or a later time): a page never lists a task the pages
// before it listed, and the walk ends. It may skip a task, since a page
// picks watcher rows by their own time; no release writes such rows once
// the tables have the trigger that dates them (CheckOlderReplicaWatchers
// holds every task listed then).
func CheckDisagreeingWatcherRows(t *testing.T, s *sqlcore.Store, store workers.Store) {
	t.Helper()
	ids := watchedTasks(t, store, "k", 6, true)
	// Half the rows lose their time; the other half gain an hour.
	for i, id := range ids[1:] {
		var at time.Time // NULL
		if i%2 == 1 {
			at = time.Date(2025, time.January, 1, 1, 0, 0, 0, time.UTC)
		}
		if err := sqlcore.ExecRaw(t.Context(), s, `UPDATE {watchers} SET created_at = $2 WHERE task_id = $1`, id, at); err != nil {
			t.Fatal(err)
		}
	}
	for _, order := range []workers.Order{workers.NewestFirst, workers.OldestFirst} {
		walkPages(t, store, workers.Filter{VisibleTo: "alice", Order: order}, len(ids))
	}
}

// CheckOlderReplicaWatchers builds the tables at version before, adds
// watchers as a release before version 4 does, migrates the tables
// forward, and adds more the same way: alice's listing, newest and oldest
// first, in pages of two, lists each task she watches or owns exactly
// once, in order.
func CheckOlderReplicaWatchers(t *testing.T, s *sqlcore.Store, store workers.Store, before int) {
	t.Helper()
	ctx := t.Context()
	if err := sqlcore.MigrateTo(ctx, s, before); err != nil {
		t.Fatalf("migrate to version %d: %v", before, err)
	}
	addOld := func(ids []string) {
		t.Helper()
		for i, id := range ids {
			if i == 0 {
				continue // alice's own
			}
			if err := sqlcore.ExecRaw(ctx, s, oldAddWatcher, id, fmt.Sprintf("run-%d", i-1), "alice"); err != nil {
				t.Fatal(err)
			}
		}
	}
	early := watchedTasks(t, store, "a", 4, false)
	addOld(early)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	late := watchedTasks(t, store, "b", 4, false)
	addOld(late)

	want := append(slices.Clone(early), late...)
	f := workers.Filter{VisibleTo: "alice"}
	slices.SortFunc(want, func(a, b string) int {
		ra, _ := store.GetTask(ctx, a)
		rb, _ := store.GetTask(ctx, b)
		return workers.CompareRecords(&ra, &rb)
	})
	for _, order := range []workers.Order{workers.OldestFirst, workers.NewestFirst} {
		f.Order = order
		if got := walkPages(t, store, f, len(want)); !slices.Equal(got, want) {
			t.Errorf("alice's pages, %s, over watcher rows an older release wrote: %q, want %q", orderName(order), got, want)
		}
		slices.Reverse(want)
	}
}

// orderName names o for messages.
func orderName(o workers.Order) string {
	if o == workers.NewestFirst {
		return "newest first"
	}
	return "oldest first"
}
