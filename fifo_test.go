package workers

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// A fifo gives back what it was given, in order, across block
// boundaries, as a slice used as a queue does.
func TestFIFOMatchesASlice(t *testing.T) {
	var f fifo[int]
	var want []int
	r := rand.New(rand.NewPCG(2, 3))
	next := 0
	for i := range 5000 {
		switch op := r.IntN(100); {
		case op < 55:
			for range r.IntN(3 * fifoBlockLen / 2) {
				f.push(next)
				want = append(want, next)
				next++
			}
		case op < 97:
			for range r.IntN(fifoBlockLen) {
				v, ok := f.pop()
				require.Equal(t, len(want) > 0, ok, "pop %d", i)
				if ok {
					require.Equal(t, want[0], v, "pop %d", i)
					want = want[1:]
				}
			}
		case op < 99:
			require.True(t, slices.Equal(want, slices.Collect(f.all())), "all, op %d", i)
		default:
			require.True(t, slices.Equal(want, f.takeAll()), "takeAll, op %d", i)
			want = nil
		}
		require.Equal(t, len(want), f.len(), "len after op %d", i)
	}
}

// A read block is let go, and a list that empties keeps one block to
// write again.
func TestFIFOLetsReadBlocksGo(t *testing.T) {
	var f fifo[*int]
	for i := range 3 * fifoBlockLen {
		f.push(&i)
	}
	first := f.head
	for range fifoBlockLen {
		f.pop()
	}
	require.NotSame(t, first, f.head, "the read block is no longer the head")
	require.Nil(t, first.items[fifoBlockLen-1], "a popped item is not kept")
	for range 2 * fifoBlockLen {
		f.pop()
	}
	require.Same(t, f.head, f.tail, "an empty list keeps one block")
	f.push(new(int))
	require.Equal(t, 1, f.len())
	require.Same(t, f.head, f.tail)
}
