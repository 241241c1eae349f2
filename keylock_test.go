package workers

import (
	"fmt"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sameStripe returns n ids that hash to one stripe of k.
func sameStripe(k *keyLocks, n int) []string {
	ids := []string{"id-0"}
	for i := 1; len(ids) < n; i++ {
		if id := fmt.Sprint("id-", i); k.stripe(id) == k.stripe(ids[0]) {
			ids = append(ids, id)
		}
	}
	return ids
}

func TestKeyLockSerializesOneID(t *testing.T) {
	k := newKeyLocks()
	ids := sameStripe(&k, 3)
	counts := make([]int, len(ids)) // each id's count is written only under its lock
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				j := (g + i) % len(ids)
				h := k.lock(ids[j])
				n := counts[j] // the race detector reports two holders at once
				counts[j] = n + 1
				h.unlock()
			}
		})
	}
	wg.Wait()
	total := 0
	for _, n := range counts {
		total += n
	}
	assert.Equal(t, 8*500, total)
	assert.Nil(t, k.stripe(ids[0]).held, "a stripe lists no lock once all are released")
}

// Ids of one stripe are locked apart: holding one never makes another wait.
func TestKeyLockOtherIDsOfTheStripeNeverWait(t *testing.T) {
	k := newKeyLocks()
	ids := sameStripe(&k, 3)
	hs := make(chan keyHold)
	go func() {
		for _, id := range ids {
			hs <- k.lock(id) // in one goroutine: all three held at once
		}
		close(hs)
	}()
	var held []keyHold
	deadline := time.After(10 * time.Second)
	for len(held) < len(ids) {
		select {
		case h := <-hs:
			held = append(held, h)
		case <-deadline:
			t.Fatalf("%d of %d ids of one stripe locked: another id's lock made one wait", len(held), len(ids))
		}
	}
	s := k.stripe(ids[0])
	assert.Same(t, &s.spare, held[0].l, "the first id takes the stripe's own lock")
	assert.NotSame(t, held[1].l, held[2].l)
	for _, h := range held {
		h.unlock()
	}
	assert.Nil(t, s.held)
	assert.Zero(t, s.spare.refs)
}

func TestKeyLockWaiterGetsTheSameLock(t *testing.T) {
	k := newKeyLocks()
	h := k.lock("a")
	got := make(chan keyHold)
	go func() { got <- k.lock("a") }()
	s := k.stripe("a")
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return h.l.refs == 2
	}, 10*time.Second, time.Millisecond, "the waiter counts itself on the held lock")
	select {
	case <-got:
		t.Fatal("a second holder of one id")
	default:
	}
	h.unlock()
	h2 := <-got
	assert.Same(t, h.l, h2.l)
	h2.unlock()
	assert.Nil(t, s.held)
}

func TestKeyLockUncontendedAllocatesNothing(t *testing.T) {
	k := newKeyLocks()
	assert.Zero(t, testing.AllocsPerRun(100, func() { k.lock("a").unlock() }))
	assert.EqualValues(t, 64, unsafe.Sizeof(keyStripe{}), "a stripe is one cache line")
	assert.EqualValues(t, 64, unsafe.Sizeof(runShard{}), "a shard of the runs is one cache line")
	assert.EqualValues(t, 64, unsafe.Sizeof(memShard{}), "a shard of a MemStore is one cache line")
}
