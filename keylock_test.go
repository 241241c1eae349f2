package workers

import (
	"context"
	"errors"
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
				h := mustLock(t, &k, ids[j])
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
			hs <- mustLock(t, &k, id) // in one goroutine: all three held at once
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
	assert.False(t, s.spare.held)
}

func TestKeyLockWaiterGetsTheSameLock(t *testing.T) {
	k := newKeyLocks()
	h := mustLock(t, &k, "a")
	got := make(chan keyHold)
	go func() { got <- mustLock(t, &k, "a") }()
	s := k.stripe("a")
	waitForWaiters(t, s, h.l, 1)
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

// A wait for a held lock ends with the waiter's context, and leaves the
// lock as it was: held, then passed to the next waiter, then free.
func TestKeyLockWaitEndsWithTheContext(t *testing.T) {
	k := newKeyLocks()
	h := mustLock(t, &k, "a")
	s := k.stripe("a")
	cause := errors.New("gave up")
	ctx, cancel := context.WithCancelCause(t.Context())
	gaveUp := make(chan error)
	go func() {
		_, err := k.lock(ctx, "a")
		gaveUp <- err
	}()
	waitForWaiters(t, s, h.l, 1)
	got := make(chan keyHold)
	go func() { got <- mustLock(t, &k, "a") }()
	waitForWaiters(t, s, h.l, 2)
	cancel(cause)
	select {
	case err := <-gaveUp:
		require.ErrorIs(t, err, cause)
	case <-time.After(10 * time.Second):
		t.Fatal("the wait went on after its context ended")
	}
	waitForWaiters(t, s, h.l, 1)
	h.unlock()
	h2 := <-got
	assert.Same(t, h.l, h2.l, "the lock passes to the waiter left")
	h2.unlock()
	assert.Nil(t, s.held)
	assert.False(t, s.spare.held)
}

// A waiter whose context ends as the lock passes to it passes it on, or
// frees it: the lock is never left held by nobody.
func TestKeyLockPassedAsTheWaitEndsGoesOn(t *testing.T) {
	k := newKeyLocks()
	for range 200 {
		h := mustLock(t, &k, "a")
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() {
			w, err := k.lock(ctx, "a")
			if err == nil {
				w.unlock()
			}
			done <- err
		}()
		waitForWaiters(t, k.stripe("a"), h.l, 1)
		// Most often both happen before the parked waiter runs, which
		// then finds both its cases ready and picks one at random.
		cancel()
		h.unlock()
		<-done
		ctx2, cancel2 := context.WithTimeout(t.Context(), 10*time.Second)
		h2, err := k.lock(ctx2, "a")
		require.NoError(t, err, "the lock was left held")
		h2.unlock()
		cancel2()
	}
	assert.Nil(t, k.stripe("a").held)
}

// Waiters take a lock in the order they came.
func TestKeyLockPassesInOrder(t *testing.T) {
	k := newKeyLocks()
	h := mustLock(t, &k, "a")
	s := k.stripe("a")
	var order []int // appended under the lock
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Go(func() {
			w := mustLock(t, &k, "a")
			order = append(order, i)
			w.unlock()
		})
		waitForWaiters(t, s, h.l, i+1)
	}
	h.unlock()
	wg.Wait()
	assert.Equal(t, []int{0, 1, 2, 3, 4}, order)
}

// mustLock takes id's lock, failing the test after 10 s.
func mustLock(t testing.TB, k *keyLocks, id string) keyHold {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := k.lock(ctx, id)
	if err != nil {
		t.Errorf("lock %q: %v", id, err)
	}
	return h
}

// waitForWaiters waits until n callers wait for l, of stripe s.
func waitForWaiters(t *testing.T, s *keyStripe, l *keyLock, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		got := 0
		for w := l.wait; w != nil; w = w.next {
			got++
		}
		return got == n
	}, 10*time.Second, time.Millisecond, "waiting for %d waiters", n)
}

func TestKeyLockUncontendedAllocatesNothing(t *testing.T) {
	k := newKeyLocks()
	assert.Zero(t, testing.AllocsPerRun(100, func() { h, _ := k.lock(context.Background(), "a"); h.unlock() }))
	assert.EqualValues(t, 64, unsafe.Sizeof(keyStripe{}), "a stripe is one cache line")
	assert.EqualValues(t, 64, unsafe.Sizeof(runShard{}), "a shard of the runs is one cache line")
	assert.EqualValues(t, 64, unsafe.Sizeof(memShard{}), "a shard of a MemStore is one cache line")
}

// A waiter joins the queue of a held lock, and leaves it when its
// context ends, without a walk of the queue from its first waiter: it
// touches the last waiter, or its own neighbours, only, so that n
// waiters for one id cost O(n) in all, not O(n²). The test links a decoy
// after the first waiter, which only a walk from there would reach,
// while one waiter joins and another leaves.
func TestKeyLockQueueIsNotWalked(t *testing.T) {
	k := newKeyLocks()
	h := mustLock(t, &k, "a")
	s := k.stripe("a")
	ctx, cancel := context.WithCancel(t.Context()) // ends every wait left behind
	defer cancel()
	var order []int // appended under the lock
	var cancels []context.CancelFunc
	var dones []chan error
	start := func() {
		i := len(dones)
		wctx, wcancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			w, err := k.lock(wctx, "a")
			if err == nil {
				order = append(order, i)
				w.unlock()
			}
			done <- err
		}()
		cancels, dones = append(cancels, wcancel), append(dones, done)
	}
	for i := range 4 {
		start()
		waitForWaiters(t, s, h.l, i+1)
	}
	s.mu.Lock()
	ws := []*keyWaiter{h.l.wait}
	for len(ws) < 4 {
		ws = append(ws, ws[len(ws)-1].next)
	}
	decoy := &keyWaiter{ready: make(chan struct{})}
	ws[0].next = decoy // the rest of the queue hidden from a walk from ws[0]
	s.mu.Unlock()

	start() // joins after ws[3]
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return ws[3].next != nil || decoy.next != nil
	}, 10*time.Second, time.Millisecond, "waiting for the fifth waiter")
	s.mu.Lock()
	assert.Nil(t, decoy.next, "a waiter that joined walked the queue")
	decoy.next = ws[2] // a walk from ws[0] now finds ws[2] past the decoy, not past ws[1]
	s.mu.Unlock()

	cancels[2]()
	require.ErrorIs(t, <-dones[2], context.Canceled)
	s.mu.Lock()
	assert.Same(t, decoy.next, ws[2], "a waiter that left walked the queue")
	assert.Same(t, ws[1].next, ws[3], "the waiter before the one that left links to the one after it")
	ws[0].next = ws[1]
	s.mu.Unlock()
	waitForWaiters(t, s, h.l, 4)
	if t.Failed() {
		return // the queue is not to be trusted: the waits end with ctx
	}

	h.unlock()
	for i, done := range dones {
		if i != 2 {
			require.NoError(t, <-done)
		}
	}
	assert.Equal(t, []int{0, 1, 3, 4}, order)
	assert.Nil(t, s.held)
}
