package workers

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An ordered index in small chunks behaves as one sorted slice: records
// added anywhere (many share a time, as records of one microsecond do),
// removed anywhere, a time's worth at once, and walked from any cursor in
// either order, stopping early or not.
func TestOrderedMatchesASortedSlice(t *testing.T) {
	for _, max := range []int{1, 2, 3, 8, 16} {
		t.Run(fmt.Sprint("chunk=", max), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(max), 7))
			pool := make([]*memRecord, 60)
			for i := range pool {
				pool[i] = testMemRecord(fmt.Sprintf("k%02d", i), memTime(1+r.IntN(6))) // ids unique, times shared
			}
			o := &ordered{max: max}
			var want []*memRecord // sorted by compareMem, each record once
			for step := range 4000 {
				rec := pool[r.IntN(len(pool))]
				switch op := r.IntN(10); {
				case op < 4:
					o.add(rec)
					if i, found := slices.BinarySearchFunc(want, rec, compareMem); !found {
						want = slices.Insert(want, i, rec)
					}
				case op < 7:
					o.remove(rec)
					if i, found := slices.BinarySearchFunc(want, rec, compareMem); found && want[i] == rec {
						want = slices.Delete(want, i, i+1)
					}
				case op < 8:
					// Every record of one time leaves, as a prune's do.
					for _, m := range slices.Clone(want) {
						if m.created == rec.created {
							o.remove(m)
						}
					}
					want = slices.DeleteFunc(want, func(m *memRecord) bool { return m.created == rec.created })
				default:
					f := Filter{Order: OldestFirst}
					if r.IntN(2) == 0 {
						f.Order = NewestFirst
					}
					if r.IntN(4) > 0 {
						// A record's position, or one a nanosecond after a
						// record's time (between two microseconds).
						p := &Position{CreatedAt: rec.created.time(), ID: rec.id()}
						if r.IntN(3) == 0 {
							p = &Position{CreatedAt: rec.created.time().Add(time.Nanosecond)}
						}
						f.After = p
					}
					limit := r.IntN(len(want) + 2)
					var got []*memRecord
					o.walk(f, func(m *memRecord) bool {
						got = append(got, m)
						return len(got) < limit
					})
					exp := walkSorted(want, f)
					exp = exp[:min(len(exp), max1(limit))]
					require.Equal(t, keysOf(exp), keysOf(got), "step %d: walk %+v limit %d", step, f, limit)
				}
				require.Equal(t, len(want), o.len(), "step %d: len", step)
				var all []*memRecord
				for _, c := range o.chunks {
					require.NotEmpty(t, c, "step %d: an empty chunk", step)
					require.LessOrEqual(t, len(c), max, "step %d: a chunk over its size", step)
					all = append(all, c...)
				}
				require.Equal(t, keysOf(want), keysOf(all), "step %d: contents", step)
			}
		})
	}
}

// walkSorted is walk over a sorted slice.
func walkSorted(sorted []*memRecord, f Filter) []*memRecord {
	var out []*memRecord
	for _, m := range sorted {
		if f.After == nil {
			out = append(out, m)
			continue
		}
		c := compareKeys(m.created.time(), m.id(), f.After.CreatedAt, f.After.ID)
		if (f.Order == NewestFirst && c < 0) || (f.Order != NewestFirst && c > 0) {
			out = append(out, m)
		}
	}
	if f.Order == NewestFirst {
		slices.Reverse(out)
	}
	return out
}

// max1 is the number of records a walk yields before yield returns false
// at limit: at least one.
func max1(limit int) int { return max(limit, 1) }

// keysOf names each record by its time and id, for comparing walks.
func keysOf(recs []*memRecord) []string {
	out := make([]string, len(recs))
	for i, m := range recs {
		out[i] = fmt.Sprintf("%d/%s", m.created, m.id())
	}
	return out
}

// An index most of whose records leave, as a pruned history's do, keeps
// its chunks at least about an eighth full: a chunk under a quarter full
// joins a neighbour that leaves room.
func TestOrderedStaysDenseAsRecordsLeave(t *testing.T) {
	o := &ordered{max: 16}
	var all []*memRecord
	for i := range 1600 {
		r := testMemRecord(fmt.Sprintf("k%04d", i), memTime(i+1))
		o.add(r)
		all = append(all, r)
	}
	require.Len(t, o.chunks, 100)
	for i, r := range all {
		if i%20 != 0 {
			o.remove(r)
		}
	}
	require.Equal(t, 80, o.len())
	require.LessOrEqual(t, len(o.chunks), 10, "80 records left in %d chunks of 16", len(o.chunks))
	var left []*memRecord
	for _, c := range o.chunks {
		left = append(left, c...)
	}
	require.Equal(t, 80, len(left))
	require.True(t, slices.IsSortedFunc(left, compareMem))
}

// A record removed from an index is not kept alive by it, whether its
// chunk stayed, split, emptied or joined a neighbour.
func TestOrderedKeepsNoRemovedRecordAlive(t *testing.T) {
	o := &ordered{max: 8}
	collected := make(chan struct{}, 64)
	var keep []*memRecord
	for i := range 64 {
		r := testMemRecord(fmt.Sprintf("k%04d", i+100), memTime(i+100))
		if i%5 == 0 {
			keep = append(keep, r)
		} else {
			runtime.AddCleanup(r, func(struct{}) { collected <- struct{}{} }, struct{}{})
		}
		o.add(r)
	}
	o.add(testMemRecord("k0000", 1)) // splits the first chunk
	for _, c := range slices.Clone(o.chunks) {
		for _, r := range slices.Clone(c) {
			if r.created > 1 && !slices.Contains(keep, r) {
				o.remove(r)
			}
		}
	}
	require.Equal(t, len(keep)+1, o.len())
	const want = 64 - 13
	deadline := time.After(10 * time.Second)
	for got := 0; got < want; {
		runtime.GC()
		select {
		case <-collected:
			got++
		case <-deadline:
			t.Fatalf("%d of the %d records removed were collected", got, want)
		}
	}
	runtime.KeepAlive(o)
}

// testMemRecord returns a record of id created at created, and nothing
// else.
func testMemRecord(id string, created memTime) *memRecord {
	return &memRecord{ids: id, idLen: uint16(len(id)), created: created}
}
