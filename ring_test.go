package workers

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// checkRing fails t unless g holds exactly want, in that order, and each
// run knows its slot.
func checkRing(t *testing.T, g *runRing, want []*Task) {
	t.Helper()
	got := g.appendTo(nil)
	require.Equal(t, len(want), len(got))
	for i := range want {
		require.Same(t, want[i], got[i], "run %d", i)
	}
	require.EqualValues(t, len(want), g.n)
	mask := uint32(len(g.slots) - 1)
	for _, r := range want {
		require.True(t, g.holds(r))
		require.Same(t, r, g.slots[uint32(r.pos-1)&mask], "a run's slot holds it")
	}
}

// pushRuns pushes n new runs onto g and returns them.
func pushRuns(g *runRing, n int) []*Task {
	runs := make([]*Task, n)
	for i := range runs {
		runs[i] = new(Task)
		g.push(runs[i])
	}
	return runs
}

func TestRunRingKeepsRunsInTheOrderPushed(t *testing.T) {
	var g runRing
	runs := pushRuns(&g, 40)
	checkRing(t, &g, runs)

	g.remove(runs[5]) // from the middle
	g.remove(runs[0]) // the oldest
	g.remove(runs[39])
	assert.False(t, g.holds(runs[5]))
	checkRing(t, &g, slices.Concat(runs[1:5], runs[6:39]))

	g.clear()
	checkRing(t, &g, nil)
	for _, r := range runs {
		assert.False(t, g.holds(r), "clear lets go of every run")
	}
}

// A queue drained in order: the ring grows with the runs and, once they
// have settled, shrinks back.
func TestRunRingGrowsAndShrinksWithItsRuns(t *testing.T) {
	var g runRing
	runs := pushRuns(&g, 5000)
	assert.Equal(t, 8192, len(g.slots), "the smallest power of two that holds them")
	for i, r := range runs {
		g.remove(r)
		if i%1000 == 0 {
			checkRing(t, &g, runs[i+1:])
			assert.LessOrEqual(t, len(g.slots), ringFor(len(runs)-i-1)*2, "it shrinks as it drains")
		}
	}
	checkRing(t, &g, nil)
	assert.Equal(t, minRing, len(g.slots))
}

// One run that stays while many after it come and go keeps head behind:
// the ring moves its few runs to a smaller ring instead of growing.
func TestRunRingDoesNotGrowBehindARunThatStays(t *testing.T) {
	var g runRing
	stays := new(Task)
	g.push(stays)
	live := []*Task{}
	for i := range 100_000 {
		r := new(Task)
		g.push(r)
		live = append(live, r)
		if len(live) > 3 {
			g.remove(live[0])
			live = live[1:]
		}
		require.LessOrEqual(t, len(g.slots), 4*minRing, "round %d: slots for at most five runs", i)
	}
	checkRing(t, &g, append([]*Task{stays}, live...))
	g.remove(stays)
	checkRing(t, &g, live)
}

// A random mix of pushes and removals, checked against a slice.
func TestRunRingMatchesAModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var g runRing
	var model []*Task
	peak := 0
	for i := range 200_000 {
		if len(model) == 0 || rng.IntN(100) < 52-i/5000 {
			r := new(Task)
			g.push(r)
			model = append(model, r)
		} else {
			// Mostly the oldest, as a queue settles; sometimes any.
			j := 0
			if rng.IntN(4) == 0 {
				j = rng.IntN(len(model))
			}
			g.remove(model[j])
			model = slices.Delete(model, j, j+1)
		}
		peak = max(peak, len(model))
		require.LessOrEqual(t, len(g.slots), max(minRing, 4*peak))
		if i%997 == 0 {
			checkRing(t, &g, model)
		}
	}
	checkRing(t, &g, model)
}

// Positions wrap around at 2^32 without losing a run or its order.
func TestRunRingPositionsWrapAround(t *testing.T) {
	g := runRing{head: math.MaxUint32 - 20, tail: math.MaxUint32 - 20}
	var model []*Task
	for i := range 300 {
		r := new(Task)
		g.push(r)
		model = append(model, r)
		if i%3 == 2 {
			g.remove(model[1]) // leave the oldest behind, for a compaction
			model = slices.Delete(model, 1, 2)
		}
	}
	checkRing(t, &g, model)
	assert.Less(t, g.tail, g.head, "the positions wrapped")
	for len(model) > 0 {
		g.remove(model[0])
		model = model[1:]
		if len(model)%17 == 0 {
			checkRing(t, &g, model)
		}
	}
	checkRing(t, &g, nil)
	assert.Equal(t, g.head, g.tail, "head passed every settled run")
	assert.Equal(t, minRing, len(g.slots))
}
