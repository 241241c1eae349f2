package workers

import (
	"context"
	"iter"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
)

// BenchmarkSubmitToCompletion measures the hot path on MemStore: submit,
// run on its own goroutine, terminal record.
func BenchmarkSubmitToCompletion(b *testing.B) {
	benchThroughput(b, func(rt *Runtime[*MemStore], key string, fn Func) error {
		_, err := rt.Submit(ctx, key, fn, alice)
		return err
	})
}

// BenchmarkSubmitSequential measures the queue path: submit and hand over
// to the queue's processor.
func BenchmarkSubmitSequential(b *testing.B) {
	benchThroughput(b, func(rt *Runtime[*MemStore], key string, fn Func) error {
		_, err := rt.SubmitSequential(ctx, "q", key, fn, alice)
		return err
	})
}

// BenchmarkSubmitToCompletionStalledSubscriber is SubmitToCompletion
// while a Subscribe of the submitter's tasks never reads: its inbox fills
// to its bound, then it only awaits a re-read, and the runs go on as
// fast as without it.
func BenchmarkSubmitToCompletionStalledSubscriber(b *testing.B) {
	benchThroughputWith(b, Config{}, func(rt *Runtime[*MemStore]) func() {
		next, stop := iter.Pull2(rt.Subscribe(ctx, alice))
		g := newGate()
		if _, err := rt.Submit(ctx, "first", g.fn, alice); err != nil {
			b.Fatal(err)
		}
		if _, err, _ := next(); err != nil { // subscribed; never read again
			b.Fatal(err)
		}
		return func() { stop(); g.open() }
	}, func(rt *Runtime[*MemStore], key string, fn Func) error {
		_, err := rt.Submit(ctx, key, fn, alice)
		return err
	})
}

// BenchmarkSubmitBesideOtherStreams is SubmitToCompletion while other
// tenants have Subscribe streams open (subscribed, never ranged, as a
// dashboard's between two reads): what their number costs a submitter
// whose changes none of them may see.
func BenchmarkSubmitBesideOtherStreams(b *testing.B) {
	for _, others := range []int{0, 100, 10000} {
		b.Run("others="+strconv.Itoa(others), func(b *testing.B) {
			benchThroughputWith(b, Config{}, func(rt *Runtime[*MemStore]) func() {
				sctx, cancel := context.WithCancel(ctx)
				for i := range others {
					_ = rt.Subscribe(sctx, MustOwner("tenant"+strconv.Itoa(i)))
				}
				return cancel
			}, func(rt *Runtime[*MemStore], key string, fn Func) error {
				_, err := rt.Submit(ctx, key, fn, alice)
				return err
			})
		})
	}
}

// BenchmarkSubmitToCompletionHooked is SubmitToCompletion with one no-op
// observer and one pass-through middleware: the cost of the hooks.
func BenchmarkSubmitToCompletionHooked(b *testing.B) {
	cfg := Config{
		Observers:  []Observer{ObserverFunc(func(context.Context, Event) {})},
		Middleware: []Middleware{func(next Func) Func { return next }},
	}
	benchThroughputWith(b, cfg, nil, func(rt *Runtime[*MemStore], key string, fn Func) error {
		_, err := rt.Submit(ctx, key, fn, alice)
		return err
	})
}

// benchThroughput submits b.N tasks through submit, each under a new key,
// and stops the clock when every callback has run.
func benchThroughput(b *testing.B, submit func(rt *Runtime[*MemStore], key string, fn Func) error) {
	benchThroughputWith(b, Config{}, nil, submit)
}

// benchThroughputWith is benchThroughput on a runtime configured with
// cfg, after setup, whose returned func runs when the clock has stopped.
func benchThroughputWith(b *testing.B, cfg Config, setup func(*Runtime[*MemStore]) func(), submit func(rt *Runtime[*MemStore], key string, fn Func) error) {
	rt := newRuntime(b, NewMemStore(), cfg)
	if setup != nil {
		defer setup(rt)()
	}
	var wg sync.WaitGroup
	fn := func(context.Context, *Task) (any, error) { wg.Done(); return nil, nil }
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		wg.Add(1)
		if err := submit(rt, strconv.Itoa(i), fn); err != nil {
			b.Fatal(err)
		}
	}
	wg.Wait()
}

// BenchmarkStatus measures a status read of a finished task.
func BenchmarkStatus(b *testing.B) {
	rt := memRuntime(b)
	sub, err := rt.Submit(ctx, "k", noop, alice)
	if err != nil {
		b.Fatal(err)
	}
	settled(b, rt, sub.ID)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := rt.Status(ctx, sub.ID, alice); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSubmitLatency measures one task at a time: submit, then wait
// for its callback to run.
func BenchmarkSubmitLatency(b *testing.B) {
	rt := memRuntime(b)
	ran := make(chan struct{})
	fn := func(context.Context, *Task) (any, error) { ran <- struct{}{}; return nil, nil }
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := rt.Submit(ctx, strconv.Itoa(i), fn, alice); err != nil {
			b.Fatal(err)
		}
		<-ran
	}
}

// BenchmarkMemStoreWrites measures MemStore's writes with nobody
// listening: per op, an insert and the start transition of a new record.
func BenchmarkMemStoreWrites(b *testing.B) {
	s := NewMemStore()
	st := State{Status: StatusRunning, Attempt: 1}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		id := strconv.Itoa(i)
		if err := s.InsertTask(ctx, Record{ID: id, RunID: "r.1", State: State{Status: StatusPending}}); err != nil {
			b.Fatal(err)
		}
		if ok, err := s.TransitionTask(ctx, id, "r.1", fromPending, st); !ok || err != nil {
			b.Fatal(ok, err)
		}
	}
}

// BenchmarkRetained measures the reads a handler makes, Status of one
// task and the first page of one owner's list, over a MemStore holding
// 10^3 or 10^6 finished records (the owner's 100 among them, the rest
// spread over 10^3 other owners): their cost should not grow with the
// records retained.
func BenchmarkRetained(b *testing.B) {
	for _, n := range []int{1_000, 1_000_000} {
		s := NewMemStore()
		done := State{Status: StatusCompleted, Attempt: 1, Progress: 100, Result: []byte(`"ok"`)}
		t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		var mine string
		for i := range n {
			user := "u" + strconv.Itoa(i%1000)
			if i%(n/100) == 0 {
				user = "alice"
			}
			id := user + "::k" + strconv.Itoa(i)
			if user == "alice" {
				mine = id
			}
			st := done
			st.StartedAt, st.CompletedAt = t0.Add(time.Duration(i)*time.Millisecond), t0.Add(time.Duration(i)*time.Millisecond)
			rec := Record{ID: id, RunID: "i.r" + strconv.Itoa(i), Watchers: []string{user}, CreatedAt: st.StartedAt, State: st}
			if err := s.InsertTask(ctx, rec); err != nil {
				b.Fatal(err)
			}
		}
		rt := NewRuntime(s, Config{})
		runtime.GC() // the setup's garbage is not the reads' cost
		b.Run("op=Status/retained="+strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := rt.Status(ctx, mine, alice); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("op=ListPage/retained="+strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				p, err := rt.ListPage(ctx, alice, WithLimit(20))
				if err != nil || len(p.Tasks) != 20 {
					b.Fatal(len(p.Tasks), err)
				}
			}
		})
		b.StopTimer()
		if err := rt.Shutdown(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMemStoreRerun measures what a re-run of a finished key costs a
// MemStore: ReplaceTask of the oldest record, which leaves its place in
// the listing indexes for the newest, over 10^3 and 10^6 retained
// records. Its cost should not grow with the records retained.
func BenchmarkMemStoreRerun(b *testing.B) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, n := range []int{1_000, 1_000_000} {
		s := NewMemStore()
		ids, runs := make([]string, n), make([]string, n)
		done := State{Status: StatusCompleted, Attempt: 1, Progress: 100, Cause: CauseCompleted, StartedAt: t0, CompletedAt: t0}
		for i := range n {
			ids[i], runs[i] = "alice::k"+strconv.Itoa(i), "i."+strconv.Itoa(i)
			rec := Record{ID: ids[i], RunID: runs[i], Watchers: []string{"alice"}, CreatedAt: t0.Add(time.Duration(i) * time.Microsecond), State: done}
			if err := s.InsertTask(ctx, rec); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		b.Run("retained="+strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			next := n
			for i := 0; b.Loop(); i++ {
				k := i % n // the oldest record: each pass re-runs them in order
				run := "i." + strconv.Itoa(next)
				rec := Record{ID: ids[k], RunID: run, Watchers: []string{"alice"}, CreatedAt: t0.Add(time.Duration(next) * time.Microsecond), State: State{Status: StatusPending}}
				if err := s.ReplaceTask(ctx, rec, runs[k]); err != nil {
					b.Fatal(err)
				}
				runs[k] = run
				next++
			}
		})
	}
}

// BenchmarkLiveListing measures a listing of one owner's live tasks (as
// Subscribe's first read and the HTTP event stream's check make one)
// over a MemStore that keeps 10^3 and 10^5 of that owner's ended tasks.
// Its cost should follow the live tasks, three here, not the history.
func BenchmarkLiveListing(b *testing.B) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, n := range []int{1_000, 100_000} {
		s := NewMemStore()
		done := State{Status: StatusCompleted, StartedAt: t0, CompletedAt: t0}
		for i := range n {
			rec := Record{ID: "alice::old" + strconv.Itoa(i), RunID: "i.r" + strconv.Itoa(i), Watchers: []string{"alice"}, CreatedAt: t0.Add(time.Duration(i) * time.Microsecond), State: done}
			if err := s.InsertTask(ctx, rec); err != nil {
				b.Fatal(err)
			}
		}
		for i := range 3 {
			rec := Record{ID: "alice::live" + strconv.Itoa(i), RunID: "j.r" + strconv.Itoa(i), Watchers: []string{"alice"}, CreatedAt: t0.Add(time.Hour), State: State{Status: StatusPending}}
			if err := s.InsertTask(ctx, rec); err != nil {
				b.Fatal(err)
			}
		}
		rt := NewRuntime(s, Config{})
		runtime.GC()
		b.Run("history="+strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if got, err := rt.List(ctx, alice, WithStatus(StatusPending, StatusRunning)); err != nil || len(got) != 3 {
					b.Fatal(len(got), err)
				}
			}
		})
		b.StopTimer()
		if err := rt.Shutdown(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
