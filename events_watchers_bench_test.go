package workers

import (
	"iter"
	"strconv"
	"testing"
)

// BenchmarkProgressManyWatchers measures one progress change of a
// running task granted to many watchers while one Subscribe stream (the
// owner's, never read past its first event) is open: the change reaches
// the streams of System, of the owner and of each watcher.
func BenchmarkProgressManyWatchers(b *testing.B) {
	for _, n := range []int{10, 100, 1000, 10000} {
		b.Run("watchers="+strconv.Itoa(n), func(b *testing.B) {
			rt := memRuntime(b)
			owners := make([]Owner, n-1) // and the submitter
			for i := range owners {
				owners[i] = MustOwner("w" + strconv.Itoa(i))
			}
			g := newGate()
			if _, err := rt.Submit(ctx, "job", g.fn, alice, WithWatchers(owners...)); err != nil {
				b.Fatal(err)
			}
			wait(b, g.started, "the run to start")
			defer g.open()
			next, stop := iter.Pull2(rt.Subscribe(ctx, alice))
			defer stop()
			if _, err, _ := next(); err != nil { // subscribed
				b.Fatal(err)
			}
			t := g.task.Load()
			if got := len(t.watcherList()); got != n {
				b.Fatalf("%d watchers, want %d", got, n)
			}
			r := t.ensureState()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				r.progress.Store(int32(i % 100))
				rt.hub.progress(t)
			}
		})
	}
}

// BenchmarkDistinct measures distinct over a list of n watchers with one
// repeat at its end, the worst case of a list checked name by name.
func BenchmarkDistinct(b *testing.B) {
	for _, n := range []int{10, 100, 1000, 10000} {
		b.Run("watchers="+strconv.Itoa(n), func(b *testing.B) {
			w := make([]string, n)
			for i := range w {
				w[i] = "u" + strconv.Itoa(i)
			}
			w[n-1] = w[0]
			b.ReportAllocs()
			for range b.N {
				_ = distinct(w)
			}
		})
	}
}
