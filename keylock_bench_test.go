package workers

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"testing"
)

// BenchmarkKeyLockWaiters measures n goroutines that each take one held
// id's lock and release it: all of them queue behind the holder, which
// releases the lock once they wait, so that the queue grows to n and
// the lock passes down all of it. An op is one pass of all n.
func BenchmarkKeyLockWaiters(b *testing.B) {
	for _, n := range []int{1, 100, 1000, 10000} {
		b.Run("waiters="+strconv.Itoa(n), func(b *testing.B) {
			k := newKeyLocks()
			s := k.stripe("a")
			b.ReportAllocs()
			for range b.N {
				h := mustLock(b, &k, "a")
				var wg, started sync.WaitGroup
				started.Add(n)
				for range n {
					wg.Go(func() {
						started.Done()
						mustLock(b, &k, "a").unlock()
					})
				}
				started.Wait()
				waitQueued(s, h.l, n)
				h.unlock()
				wg.Wait()
			}
		})
	}
}

// BenchmarkKeyLockWaitersLeave is KeyLockWaiters with waiters whose
// context ends while they wait: all n queue behind the holder, their
// context ends and each leaves the queue, then the holder releases the
// lock. An op is one pass of all n.
func BenchmarkKeyLockWaitersLeave(b *testing.B) {
	for _, n := range []int{1, 100, 1000, 10000} {
		b.Run("waiters="+strconv.Itoa(n), func(b *testing.B) {
			k := newKeyLocks()
			s := k.stripe("a")
			b.ReportAllocs()
			for range b.N {
				h := mustLock(b, &k, "a")
				ctx, cancel := context.WithCancel(context.Background())
				var wg, started sync.WaitGroup
				started.Add(n)
				for range n {
					wg.Go(func() {
						started.Done()
						if _, err := k.lock(ctx, "a"); err == nil {
							b.Error("a waiter took the lock while it was held")
						}
					})
				}
				started.Wait()
				waitQueued(s, h.l, n)
				cancel()
				wg.Wait()
				h.unlock()
			}
		})
	}
}

// waitQueued waits until n callers wait for l, of stripe s, once the
// goroutines that are to wait have started.
func waitQueued(s *keyStripe, l *keyLock, n int) {
	for {
		s.mu.Lock()
		waiting := 0
		for w := l.wait; w != nil; w = w.next {
			waiting++
		}
		s.mu.Unlock()
		if waiting == n {
			return
		}
		runtime.Gosched()
	}
}
