package workers

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// listedIDs returns the ids of recs.
func listedIDs(recs []Record) []string {
	ids := make([]string, len(recs))
	for i := range recs {
		ids[i] = recs[i].ID
	}
	return ids
}

// A listing that walks past several batches lists what one walk under a
// single hold would, whatever the order, the cursor it starts after and
// its limit: records created at one instant, ordered by id alone, are
// neither skipped nor repeated where a batch ends.
func TestMemStoreBatchedListingMatchesOneWalk(t *testing.T) {
	s := NewMemStore()
	t0 := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	const n = 2*listBatch + 7
	var all []Record
	for i := range n {
		// Runs of records share an instant, across the batches' ends.
		at := t0.Add(time.Duration(i/1000) * time.Second)
		rec := Record{ID: fmt.Sprintf("alice::k%05d", (i*7919)%n), RunID: "i.1", Watchers: []string{"alice"}, CreatedAt: at,
			State: State{Status: StatusCompleted, Attempt: 1, StartedAt: t0, CompletedAt: t0, Cause: CauseCompleted, Result: []byte(`"r"`)}}
		if i%3 == 0 {
			rec.State = State{Status: StatusPending}
		}
		require.NoError(t, s.InsertTask(ctx, rec))
		all = append(all, rec)
	}
	slices.SortFunc(all, func(a, b Record) int { return CompareRecords(&a, &b) })

	for _, user := range []string{"", "alice"} {
		for _, order := range []Order{OldestFirst, NewestFirst} {
			want := slices.Clone(all)
			if order == NewestFirst {
				slices.Reverse(want)
			}
			for _, after := range []int{-1, listBatch - 1} {
				for _, limit := range []int{0, listBatch + 1} {
					for _, statuses := range [][]Status{nil, {StatusCompleted}} {
						f := Filter{VisibleTo: user, Order: order, Limit: limit, Statuses: statuses}
						exp := want
						if after >= 0 {
							f.After = PositionOf(&want[after])
							exp = want[after+1:]
						}
						if statuses != nil {
							exp = slices.DeleteFunc(slices.Clone(exp), func(r Record) bool { return r.Status != StatusCompleted })
						}
						if limit > 0 && len(exp) > limit {
							exp = exp[:limit]
						}
						name := fmt.Sprintf("user %q order %v after %d limit %d statuses %v", user, order, after, limit, statuses)
						got, err := s.ListTasks(ctx, f)
						require.NoError(t, err, name)
						if !slices.Equal(listedIDs(exp), listedIDs(got)) {
							require.Equal(t, listedIDs(exp), listedIDs(got), name)
						}
						snaps, _, err := s.listSnapshots(ctx, f, true, false)
						require.NoError(t, err, name)
						require.Len(t, snaps, len(exp), name)
						for i := range snaps {
							require.Equal(t, exp[i].ID, snaps[i].ID, name)
						}
						if limit > 1 {
							snaps, more, err := s.listSnapshots(ctx, f, true, true)
							require.NoError(t, err, name)
							require.Equal(t, len(exp) == limit, more, name)
							require.Len(t, snaps, min(len(exp), limit-1), name)
						}
					}
				}
			}
		}
	}
}

// While other callers write (insert, change states, add watchers, re-run
// and delete other records), a long listing still lists each record that
// stays put exactly once, in order.
func TestMemStoreBatchedListingUnderConcurrentWrites(t *testing.T) {
	s := NewMemStore()
	t0 := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	const n = 3 * listBatch
	var stay []string
	for i := range n {
		id := fmt.Sprintf("alice::k%05d", i)
		stay = append(stay, id)
		rec := Record{ID: id, RunID: "i.1", Watchers: []string{"alice"}, CreatedAt: t0.Add(time.Duration(i/10) * time.Millisecond),
			State: State{Status: StatusRunning, Attempt: 1, StartedAt: t0}}
		require.NoError(t, s.InsertTask(ctx, rec))
		// Others' records among alice's: re-run, pruned, joined.
		other := Record{ID: fmt.Sprintf("bob::k%05d", i), RunID: "i.1", Watchers: []string{"bob"}, CreatedAt: rec.CreatedAt,
			State: State{Status: StatusCompleted, Attempt: 1, StartedAt: t0, CompletedAt: t0, Cause: CauseCompleted, Result: []byte(`"old"`)}}
		require.NoError(t, s.InsertTask(ctx, other))
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id := stay[(i*31)%n]
			res := []byte(fmt.Sprintf(`"r%d"`, i))
			if err := s.SetTask(ctx, Record{ID: id, State: State{Status: StatusRunning, Attempt: 1, StartedAt: t0, Progress: i % 100, Result: res}}); err != nil {
				t.Error(err)
				return
			}
			bob := fmt.Sprintf("bob::k%05d", (i*17)%n)
			switch i % 16 {
			case 0:
				_, _ = s.AddWatcher(ctx, bob, "i.1", "carol")
			case 1:
				if rec, err := s.GetTask(ctx, bob); err == nil && rec.RunID == "i.1" {
					rec.RunID, rec.CreatedAt = "i.2", t0.Add(-time.Hour)
					_ = s.ReplaceTask(ctx, rec, "i.1")
				}
			case 2:
				_ = s.InsertTask(ctx, Record{ID: fmt.Sprintf("bob::new%06d", i), RunID: "i.1", Watchers: []string{"bob", "alice"}, CreatedAt: t0.Add(-time.Hour),
					State: State{Status: StatusCompleted, Attempt: 1, StartedAt: t0, CompletedAt: t0, Cause: CauseCompleted}})
			case 3: // a whole walk of the store
				_, _ = s.DeleteFinished(ctx, t0.Add(time.Second))
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	for range 4 {
		for _, order := range []Order{OldestFirst, NewestFirst} {
			for _, user := range []string{"", "alice"} {
				recs, err := s.ListTasks(ctx, Filter{VisibleTo: user, Order: order})
				require.NoError(t, err)
				var got []string
				for _, r := range recs {
					if r.ID >= "alice::" && r.ID < "alice;" {
						got = append(got, r.ID)
					}
				}
				want := slices.Clone(stay)
				if order == NewestFirst {
					slices.Reverse(want)
				}
				if !slices.Equal(want, got) {
					require.Equal(t, want, got, "user %q order %v", user, order)
				}
				snaps, _, err := s.listSnapshots(ctx, Filter{VisibleTo: user, Order: order}, true, false)
				require.NoError(t, err)
				got = got[:0]
				for i := range snaps {
					if id := snaps[i].ID; id >= "alice::" && id < "alice;" {
						got = append(got, id)
					}
				}
				if !slices.Equal(want, got) {
					require.Equal(t, want, got, "snapshots: user %q order %v", user, order)
				}
			}
		}
	}
}
