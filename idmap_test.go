package workers

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// idVal is a value that carries its id, as runs and records do.
type idVal struct {
	id string
	n  int
}

func (v *idVal) taskID() string { return v.id }

// An idMap behaves as a map keyed by the ids themselves, also when most
// hashes clash: with a mask of two bits, the table has two keys (slotKey
// moves 0 and 1 onto 2 and 3); with eight or ten, ids clash while the
// table grows.
func TestIDMapMatchesAMapByID(t *testing.T) {
	for _, c := range []struct {
		mask uint64
		ids  int
	}{{^uint64(0), 64}, {3, 64}, {0, 64}, {0xff, 2000}, {0x3ff, 2000}} {
		t.Run(fmt.Sprintf("mask=%#x", c.mask), func(t *testing.T) {
			m := newIDMap[*idVal]()
			m.mask = c.mask
			want := map[string]*idVal{}
			r := rand.New(rand.NewPCG(1, c.mask))
			for i := range 20000 {
				id := fmt.Sprint("k", r.IntN(c.ids))
				switch op := r.IntN(12); {
				case op < 4:
					v := &idVal{id: id, n: i}
					old, replaced := m.set(v)
					prev, had := want[id]
					require.Equal(t, had, replaced, "set %s: replaced", id)
					require.Same(t, prev, old, "set %s: the value replaced", id)
					want[id] = v
				case op < 5:
					v := &idVal{id: id, n: i}
					_, had := want[id]
					require.Equal(t, !had, m.add(v), "add %s", id)
					if !had {
						want[id] = v
					}
				case op < 6:
					v := want[id] // the value for id, or one that is not
					if v == nil || r.IntN(2) == 0 {
						v = &idVal{id: id, n: -i}
					}
					deleted := want[id] == v
					require.Equal(t, deleted, m.deleteValue(v), "deleteValue %s", id)
					if deleted {
						delete(want, id)
					}
				case op < 8:
					got, ok := m.get(id)
					w, had := want[id]
					require.Equal(t, had, ok, "get %s", id)
					require.Same(t, w, got, "get %s", id)
				case op < 11:
					// The value stored for id, when there is one.
					v, had := want[id]
					if !had {
						v = &idVal{id: id, n: -i}
					}
					require.Equal(t, had, m.deleteValue(v), "deleteValue %s", id)
					delete(want, id)
				default:
					if r.IntN(50) == 0 {
						m.clear()
						clear(want)
					}
				}
				require.Equal(t, len(want), m.len(), "len after op %d", i)
			}
			got := slices.Collect(m.all())
			require.ElementsMatch(t, slices.Collect(maps.Values(want)), got, "every value once")
		})
	}
}

// Deleting during the walk, as all's doc allows, removes exactly the
// values deleted, clashing ones included.
func TestIDMapDeleteWhileWalking(t *testing.T) {
	m := newIDMap[*idVal]()
	m.mask = 1
	for i := range 100 {
		m.set(&idVal{id: fmt.Sprint("k", i), n: i})
	}
	for v := range m.all() {
		if v.n%3 == 0 {
			require.True(t, m.deleteValue(v))
		}
	}
	require.Equal(t, 66, m.len())
	for i := range 100 {
		_, ok := m.get(fmt.Sprint("k", i))
		require.Equal(t, i%3 != 0, ok, "k%d", i)
	}
}
