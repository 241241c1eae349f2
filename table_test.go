package workers

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// checkTable checks a table's invariants: its counts, that every probe
// ends at an empty slot, that no key is held twice, that nothing stays
// below old's move point, and that find reaches every value.
func checkTable(t *testing.T, tb *table[int]) {
	t.Helper()
	used, live := 0, 0
	seen := map[uint64]bool{}
	value := func(s *hslot[int]) {
		t.Helper()
		if seen[s.k] {
			t.Fatalf("key %#x held twice", s.k)
		}
		seen[s.k] = true
		if tb.find(s.k) != s {
			t.Fatalf("find %#x: not its slot", s.k)
		}
		live++
	}
	for i := range tb.slots {
		if s := &tb.slots[i]; s.k > tombSlot {
			value(s)
		}
		if tb.slots[i].k != emptySlot {
			used++
		}
	}
	require.Equal(t, used, tb.used, "used")
	require.LessOrEqual(t, used*4, len(tb.slots)*3, "slots over three quarters used")
	if tb.old != nil {
		require.Contains(t, tb.old, hslot[int]{}, "old has no empty slot")
		for i := range tb.old {
			if s := &tb.old[i]; s.k > tombSlot {
				if i < tb.moved {
					t.Fatalf("a value below old's move point")
				}
				value(s)
			}
		}
	}
	require.Equal(t, live, tb.live, "live")
}

// A table behaves as a Go map through growth, rebuilds that clear
// tombstones, and removals, with keys that crowd into few places and
// keys on the two marks.
func TestTableMatchesAMap(t *testing.T) {
	for _, universe := range []int{16, 1000, 8000} {
		r := rand.New(rand.NewPCG(2, uint64(universe)))
		var tb table[int]
		want := map[uint64]int{}
		key := func() uint64 {
			switch n := r.IntN(universe); n {
			case 0, 1:
				return slotKey(uint64(n)) // the marks, moved
			case 2, 3, 4, 5, 6, 7, 8, 9:
				return slotKey(uint64(n) << 32) // no low bits: one long probe
			default:
				return slotKey(uint64(n) * 0x9e3779b97f4a7c15)
			}
		}
		// Mostly inserts, then churn, then mostly removals.
		for phase, insertShare := range []int{9, 5, 1} {
			for i := range 6 * universe {
				k := key()
				s := tb.find(k)
				v, had := want[k]
				require.Equal(t, had, s != nil, "phase %d op %d: find %#x", phase, i, k)
				switch {
				case had:
					require.Equal(t, v, s.v)
					if r.IntN(10) >= insertShare {
						tb.remove(s)
						delete(want, k)
					}
				case r.IntN(10) < insertShare:
					tb.insert(k, i)
					want[k] = i
				}
				if universe <= 16 || i%(universe/16) == 0 {
					checkTable(t, &tb)
				}
			}
			checkTable(t, &tb)
			var got []int
			tb.walk(func(v int) bool { got = append(got, v); return true })
			wantVals := make([]int, 0, len(want))
			for _, v := range want {
				wantVals = append(wantVals, v)
			}
			slices.Sort(got)
			slices.Sort(wantVals)
			require.Equal(t, wantVals, got, "phase %d: every value once", phase)
		}
	}
}

// A table grows a few slots per insert: no insert moves more than
// moveStep of the old array's slots, however large the table.
func TestTableGrowsWithoutAPause(t *testing.T) {
	var tb table[int]
	doublings := 0
	for i := range 1 << 16 {
		size, hadOld, moved := len(tb.slots), tb.old != nil, tb.moved
		tb.insert(slotKey(uint64(i)*0x9e3779b97f4a7c15), i)
		switch {
		case len(tb.slots) != size && size >= minTable:
			// This insert started a rebuild.
			doublings++
			require.False(t, hadOld, "insert %d: a rebuild began before the last one ended", i)
			if size <= moveStep {
				require.Nil(t, tb.old, "insert %d: a small table moves at once", i)
				break
			}
			require.NotNil(t, tb.old, "insert %d: the whole table moved at once", i)
			require.Equal(t, moveStep, tb.moved, "insert %d", i)
		case hadOld && tb.old != nil:
			require.Equal(t, moved+moveStep, tb.moved, "insert %d", i)
		}
	}
	require.Equal(t, 14, doublings, "8 to 128Ki slots")
	checkTable(t, &tb)
}

// Removing values while walking, during a rebuild, yields every value
// once and removes exactly those removed.
func TestTableRemoveWhileWalkingARebuild(t *testing.T) {
	var tb table[int]
	for i := range 97 {
		tb.insert(slotKey(uint64(i)+100), i)
	}
	require.NotNil(t, tb.old, "a rebuild is under way")
	var seen []int
	tb.walk(func(v int) bool {
		seen = append(seen, v)
		if v%2 == 0 {
			tb.remove(tb.find(slotKey(uint64(v) + 100)))
		}
		return true
	})
	slices.Sort(seen)
	want := make([]int, 97)
	for i := range want {
		want[i] = i
	}
	require.Equal(t, want, seen)
	checkTable(t, &tb)
	for i := range 97 {
		require.Equal(t, i%2 == 1, tb.find(slotKey(uint64(i)+100)) != nil, "value %d", i)
	}
}

// Inserts and removals at a steady number of values, which fill the
// table with tombstones and rebuild it at its size, keep every value,
// never start a rebuild while the last one moves, and keep the table
// within four slots per value.
func TestTableChurnKeepsItsValuesAndItsSize(t *testing.T) {
	for _, base := range []int{5, 31, 500, 4095} {
		var tb table[int]
		next := uint64(0)
		fresh := func() uint64 { next++; return slotKey(next * 0x9e3779b97f4a7c15) }
		for range base {
			tb.insert(fresh(), 0)
		}
		for i := range 50000 {
			old := tb.old
			k := fresh()
			tb.insert(k, i)
			if old != nil && tb.old != nil && &tb.old[0] != &old[0] {
				t.Fatalf("base %d insert %d: a rebuild began before the last one ended", base, i)
			}
			tb.remove(tb.find(k))
			if len(tb.slots) > 4*(base+1)+minTable {
				t.Fatalf("base %d insert %d: %d slots", base, i, len(tb.slots))
			}
		}
		checkTable(t, &tb)
		require.Equal(t, base, tb.live)
	}
}

// A walk stops when yield returns false, as a break in a range over an
// idMap's values makes it.
func TestTableWalkStops(t *testing.T) {
	m := newIDMap[*idVal]()
	for i := range 100 {
		m.add(&idVal{id: strconv.Itoa(i)})
	}
	n := 0
	for range m.all() {
		if n++; n == 3 {
			break
		}
	}
	require.Equal(t, 3, n)
}

// An insert takes the first tombstone on its key's probe, so that a key
// removed and inserted again uses no more slots.
func TestTableReusesTombstones(t *testing.T) {
	var tb table[int]
	for i := range 5 {
		tb.insert(slotKey(uint64(i)<<32), i) // one home slot: one probe
	}
	used := tb.used
	for i := range 100 {
		tb.remove(tb.find(slotKey(0)))
		tb.insert(slotKey(0), i)
		require.Equal(t, used, tb.used, "round %d", i)
	}
	checkTable(t, &tb)
}
