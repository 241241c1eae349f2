package workers

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
)

// testRun returns a bare run of id with a run id of its own.
func testRun(rt *Runtime[*MemStore], id string) *Task {
	return rt.newRun(ctx, id, "", caller{system: true}, submitOptions{}, nil)
}

func TestRunSetKeepsAReplacedRunUntilItSettles(t *testing.T) {
	rt := memRuntime(t)
	s := newRunSet()
	first, second := testRun(rt, "a"), testRun(rt, "a")
	assert.Nil(t, s.publish(first))
	assert.Same(t, first, s.publish(second), "the successor takes the handle")
	assert.Same(t, second, s.get("a"))
	assert.ElementsMatch(t, []*Task{first, second}, s.all(), "the predecessor is kept until it settles")

	s.settle(first)
	assert.Same(t, second, s.get("a"), "a predecessor's settling leaves its successor's handle")
	assert.Equal(t, 1, s.len())
	s.settle(second)
	assert.Nil(t, s.get("a"))
	assert.Zero(t, s.len())
}

func TestRunSetForgetKeepsRunsWithoutHandles(t *testing.T) {
	rt := memRuntime(t)
	s := newRunSet()
	var runs []*Task
	for i := range 40 { // over every shard, most likely
		r := testRun(rt, fmt.Sprint("k", i))
		s.publish(r)
		runs = append(runs, r)
	}
	retired := testRun(rt, "retired")
	s.addOther(retired)
	runs = append(runs, retired)

	assert.ElementsMatch(t, runs, s.forget())
	for _, r := range runs {
		assert.Nil(t, s.get(r.ID()), "no id is taken for alive after forget")
	}
	assert.Equal(t, len(runs), s.len(), "forgotten runs are tracked until they settle")
	assert.ElementsMatch(t, []*Task{runs[3], retired}, s.matching(map[string]struct{}{runs[3].ID(): {}, "retired": {}}))
	for _, r := range runs {
		s.settle(r)
	}
	assert.Zero(t, s.len())
}

// Runs of different ids publish and settle concurrently; each id's
// handle stays with its newest run.
func TestRunSetConcurrentPublishAndSettle(t *testing.T) {
	rt := memRuntime(t)
	s := newRunSet()
	var wg sync.WaitGroup
	last := make([]*Task, 8)
	for g := range last {
		wg.Go(func() {
			id := fmt.Sprint("id", g)
			for range 200 {
				r := testRun(rt, id)
				if old := s.publish(r); old != nil {
					s.settle(old)
				}
				last[g] = r
			}
		})
	}
	wg.Wait()
	for g, r := range last {
		assert.Same(t, r, s.get(fmt.Sprint("id", g)))
	}
	assert.Equal(t, len(last), s.len())
}
