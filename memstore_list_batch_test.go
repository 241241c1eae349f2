package workers

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A listing that passes over a long history (one tenant's failures among
// its many completed tasks, say) does not hold the store's locks for all
// of it: another tenant's insert, made while it walks, lands before the
// walk ends. The listing still lists exactly the records it selects, in
// either order.
func TestMemStoreLongListingLetsOtherWritesIn(t *testing.T) {
	s := NewMemStore()
	t0 := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	const n = 20_000
	var failed []string
	for i := range n {
		id := fmt.Sprintf("alice::k%05d", i)
		st := State{Status: StatusCompleted, Attempt: 1, StartedAt: t0, CompletedAt: t0, Cause: CauseCompleted}
		if i%100 == 0 {
			st.Status, st.Cause, st.Error = StatusFailed, CauseFailed, "boom"
			failed = append(failed, id)
		}
		require.NoError(t, s.InsertTask(ctx, Record{ID: id, RunID: "i.1", Watchers: []string{"alice"}, CreatedAt: t0.Add(time.Duration(i) * time.Millisecond), State: st}))
	}
	bob := Record{ID: "bob::a", RunID: "i.2", Watchers: []string{"bob"}, CreatedAt: t0, State: State{Status: StatusPending}}

	inserted := make(chan error, 1)
	var listed []string
	landed := false // bob's record was in the store at a record alice's walk listed since
	s.matches(Filter{VisibleTo: "alice", Statuses: []Status{StatusFailed}, Order: OldestFirst}, func(int) {}, func(v *Record) {
		listed = append(listed, v.ID)
		if len(listed) > 1 {
			landed = landed || s.byUser["bob"] != nil // the walk holds the lock that guards it
			return
		}
		go func() { inserted <- s.InsertTask(ctx, bob) }()
		// Once the insert waits for the lock, a read lock is refused.
		deadline := time.Now().Add(10 * time.Second)
		for s.mu.TryRLock() {
			s.mu.RUnlock()
			require.True(t, time.Now().Before(deadline), "the insert never asked for the store's lock")
			runtime.Gosched()
		}
	})
	require.NoError(t, <-inserted)
	require.True(t, landed, "bob's insert waited for the whole of alice's walk")
	require.Equal(t, failed, listed)

	for _, order := range []Order{OldestFirst, NewestFirst} {
		recs, err := s.ListTasks(ctx, Filter{VisibleTo: "alice", Statuses: []Status{StatusFailed}, Order: order})
		require.NoError(t, err)
		ids := make([]string, len(recs))
		for i := range recs {
			ids[i] = recs[i].ID
		}
		want := slices.Clone(failed)
		if order == NewestFirst {
			slices.Reverse(want)
		}
		require.Equal(t, want, ids, "order %v", order)
		page, err := s.ListTasks(ctx, Filter{VisibleTo: "alice", Statuses: []Status{StatusFailed}, Order: order, Limit: 150})
		require.NoError(t, err)
		require.Len(t, page, 150, "order %v: a limit across batches", order)
		require.Equal(t, want[149], page[149].ID, "order %v", order)
	}
}
