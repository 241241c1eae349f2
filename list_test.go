package workers

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestListPageWalksNewestFirstWithCursors(t *testing.T) {
	t.Parallel()
	store := NewMemStore()
	rt := newRuntime(t, store, Config{})
	var want []string
	base := now()
	for i := range 7 {
		id := fmt.Sprintf("alice::k%d", i)
		rec := Record{ID: id, RunID: "r" + id, Watchers: []string{"alice"}, CreatedAt: base.Add(time.Duration(i) * time.Second),
			State: State{Status: StatusCompleted, CompletedAt: base}}
		require.NoError(t, store.InsertTask(ctx, rec))
		want = append(want, id)
	}
	require.NoError(t, store.InsertTask(ctx, Record{ID: "bob::x", RunID: "rb", CreatedAt: base, State: State{Status: StatusPending}}))
	slices.Reverse(want)

	var got []string
	cursor, pages := "", 0
	for {
		p, err := rt.ListPage(ctx, alice, WithLimit(3), WithCursor(cursor))
		require.NoError(t, err)
		require.LessOrEqual(t, len(p.Tasks), 3)
		got = append(got, snapshotIDs(p.Tasks)...)
		pages++
		if p.Next == "" {
			break
		}
		cursor = p.Next
	}
	assert.Equal(t, want, got, "newest first by default, every task once")
	assert.Equal(t, 3, pages, "7 tasks in pages of 3; the last page has no next cursor")

	// A task submitted while paging is not seen again on later pages.
	first, err := rt.ListPage(ctx, alice, WithLimit(2))
	require.NoError(t, err)
	require.NoError(t, store.InsertTask(ctx, Record{ID: "alice::new", RunID: "rn", CreatedAt: base.Add(time.Hour), State: State{Status: StatusPending}}))
	second, err := rt.ListPage(ctx, alice, WithLimit(2), WithCursor(first.Next))
	require.NoError(t, err)
	assert.Equal(t, want[2:4], snapshotIDs(second.Tasks))

	// The cursor keeps its order.
	old, err := rt.ListPage(ctx, alice, WithLimit(2), WithOrder(OldestFirst))
	require.NoError(t, err)
	assert.Equal(t, []string{"alice::k0", "alice::k1"}, snapshotIDs(old.Tasks))
	next, err := rt.ListPage(ctx, alice, WithLimit(2), WithCursor(old.Next))
	require.NoError(t, err)
	assert.Equal(t, []string{"alice::k2", "alice::k3"}, snapshotIDs(next.Tasks))

	// Without WithLimit a page holds DefaultPageSize tasks.
	all, err := rt.ListPage(ctx, System)
	require.NoError(t, err)
	assert.Len(t, all.Tasks, 9)
	assert.Empty(t, all.Next)
}

// A key re-run while paging takes its new run's place, as ListPage says:
// newest first it falls behind the walk and is not listed again; oldest
// first it is listed again at the end.
func TestListPagePlacesAKeyReRunWhilePagingAtItsNewRun(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		order Order
		want  []string
	}{
		{NewestFirst, []string{"alice::k3", "alice::k2", "alice::k1"}},
		{OldestFirst, []string{"alice::k0", "alice::k1", "alice::k2", "alice::k3", "alice::k0"}},
	} {
		store := NewMemStore()
		rt := newRuntime(t, store, Config{})
		base := now().Add(-time.Hour)
		for i := range 4 {
			at := base.Add(time.Duration(i) * time.Minute)
			require.NoError(t, store.InsertTask(ctx, Record{ID: fmt.Sprintf("alice::k%d", i), RunID: fmt.Sprint("old.", i),
				Watchers: []string{"alice"}, CreatedAt: at, State: State{Status: StatusCompleted, CompletedAt: at}}))
		}
		var got []string
		for cursor, page := "", 0; ; page++ {
			p, err := rt.ListPage(ctx, alice, WithLimit(2), WithOrder(tc.order), WithCursor(cursor))
			require.NoError(t, err)
			got = append(got, snapshotIDs(p.Tasks)...)
			if p.Next == "" {
				break
			}
			cursor = p.Next
			if page == 0 { // k0 is re-run between the first two pages
				sub, err := rt.Submit(ctx, "k0", func(context.Context, *Task) (any, error) { return nil, nil }, alice)
				require.NoError(t, err)
				require.False(t, sub.Joined)
				_, err = rt.Wait(ctx, sub.ID, alice)
				require.NoError(t, err)
			}
		}
		assert.Equal(t, tc.want, got, "order %v", tc.order)
	}
}

func TestListPageRefusesABadCursor(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	good := encodeCursor(NewestFirst, &Position{CreatedAt: now(), ID: "alice::k"})
	_, err := rt.ListPage(ctx, alice, WithCursor(good))
	require.NoError(t, err)
	raw, _ := base64.RawURLEncoding.DecodeString(good)
	for name, c := range map[string]string{
		"not base64":  "%%%",
		"truncated":   good[:10],
		"bad version": base64.RawURLEncoding.EncodeToString(append([]byte{9}, raw[1:]...)),
		"bad order":   base64.RawURLEncoding.EncodeToString(append([]byte{1, 7}, raw[2:]...)),
		"bad id":      base64.RawURLEncoding.EncodeToString(append(raw[:cursorHeader:cursorHeader], "\x00"...)),
	} {
		_, err := rt.ListPage(ctx, alice, WithCursor(c))
		assert.ErrorIs(t, err, ErrInvalidCursor, name)
		_, err = rt.List(ctx, alice, WithCursor(c))
		assert.ErrorIs(t, err, ErrInvalidCursor, name)
	}
}

func TestCursorRoundTrips(t *testing.T) {
	t.Parallel()
	for _, p := range []Position{{CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC), ID: "alice::k"}, {ID: "global"}} {
		for _, o := range []Order{OldestFirst, NewestFirst} {
			order, got, err := decodeCursor(encodeCursor(o, &p))
			require.NoError(t, err)
			assert.Equal(t, o, order)
			assert.True(t, got.CreatedAt.Equal(p.CreatedAt))
			assert.Equal(t, p.ID, got.ID)
		}
	}
}

// hiddenLister is a MemStore inside another type, as a user's wrapper
// would hold it: listings take its ListTasks, not the MemStore's own
// snapshot path.
type hiddenLister struct {
	*MemStore
	lists *atomic.Int64
}

func (h hiddenLister) ListTasks(ctx context.Context, f Filter) ([]Record, error) {
	h.lists.Add(1)
	return h.MemStore.ListTasks(ctx, f)
}

// filterSeer is a MemStore inside another type that keeps the filter of
// the last listing.
type filterSeer struct {
	*MemStore
	last *atomic.Pointer[Filter]
}

func (s filterSeer) ListTasks(ctx context.Context, f Filter) ([]Record, error) {
	s.last.Store(&f)
	return s.MemStore.ListTasks(ctx, f)
}

// A status given again and again counts once: the store is asked about
// each status once, however long the caller's list (a query string's,
// say), and so about five at most.
func TestListingAsksTheStoreAboutEachStatusOnce(t *testing.T) {
	t.Parallel()
	last := new(atomic.Pointer[Filter])
	rt := newRuntime[Store](t, filterSeer{NewMemStore(), last}, Config{})
	_, err := rt.Submit(ctx, "k", returns("done", nil), alice)
	require.NoError(t, err)
	many := slices.Repeat([]Status{StatusCompleted, StatusRunning}, 50_000)
	page, err := rt.ListPage(ctx, alice, WithStatus(many...), WithStatus(StatusCompleted))
	require.NoError(t, err)
	require.NotNil(t, last.Load(), "the listing asked the store")
	assert.Equal(t, []Status{StatusCompleted, StatusRunning}, last.Load().Statuses)
	for _, snap := range page.Tasks {
		assert.Contains(t, []Status{StatusCompleted, StatusRunning}, snap.Status)
	}
	_, err = rt.ListPage(ctx, alice, WithStatus(slices.Repeat([]Status{StatusCompleted, "bogus"}, 50_000)...))
	require.ErrorIs(t, err, ErrInvalidOption)
}

// A MemStore renders a listing's snapshots straight from its records; they
// must be the very snapshots ListTasks' records give, for every filter,
// order, cursor and reader, live progress included.
func TestMemStoreListingMatchesListTasks(t *testing.T) {
	t.Parallel()
	store := NewMemStore()
	direct := newRuntime[Store](t, store, Config{})
	lists := new(atomic.Int64)
	viaStore := newRuntime[Store](t, hiddenLister{store, lists}, Config{})

	base := time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)
	statuses := []Status{StatusPending, StatusRunning, StatusCompleted, StatusFailed, StatusCancelled}
	for i := range 40 {
		owner := []string{"alice", "bob"}[i%2]
		st := fullState(t, statuses[i%len(statuses)])
		switch i % 4 {
		case 0:
			st.Result = nil
		case 1:
			st.Result = json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))
		}
		rec := Record{ID: fmt.Sprintf("%s::k%02d", owner, i), RunID: fmt.Sprintf("i.%d", i), Queue: []string{"", "q"}[i%3%2],
			Watchers: []string{owner, "carol"}[:1+i%2], CreatedAt: base.Add(time.Duration(i%7) * time.Second), State: st}
		require.NoError(t, store.InsertTask(ctx, rec))
	}
	// Watchers change after the insert: joins, and a re-run that drops one.
	for _, id := range []string{"bob::k01", "bob::k05", "alice::k06"} {
		rec, err := store.GetTask(ctx, id)
		require.NoError(t, err)
		ok, err := store.AddWatcher(ctx, id, rec.RunID, "dave")
		require.NoError(t, err)
		require.True(t, ok)
	}
	rerun, err := store.GetTask(ctx, "alice::k04")
	require.NoError(t, err)
	prev := rerun.RunID
	rerun.RunID, rerun.Watchers = "i.rerun", []string{"alice"}
	require.NoError(t, store.ReplaceTask(ctx, rerun, prev))

	// What a listing must hold, found the slow way: every record, in the
	// listing's order, each checked against the whole filter, visibility
	// included.
	bruteForce := func(who TaskAuthority, opts []ListOption) []string {
		_, f, err := listFilter(who, opts)
		require.NoError(t, err)
		everything, err := store.ListTasks(ctx, Filter{Order: f.Order})
		require.NoError(t, err)
		require.Len(t, everything, 40)
		ids := []string{}
		for i := range everything {
			if f.Match(&everything[i]) && (f.Limit <= 0 || len(ids) < f.Limit) {
				ids = append(ids, everything[i].ID)
			}
		}
		return ids
	}
	filters := map[string][]ListOption{
		"all":       nil,
		"oldest":    {WithOrder(OldestFirst)},
		"statuses":  {WithStatus(StatusRunning, StatusCompleted)},
		"queue":     {WithQueue("q")},
		"limit":     {WithLimit(3)},
		"oldest+q":  {WithOrder(OldestFirst), WithQueue("q"), WithLimit(4)},
		"none left": {WithStatus(StatusRunning), WithQueue("nowhere")},
		"after":     {WithCursor(encodeCursor(NewestFirst, &Position{CreatedAt: base.Add(3 * time.Second), ID: "alice::k10"}))},
	}
	for name, opts := range filters {
		for _, who := range []TaskAuthority{alice, bob, MustOwner("carol"), MustOwner("dave"), System} {
			want, err := viaStore.List(ctx, who, opts...)
			require.NoError(t, err)
			got, err := direct.List(ctx, who, opts...)
			require.NoError(t, err)
			require.Equal(t, want, got, "%s, as %v", name, who)
			require.Equal(t, bruteForce(who, opts), snapshotIDs(got), "%s, as %v: the records the filter selects", name, who)
			require.Positive(t, lists.Swap(0), "a wrapper's own ListTasks serves its listings")

			// Page by page, cursors included, both ways to the end.
			for cursor, pages := "", 0; pages == 0 || cursor != ""; pages++ {
				require.Less(t, pages, 20, "%s, as %v: the pages never end", name, who)
				popts := append(slices.Clone(opts), WithLimit(4))
				if cursor != "" {
					popts = append(popts, WithCursor(cursor))
				}
				wantPage, err := viaStore.ListPage(ctx, who, popts...)
				require.NoError(t, err)
				gotPage, err := direct.ListPage(ctx, who, popts...)
				require.NoError(t, err)
				require.Equal(t, wantPage, gotPage, "%s, as %v, page %d", name, who, pages)
				cursor = gotPage.Next
			}
		}
	}

	// Each runtime shows the live progress of its own runs.
	for i, rt := range []*Runtime[Store]{direct, viaStore} {
		who := MustOwner(fmt.Sprintf("erin%d", i))
		started, release := make(chan struct{}), make(chan struct{})
		sub, err := rt.Submit(ctx, "live", func(ctx context.Context, t *Task) (any, error) {
			t.SetProgress(42)
			close(started)
			<-release
			return nil, nil
		}, who)
		require.NoError(t, err)
		<-started
		list, err := rt.List(ctx, who)
		close(release)
		require.NoError(t, err)
		require.Len(t, list, 1)
		assert.Equal(t, sub.ID, list[0].ID)
		assert.Equal(t, 42, list[0].Progress, "a run of this runtime shows its live progress")
	}
}

// The results of a listing's snapshots share one buffer: each is its own
// part of it, so that changing one, even appending to it, changes neither
// another snapshot nor the store.
func TestListingResultsDoNotAlias(t *testing.T) {
	t.Parallel()
	store := NewMemStore()
	rt := newRuntime(t, store, Config{})
	base := now()
	for i := range 3 {
		rec := Record{ID: fmt.Sprintf("alice::k%d", i), RunID: "r", CreatedAt: base.Add(time.Duration(i) * time.Second),
			State: State{Status: StatusCompleted, CompletedAt: base, Result: json.RawMessage(fmt.Sprintf(`"r%d"`, i))}}
		require.NoError(t, store.InsertTask(ctx, rec))
	}
	list, err := rt.List(ctx, alice, WithOrder(OldestFirst))
	require.NoError(t, err)
	require.Len(t, list, 3)
	list[0].Result = append(list[0].Result, "XXXX"...)
	list[1].Result[1] = 'Z'
	assert.Equal(t, `"r0"XXXX`, string(list[0].Result))
	assert.Equal(t, `"Z1"`, string(list[1].Result))
	assert.Equal(t, `"r2"`, string(list[2].Result), "an append to one result does not run into the next")
	again, err := rt.List(ctx, alice, WithOrder(OldestFirst))
	require.NoError(t, err)
	for i, s := range again {
		assert.Equal(t, fmt.Sprintf(`"r%d"`, i), string(s.Result), "the store keeps its own")
	}
}

// A page over a MemStore allocates the same whatever its size: nothing
// per record.
func TestListPageAllocatesPerPageNotPerRecord(t *testing.T) {
	store := NewMemStore()
	rt := newRuntime(t, store, Config{})
	base := now()
	for i := range 200 {
		rec := Record{ID: fmt.Sprintf("alice::k%03d", i), RunID: "r", Watchers: []string{"alice", "bob"}, CreatedAt: base.Add(time.Duration(i) * time.Millisecond),
			State: State{Status: StatusCompleted, CompletedAt: base, Result: json.RawMessage(`"done"`)}}
		require.NoError(t, store.InsertTask(ctx, rec))
	}
	page := func(n int) float64 {
		return testing.AllocsPerRun(50, func() {
			p, err := rt.ListPage(ctx, alice, WithLimit(n))
			if err != nil || len(p.Tasks) != n || p.Next == "" {
				t.Fatal(len(p.Tasks), err)
			}
		})
	}
	p, err := rt.ListPage(ctx, alice, WithLimit(10))
	require.NoError(t, err)
	require.NotEmpty(t, p.Next)
	assert.Equal(t, 10, cap(p.Tasks), "the record that tells a next page exists is looked for, not rendered")
	small, large := page(5), page(100)
	assert.LessOrEqual(t, large, small+2, "a page of 100 allocates about what a page of 5 does (%v vs %v)", large, small)
}

// System granting exactly one owner with WithWatchers: that owner
// watches the task, as with two or more.
func TestSystemGrantsASingleWatcher(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	sub, err := rt.Submit(ctx, "nightly", returns(1, nil), System, WithWatchers(bob))
	require.NoError(t, err)
	settled(t, rt, sub.ID)
	snap, err := rt.Status(ctx, sub.ID, bob)
	require.NoError(t, err, "bob was granted the task")
	assert.Equal(t, 1, snap.WatcherCount)
	list, err := rt.List(ctx, bob)
	require.NoError(t, err)
	assert.Len(t, list, 1)
	rec, err := rt.Store().GetTask(ctx, sub.ID)
	require.NoError(t, err)
	assert.Equal(t, []string{"bob"}, rec.Watchers)
}

// A cursor crafted with a time no store holds exactly is refused, not
// handed to a store that would wrap it around; the range's ends pass.
func TestCursorWithATimeNoStoreHoldsIsRefused(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	for _, at := range []time.Time{time.Unix(1<<62, 0), cursorMax.Add(time.Second), cursorMin.Add(-time.Second), time.Unix(-1<<62, 0)} {
		c := encodeCursor(OldestFirst, &Position{ID: "alice::zzz", CreatedAt: at})
		_, err := rt.ListPage(ctx, alice, WithCursor(c))
		assert.ErrorIs(t, err, ErrInvalidCursor, "%v", at)
	}
	for _, at := range []time.Time{cursorMin, cursorMax} {
		c := encodeCursor(OldestFirst, &Position{ID: "alice::zzz", CreatedAt: at})
		_, err := rt.ListPage(ctx, alice, WithCursor(c))
		assert.NoError(t, err, "%v", at)
	}
}

// A cursor ListPage handed out is one it takes back, whatever time the
// record it names was created at within what a MemStore keeps (from the
// zero time, before which no store keeps one, to year 285,000 or so).
func TestListPageTakesBackTheCursorsItGives(t *testing.T) {
	t.Parallel()
	s := NewMemStore()
	rt := newRuntime(t, s, Config{})
	for i, at := range []time.Time{
		time.Date(1, 1, 1, 0, 0, 0, 1000, time.UTC),
		time.Date(1, 1, 2, 0, 0, 0, 0, time.UTC),
		time.Date(285100, 1, 1, 0, 0, 0, 0, time.UTC),
	} {
		require.NoError(t, s.InsertTask(ctx, Record{ID: fmt.Sprintf("alice::r%d", i), RunID: "x.1", Watchers: []string{"alice"},
			CreatedAt: at, State: State{Status: StatusCompleted, CompletedAt: at}}))
	}
	var got []string
	var cursor []ListOption
	for range 4 {
		page, err := rt.ListPage(ctx, alice, append(cursor, WithLimit(1))...)
		require.NoError(t, err)
		for _, snap := range page.Tasks {
			got = append(got, snap.ID)
		}
		if page.Next == "" {
			break
		}
		cursor = []ListOption{WithCursor(page.Next)}
	}
	assert.Equal(t, []string{"alice::r2", "alice::r1", "alice::r0"}, got)
}

// A queue filter is checked as a queue's name is at submission, so that
// a store's refusal of bytes no queue's name has is never taken for a
// bad cursor; a valid cursor stays valid.
func TestListFilterChecksTheQueueName(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	for i := range 3 {
		_, err := rt.SubmitSequential(ctx, "q", strconv.Itoa(i), returns(i, nil), alice)
		require.NoError(t, err)
	}
	page, err := rt.ListPage(ctx, alice, WithQueue("q"), WithLimit(1))
	require.NoError(t, err)
	require.NotEmpty(t, page.Next)
	for _, q := range []string{"q\x00", "\xff", strings.Repeat("q", MaxKeyLen+1)} {
		_, err := rt.ListPage(ctx, alice, WithQueue(q), WithCursor(page.Next))
		assert.ErrorIs(t, err, ErrInvalidKey, "%q", q)
		_, err = rt.List(ctx, alice, WithQueue(q))
		assert.ErrorIs(t, err, ErrInvalidKey, "%q", q)
	}
}

// A filter no task could match by mistake is refused, not answered with
// an empty list or every task.
func TestListRefusesAnUnknownStatusAndANegativeLimit(t *testing.T) {
	t.Parallel()
	rt := memRuntime(t)
	_, err := rt.Submit(ctx, "a", returns(1, nil), alice)
	require.NoError(t, err)
	for _, opt := range []ListOption{WithStatus(StatusCompleted, "bogus"), WithLimit(-1)} {
		_, err := rt.List(ctx, alice, opt)
		assert.ErrorIs(t, err, ErrInvalidOption)
		_, err = rt.ListPage(ctx, alice, opt)
		assert.ErrorIs(t, err, ErrInvalidOption)
	}
}

// A page as large as an int allows lists every task, with no next page,
// over every store: one more, to tell whether a next page exists, must
// not overflow into a negative limit.
func TestListPageWithTheLargestLimitListsEverything(t *testing.T) {
	for _, s := range []Store{NewMemStore(), &negativeLimitRefused{NewMemStore()}} {
		rt := newRuntime(t, s, Config{})
		for i := range 3 {
			sub, err := rt.Submit(ctx, fmt.Sprint("k", i), noop, alice)
			require.NoError(t, err)
			settled(t, rt, sub.ID)
		}
		p, err := rt.ListPage(ctx, alice, WithLimit(math.MaxInt))
		require.NoError(t, err)
		assert.Len(t, p.Tasks, 3)
		assert.Empty(t, p.Next)
	}
}

// negativeLimitRefused is a store that refuses a negative limit, as a SQL
// store's LIMIT does.
type negativeLimitRefused struct{ *MemStore }

func (s *negativeLimitRefused) ListTasks(ctx context.Context, f Filter) ([]Record, error) {
	if f.Limit < 0 {
		return nil, fmt.Errorf("LIMIT must not be negative: %d", f.Limit)
	}
	return s.MemStore.ListTasks(ctx, f)
}

// Subscribe takes the options List takes; those that do not apply to a
// stream (WithLimit, WithOrder, WithCursor) are still refused with a value
// List refuses, rather than ignored.
func TestSubscribeRefusesTheOptionValuesListRefuses(t *testing.T) {
	rt := newRuntime(t, NewMemStore(), Config{})
	for _, c := range []struct {
		opt  ListOption
		want error
	}{
		{WithOrder(Order(9)), ErrInvalidOption},
		{WithLimit(-1), ErrInvalidOption},
		{WithCursor("garbage"), ErrInvalidCursor},
	} {
		_, listErr := rt.ListPage(ctx, alice, c.opt)
		require.ErrorIs(t, listErr, c.want)
		n := 0
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		for _, err := range rt.Subscribe(sctx, alice, c.opt) {
			assert.ErrorIs(t, err, c.want)
			if n++; n > 1 || err == nil {
				break
			}
		}
		assert.Equal(t, 1, n, "the stream yields its error alone")
	}
}
