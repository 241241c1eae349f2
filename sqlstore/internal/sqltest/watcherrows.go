package sqltest

import (
	"fmt"
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
// before it listed, and the walk ends.
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

// orderName names o for messages.
func orderName(o workers.Order) string {
	if o == workers.NewestFirst {
		return "newest first"
	}
	return "oldest first"
}
