package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// addWatcher calls AddWatcher and fails t unless it reports wantAdded
// without an error.
func addWatcher(t *testing.T, s workers.Store, id, runID, watcher string, wantAdded bool) {
	t.Helper()
	added, err := s.AddWatcher(t.Context(), id, runID, watcher)
	if err != nil || added != wantAdded {
		t.Errorf("AddWatcher(%q, run %q, %q) = %v, %v; want %v, nil", id, runID, watcher, added, err, wantAdded)
	}
}

func (*suite) watchersAppend(t *testing.T, s workers.Store) {
	r := record("alice::a", "run-1", "alice")
	r.Queue, r.State = "q1", started
	bare := record("nightly", "run-1")
	insert(t, s, r, bare)
	addWatcher(t, s, r.ID, r.RunID, "bob", true)
	r.Watchers = []string{"alice", "bob"}
	wantStored(t, s, r)
	addWatcher(t, s, bare.ID, bare.RunID, "carol", true)
	wantWatchers(t, s, bare.ID, "carol")
}

func (*suite) watchersExisting(t *testing.T, s workers.Store) {
	r := record("alice::a", "run-1", "alice", "bob")
	insert(t, s, r)
	addWatcher(t, s, r.ID, r.RunID, "bob", false)
	addWatcher(t, s, r.ID, r.RunID, "alice", false)
	wantStored(t, s, r)
}

func (*suite) watchersDuplicates(t *testing.T, s workers.Store) {
	r := record("alice::a", "run-1", "bob", "alice", "bob", "bob")
	insert(t, s, r)
	r.Watchers = []string{"bob", "alice"}
	wantStored(t, s, r)
	next := record(r.ID, "run-2", "carol", "carol", "alice", "carol", "alice")
	next.CreatedAt = at(1)
	if err := s.ReplaceTask(t.Context(), next, r.RunID); err != nil {
		t.Fatalf("ReplaceTask: %v", err)
	}
	next.Watchers = []string{"carol", "alice"}
	wantStored(t, s, next)
	for _, g := range list(t, s, workers.Filter{VisibleTo: "carol"}) {
		if !sameSet(g.Watchers, next.Watchers) {
			t.Errorf("ListTasks returned %q with watchers %q, want %q (in any order)", g.ID, g.Watchers, next.Watchers)
		}
	}
}

func (*suite) watchersStale(t *testing.T, s workers.Store) {
	r := record("alice::a", "run-2", "alice")
	insert(t, s, r)
	_, err := s.AddWatcher(t.Context(), r.ID, "run-1", "bob")
	wantErr(t, "AddWatcher naming another run", err, workers.ErrConflict)
	wantStored(t, s, r)
}

func (*suite) watchersEmptyRunID(t *testing.T, s workers.Store) {
	r := record("alice::a", "run-1", "alice")
	insert(t, s, r)
	_, err := s.AddWatcher(t.Context(), r.ID, "", "bob")
	wantErr(t, "AddWatcher with an empty run id", err, workers.ErrInvalidRunID)
	wantStored(t, s, r)
}

func (*suite) watchersUnstorable(t *testing.T, s workers.Store) {
	r := record("alice::a", "run-1", "alice")
	insert(t, s, r)
	done, cancel := context.WithCancel(t.Context())
	cancel()
	for _, u := range unstorableWatchers {
		for _, c := range []struct {
			name   string
			ctx    context.Context
			id     string
			runID  string
			target error
		}{
			{"the record's run", t.Context(), r.ID, r.RunID, workers.ErrInvalidData},
			{"another run", t.Context(), r.ID, "run-0", workers.ErrInvalidData},
			{"a missing record", t.Context(), "alice::nobody", "run-1", workers.ErrInvalidData},
			{"an empty run id", t.Context(), r.ID, "", workers.ErrInvalidRunID},
			{"a done context", done, r.ID, r.RunID, context.Canceled},
		} {
			added, err := s.AddWatcher(c.ctx, c.id, c.runID, u.text)
			call := fmt.Sprintf("AddWatcher of a watcher with %s, on %s", u.name, c.name)
			if added {
				t.Errorf("%s reported true", call)
			}
			wantErr(t, call, err, c.target)
		}
	}
	wantStored(t, s, r)
	wantMissing(t, s, "alice::nobody")
	// The longest user id is a watcher like any other.
	longest := strings.Repeat("w", workers.MaxOwnerIDLen)
	added, err := s.AddWatcher(t.Context(), r.ID, r.RunID, longest)
	if err != nil || !added {
		t.Errorf("AddWatcher of a watcher of %d bytes = %v, %v; want true, nil", len(longest), added, err)
	}
	wantWatchers(t, s, r.ID, "alice", longest)
}

func (*suite) watchersMissing(t *testing.T, s workers.Store) {
	_, err := s.AddWatcher(t.Context(), "alice::nobody", "run-1", "bob")
	wantErr(t, "AddWatcher to a missing id", err, workers.ErrNotFound)
	wantMissing(t, s, "alice::nobody")
}

func (su *suite) watchersRace(t *testing.T, s workers.Store) {
	const each = 4 // appends per racer, so that lost updates have many chances
	r := record("nightly", "run-1", "alice", "bob")
	insert(t, s, r)
	want := slices.Clone(r.Watchers)
	for i := range racers * each {
		want = append(want, fmt.Sprintf("w%02d-%d", i/each, i%each))
	}
	su.within(t, func(ctx context.Context) {
		race(racers, func(i int) {
			for _, w := range want[len(r.Watchers)+i*each:][:each] {
				added, err := s.AddWatcher(ctx, r.ID, r.RunID, w)
				if err != nil || !added {
					t.Errorf("AddWatcher(%q) = %v, %v; want true, nil", w, added, err)
				}
			}
		})
	})
	got := get(t, s, r.ID).Watchers
	if !sameSet(got, want) {
		var lost []string
		for _, w := range want {
			if !slices.Contains(got, w) {
				lost = append(lost, w)
			}
		}
		t.Errorf("after %d concurrent appends the record lists %d watchers, want %d; lost %d, among them %q",
			racers*each, len(got), len(want), len(lost), lost[:min(len(lost), 4)])
	}
}

func (su *suite) watchersDuplicateRace(t *testing.T, s workers.Store) {
	r := record("nightly", "run-1", "alice")
	insert(t, s, r)
	var adds atomic.Int32
	su.within(t, func(ctx context.Context) {
		race(racers, func(int) {
			added, err := s.AddWatcher(ctx, r.ID, r.RunID, "bob")
			if err != nil {
				t.Errorf("AddWatcher: %v", err)
			}
			if added {
				adds.Add(1)
			}
		})
	})
	if n := adds.Load(); n != 1 {
		t.Errorf("%d of %d racing appends of one watcher reported true, want exactly 1", n, racers)
	}
	wantWatchers(t, s, r.ID, "alice", "bob")
}

// fixture returns the records the List cases filter, in an order that is
// not the listing order. bob::a and carol::c share a CreatedAt, so the
// order between them comes from their ids.
func fixture() []workers.Record {
	mk := func(id string, created int, status workers.Status, queue string, watchers ...string) workers.Record {
		r := record(id, "run-"+id, watchers...)
		r.CreatedAt, r.Status, r.Queue = at(created), status, queue
		if status.Terminal() {
			r.CompletedAt = at(created + 1)
		}
		return r
	}
	return []workers.Record{
		mk("erin:x", 7, workers.StatusPending, ""),
		mk("bob::b", 4, workers.StatusFailed, "", "bob"),
		mk("carol::c", 3, workers.StatusRunning, "q2", "carol"),
		mk("alice::b", 2, workers.StatusRunning, "q1"), // its owner is no watcher
		mk("nightly", 5, workers.StatusPending, "q2", "carol"),
		mk("bob::a", 3, workers.StatusCompleted, "q1", "bob", "alice"),
		mk("erin", 6, workers.StatusCancelled, "", "bob"), // a global id spelling a user id
		mk("alice::a", 1, workers.StatusPending, "", "alice"),
	}
}

// listing returns a case that lists the fixture through f and expects the
// records with the want ids, in that order.
func listing(f workers.Filter, want ...string) func(*suite, *testing.T, workers.Store) {
	return func(_ *suite, t *testing.T, s workers.Store) {
		recs := fixture()
		insert(t, s, recs...)
		got := list(t, s, f)
		if !slices.Equal(ids(got), want) {
			t.Fatalf("ListTasks(%+v) returned %q, want %q", f, ids(got), want)
		}
		for _, g := range got {
			i := slices.IndexFunc(recs, func(r workers.Record) bool { return r.ID == g.ID })
			if d := diff(g, recs[i]); d != "" {
				t.Errorf("ListTasks returned a different record %q:%s", g.ID, d)
			}
		}
	}
}

func (*suite) listPages(t *testing.T, s workers.Store) {
	recs := fixture()
	// Records without a CreatedAt (admin tools may write them), and a
	// tie with one of them, so the cursor crosses both kinds.
	undated := record("alice::undated", "run-u", "alice", "bob")
	undated.CreatedAt = time.Time{}
	undated2 := record("bob::undated", "run-u2", "bob")
	undated2.CreatedAt = time.Time{}
	recs = append(recs, undated, undated2)
	insert(t, s, recs...)
	for _, order := range []workers.Order{workers.OldestFirst, workers.NewestFirst} {
		for _, base := range []workers.Filter{
			{}, {VisibleTo: "alice"}, {VisibleTo: "bob"}, {VisibleTo: "carol"},
			{Statuses: []workers.Status{workers.StatusPending, workers.StatusRunning}},
			{VisibleTo: "bob", Statuses: []workers.Status{workers.StatusPending, workers.StatusCompleted, workers.StatusFailed}},
			{VisibleTo: "alice", Queue: "q1"},
		} {
			base.Order = order
			want := ids(list(t, s, base))
			for size := 1; size <= 3; size++ {
				f := base
				f.Limit = size
				var got []string
				for pages := 0; ; pages++ {
					if pages > len(recs) {
						t.Fatalf("ListTasks(%+v): the walk does not end; so far %q", base, got)
					}
					page := list(t, s, f)
					if len(page) > size {
						t.Fatalf("ListTasks(%+v) returned %d records, want at most %d", f, len(page), size)
					}
					got = append(got, ids(page)...)
					if len(page) < size {
						break
					}
					f.After = workers.PositionOf(&page[len(page)-1])
				}
				if !slices.Equal(got, want) {
					t.Errorf("pages of %d through ListTasks(%+v) returned %q, want %q", size, base, got, want)
				}
			}
		}
	}
}

func (*suite) listAfterMoved(t *testing.T, s workers.Store) {
	recs := fixture()
	insert(t, s, recs...)
	for _, order := range []workers.Order{workers.OldestFirst, workers.NewestFirst} {
		f := workers.Filter{Order: order, Limit: 3}
		first := list(t, s, f)
		if len(first) != 3 {
			t.Fatalf("ListTasks(%+v) returned %q, want 3 records", f, ids(first))
		}
		last := first[2]
		after := workers.PositionOf(&last)
		// The rest of the listing, as it was, after the page.
		rest := ids(list(t, s, workers.Filter{Order: order}))[3:]

		// Moved: a new run of the record, created after every other.
		moved := last
		moved.RunID, moved.CreatedAt = last.RunID+"-next", at(100)
		if err := s.ReplaceTask(t.Context(), moved, last.RunID); err != nil {
			t.Fatalf("ReplaceTask(%q): %v", moved.ID, err)
		}
		want := slices.Clone(rest)
		if order == workers.OldestFirst {
			want = append(want, moved.ID) // now the newest, after the position
		}
		f.After, f.Limit = after, 0
		if got := ids(list(t, s, f)); !slices.Equal(got, want) {
			t.Errorf("ListTasks(%v after %q, which has since moved) returned %q, want %q", order, last.ID, got, want)
		}

		// Deleted: the moved record, finished long ago, and deleted.
		done := moved
		done.RunID, done.CreatedAt, done.State = moved.RunID+"-done", last.CreatedAt, outcome(workers.StatusCompleted, 1)
		done.CompletedAt = at(-100)
		if err := s.ReplaceTask(t.Context(), done, moved.RunID); err != nil {
			t.Fatalf("ReplaceTask(%q): %v", done.ID, err)
		}
		if n, err := s.DeleteFinished(t.Context(), at(-50)); err != nil || n != 1 {
			t.Fatalf("DeleteFinished deleted %d records (%v), want 1", n, err)
		}
		if got := ids(list(t, s, f)); !slices.Equal(got, rest) {
			t.Errorf("ListTasks(%v after %q, which has since been deleted) returned %q, want %q", order, last.ID, got, rest)
		}
		insert(t, s, last) // as it was, for the next order
	}
}

func (*suite) listAfterFarOff(t *testing.T, s workers.Store) {
	insert(t, s, fixture()...)
	for _, order := range []workers.Order{workers.OldestFirst, workers.NewestFirst} {
		all := ids(list(t, s, workers.Filter{Order: order}))
		for _, c := range []struct {
			name  string
			at    time.Time
			first bool // the position comes before every record in order
		}{
			{"year -300,000", farPast, order == workers.OldestFirst},
			{"year 300,000", farFuture, order == workers.NewestFirst},
		} {
			f := workers.Filter{Order: order, After: &workers.Position{CreatedAt: c.at, ID: "alice::a"}}
			var want []string
			if c.first {
				want = all
			}
			got, err := s.ListTasks(t.Context(), f)
			if err != nil || !slices.Equal(ids(got), want) {
				t.Errorf("ListTasks(%v after %s) = %q, %v; want %q, nil", order, c.name, ids(got), err, want)
			}
		}
	}
}

// positionFilters are the filters the position cases page through:
// everything, a user's own and watched tasks, and a filtered listing.
var positionFilters = []workers.Filter{
	{}, {VisibleTo: "alice"}, {VisibleTo: "bob"},
	{VisibleTo: "bob", Statuses: []workers.Status{workers.StatusPending}},
}

// listAfterSubMicrosecond lists after positions that fall between two
// microseconds, which no stored time does (a store keeps times to the
// microsecond), over records a microsecond apart and records that tie.
func (*suite) listAfterSubMicrosecond(t *testing.T, s workers.Store) {
	var recs []workers.Record
	for i, id := range []string{"alice::a", "alice::m", "alice::z", "alice::before", "alice::after"} {
		r := record(id, "run-1", "bob")
		switch id {
		case "alice::before":
			r.CreatedAt = epoch.Add(-time.Microsecond)
		case "alice::after":
			r.CreatedAt = epoch.Add(time.Microsecond)
		}
		if i%2 == 1 {
			r.State = outcome(workers.StatusCompleted, i)
		}
		recs = append(recs, r)
	}
	insert(t, s, recs...)
	for _, order := range []workers.Order{workers.OldestFirst, workers.NewestFirst} {
		for _, base := range positionFilters {
			for _, off := range []time.Duration{-999, -500, -1, 1, 500, 999} {
				f := base
				f.Order = order
				f.After = &workers.Position{CreatedAt: epoch.Add(off * time.Nanosecond), ID: "alice::m"}
				var want []workers.Record
				for _, r := range recs {
					if f.Match(&r) {
						want = append(want, r)
					}
				}
				slices.SortFunc(want, func(a, b workers.Record) int { return f.Compare(&a, &b) })
				if got := list(t, s, f); !slices.Equal(ids(got), ids(want)) {
					t.Errorf("ListTasks(%+v after epoch%+dns, %q) returned %q, want %q", base, off, f.After.ID, ids(got), ids(want))
				}
			}
		}
	}
}

func (*suite) listEmpty(t *testing.T, s workers.Store) {
	for _, f := range []workers.Filter{{}, {VisibleTo: "alice", Statuses: allStatuses, Queue: "q1", Limit: 5}} {
		if got := list(t, s, f); len(got) != 0 {
			t.Errorf("ListTasks(%+v) of an empty store returned %q", f, ids(got))
		}
	}
}

func (*suite) listFollowsWatchers(t *testing.T, s workers.Store) {
	global := record("nightly", "run-1", "bob")
	owned := record("alice::a", "run-1", "alice", "bob")
	owned.CreatedAt = at(1)
	insert(t, s, global, owned)
	visible := func(user string, want ...string) {
		t.Helper()
		if got := ids(list(t, s, workers.Filter{VisibleTo: user})); !slices.Equal(got, want) {
			t.Errorf("ListTasks(VisibleTo %q) returned %q, want %q", user, got, want)
		}
	}
	addWatcher(t, s, global.ID, global.RunID, "carol", true)
	visible("carol", "nightly")
	visible("bob", "nightly", "alice::a")

	global.RunID, global.Watchers = "run-2", []string{"dave"}
	owned.RunID, owned.Watchers = "run-2", nil
	for _, r := range []workers.Record{global, owned} {
		if err := s.ReplaceTask(t.Context(), r, "run-1"); err != nil {
			t.Fatalf("ReplaceTask(%q): %v", r.ID, err)
		}
	}
	visible("bob")
	visible("carol")
	visible("dave", "nightly")
	visible("alice", "alice::a")
}

// watchersRaceReplace races late appends under a run against the replace
// that ends it: an append that read the old run id and landed after the
// replace dropped the old watcher list would grant a watcher of the old
// run access to the new one.
func (su *suite) watchersRaceReplace(t *testing.T, s workers.Store) {
	const rounds = 50
	prev := record("nightly", "run-0", "alice")
	prev.Status, prev.CompletedAt = workers.StatusCompleted, at(1)
	insert(t, s, prev)
	su.within(t, func(ctx context.Context) {
		for round := range rounds {
			next := prev
			next.RunID = fmt.Sprintf("run-%d", round+1)
			race(4, func(i int) {
				if i == 0 {
					if err := s.ReplaceTask(ctx, next, prev.RunID); err != nil {
						t.Errorf("ReplaceTask: %v", err)
					}
					return
				}
				_, err := s.AddWatcher(ctx, prev.ID, prev.RunID, fmt.Sprintf("late-%d-%d", round, i))
				if err != nil && !errors.Is(err, workers.ErrConflict) {
					t.Errorf("AddWatcher: %v", err)
				}
			})
			got, err := s.GetTask(ctx, prev.ID)
			if err != nil {
				t.Errorf("GetTask: %v", err)
				return
			}
			if got.RunID != next.RunID || !sameSet(got.Watchers, next.Watchers) {
				t.Errorf("round %d: after the replace the record is run %q with watchers %q; want run %q with %q",
					round, got.RunID, got.Watchers, next.RunID, next.Watchers)
				return
			}
			prev = next
		}
	})
}

func (*suite) listUnstorableFilter(t *testing.T, s workers.Store) {
	insert(t, s, fixture()...)
	for _, u := range unstorable {
		for field, f := range map[string]workers.Filter{"VisibleTo": {VisibleTo: "bob" + u.text}, "Queue": {Queue: "q1" + u.text}} {
			got, err := s.ListTasks(t.Context(), f)
			if err != nil || len(got) != 0 {
				t.Errorf("ListTasks with %s in Filter.%s = %q, %v; want nothing, and no error", u.name, field, ids(got), err)
			}
		}
	}
}

func (*suite) listVisibleExact(t *testing.T, s workers.Store) {
	insert(t, s, fixture()...)
	for _, user := range []string{
		"Alice", "ALICE", "Bob", "alic", "lice", "ali", "bo", "ob", "o",
		"alice ", "bob ", " bob", "a%", "%", "b_b", "_ob", "alice,bob", "bob,alice",
	} {
		for _, order := range []workers.Order{workers.OldestFirst, workers.NewestFirst} {
			f := workers.Filter{VisibleTo: user, Order: order}
			if got := list(t, s, f); len(got) != 0 {
				t.Errorf("ListTasks(%+v) returned %q, want none: no record lists or is owned by %q", f, ids(got), user)
			}
		}
	}
}
