package workers

import (
	"encoding/base64"
	"fmt"
	"slices"
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
