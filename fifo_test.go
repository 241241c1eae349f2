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

// Blocks grow from fifoMinBlock to fifoBlockLen; a read block is let
// go; a list that empties keeps only a small block, which one item at a
// time reuses.
func TestFIFOLetsReadBlocksGo(t *testing.T) {
	var f fifo[*int]
	for i := range 3 * fifoBlockLen {
		f.push(&i)
	}
	var sizes []int
	for b := f.head; b != nil; b = b.next {
		sizes = append(sizes, len(b.items))
	}
	require.Equal(t, []int{8, 16, 32, 64, 128, 256, 256, 256}, sizes)
	first := f.head
	for range fifoMinBlock {
		f.pop()
	}
	require.NotSame(t, first, f.head, "the read block is no longer the head")
	require.Nil(t, first.items[fifoMinBlock-1], "a popped item is not kept")
	for f.len() > 0 {
		f.pop()
	}
	require.Nil(t, f.head, "an emptied list lets its large last block go")

	f.push(new(int))
	small := f.head
	require.Len(t, small.items, fifoMinBlock)
	for range 100 {
		f.pop()
		f.push(new(int))
	}
	require.Same(t, small, f.head, "one item at a time reuses the small block")
	require.Equal(t, 1, f.len())
}
