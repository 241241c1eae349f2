package sqlcore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// recorder is a combiner's exec that records each batch's keys, answers
// ok for every key but "fenced", and blocks while gate is set.
type recorder struct {
	mu      sync.Mutex
	batches [][]string
	gate    chan struct{} // if non-nil, exec waits for it or its ctx
	ctxErr  []error       // each batch's ctx.Err() when exec returned
}

func (r *recorder) exec(ctx context.Context, batch []*call[int]) {
	r.mu.Lock()
	keys := make([]string, len(batch))
	for i, w := range batch {
		keys[i] = w.key
	}
	r.batches = append(r.batches, keys)
	gate := r.gate
	r.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
		}
	}
	for _, w := range batch {
		w.ok = w.key != "fenced" && w.in >= 0
		if w.in < 0 {
			w.err = fmt.Errorf("refused %d", w.in)
		}
	}
	r.mu.Lock()
	r.ctxErr = append(r.ctxErr, ctx.Err())
	r.mu.Unlock()
}

func (r *recorder) seen() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.batches)
}

func newCombiner(r *recorder, limit, max int) *combiner[int] {
	return &combiner[int]{limit: limit, max: max, exec: r.exec}
}

// A lone write leaves at once, alone, and no goroutine stays behind.
func TestCombinerLoneWriteGoesAtOnce(t *testing.T) {
	r := &recorder{}
	c := newCombiner(r, 1, 8)
	for i := range 3 {
		ok, err := c.do(t.Context(), fmt.Sprint("k", i), i)
		if !ok || err != nil {
			t.Fatalf("do = %v, %v", ok, err)
		}
	}
	if got := r.seen(); !slices.EqualFunc(got, [][]string{{"k0"}, {"k1"}, {"k2"}}, slices.Equal) {
		t.Errorf("batches = %v, want each write alone", got)
	}
	if ok, err := c.do(t.Context(), "fenced", 0); ok || err != nil {
		t.Errorf("a fenced-off write: do = %v, %v, want false, nil", ok, err)
	}
	if ok, err := c.do(t.Context(), "bad", -1); ok || err == nil {
		t.Errorf("a refused write: do = %v, %v, want its own error", ok, err)
	}
}

// Writes that arrive while a batch is in flight go together in the next,
// one per key, at most max, each caller told its own outcome.
func TestCombinerGathersWritesBehindABatchInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{gate: make(chan struct{})}
		c := newCombiner(r, 1, 4)
		type result struct {
			ok  bool
			err error
		}
		results := make(map[string]result)
		n := 0
		var mu sync.Mutex
		var wg sync.WaitGroup
		do := func(key string, in int) {
			n++
			name := fmt.Sprint(n, ":", key)
			wg.Go(func() {
				ok, err := c.do(context.Background(), key, in)
				mu.Lock()
				results[name] = result{ok, err}
				mu.Unlock()
			})
			synctest.Wait() // queued, in this order
		}
		do("first", 0) // in flight, held at the gate
		for _, k := range []string{"a", "b", "a", "fenced", "c", "d"} {
			do(k, 1)
		}
		do("bad", -1)
		r.mu.Lock()
		close(r.gate)
		r.gate = nil
		r.mu.Unlock()
		wg.Wait()
		want := [][]string{{"first"}, {"a", "b", "fenced", "c"}, {"a", "d", "bad"}}
		if got := r.seen(); !slices.EqualFunc(got, want, slices.Equal) {
			t.Errorf("batches = %v, want %v", got, want)
		}
		for key, res := range results {
			_, k, _ := strings.Cut(key, ":")
			wantOK := k != "fenced" && k != "bad"
			if res.ok != wantOK || (res.err != nil) != (k == "bad") {
				t.Errorf("%s: do = %v, %v", key, res.ok, res.err)
			}
		}
		if len(results) != 8 {
			t.Errorf("%d callers answered, want 8", len(results))
		}
	})
}

// A caller whose context ends while its write still queues returns its
// context's error, and the write is never made.
func TestCombinerDropsAWriteWhoseCallerLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{gate: make(chan struct{})}
		c := newCombiner(r, 1, 8)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if _, err := c.do(context.Background(), "first", 0); err != nil {
				t.Error(err)
			}
		}()
		synctest.Wait()
		ctx, cancel := context.WithCancel(context.Background())
		left := make(chan error)
		go func() {
			_, err := c.do(ctx, "left", 0)
			left <- err
		}()
		synctest.Wait()
		cancel()
		if err := <-left; !errors.Is(err, context.Canceled) {
			t.Errorf("do after its context ended = %v, want context.Canceled", err)
		}
		close(r.gate)
		<-done
		synctest.Wait()
		if got := r.seen(); !slices.EqualFunc(got, [][]string{{"first"}}, slices.Equal) {
			t.Errorf("batches = %v, want the departed write never made", got)
		}
		if _, err := c.do(ctx, "late", 0); !errors.Is(err, context.Canceled) {
			t.Errorf("do with a context already done = %v, want context.Canceled", err)
		}
	})
}

// A write whose caller's context ended is dropped by the next batch even
// when its caller has not yet woken to say it left.
func TestCombinerDropsAWriteWhoseContextEndedBeforeItsCallerWoke(t *testing.T) {
	r := &recorder{}
	c := newCombiner(r, 1, 8)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w := &call[int]{ctx: ctx, key: "left", done: make(chan struct{})}
	c.queue = append(c.queue, w, &call[int]{ctx: context.Background(), key: "stays", done: make(chan struct{})})
	batch := c.take()
	if len(batch) != 1 || batch[0].key != "stays" {
		t.Errorf("batch = %v, want only the write whose caller waits", batch)
	}
	select {
	case <-w.done:
		if !errors.Is(w.err, context.Canceled) {
			t.Errorf("the dropped write's error = %v, want context.Canceled", w.err)
		}
	default:
		t.Error("the dropped write's caller was not released")
	}
}

// A caller whose context ends while its batch is in flight gets its own
// context's error, never the batch's: the batch's context ends because
// its callers left, and the error the batch then returns says only that.
// (Which of the two the caller saw first was a race.)
func TestCombinerCallerWhoseContextEndsGetsItsOwnError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := &combiner[int]{limit: 1, max: 8, exec: func(ctx context.Context, batch []*call[int]) {
			<-ctx.Done()
			for _, w := range batch {
				w.err = fmt.Errorf("write tasks: %w", ctx.Err())
			}
		}}
		for range 100 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := c.do(ctx, "k", 0)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("do = %v, want its own context's context.DeadlineExceeded", err)
			}
			synctest.Wait() // the batch's goroutine ends
		}
	})
}

// A batch runs while anyone waits for it, and its context ends once every
// caller in it has left; each caller returns when its own context ends.
func TestCombinerBatchEndsWhenEveryCallerLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{gate: make(chan struct{})}
		c := newCombiner(r, 1, 8)
		first, cancelFirst := context.WithCancel(context.Background())
		errs := make(chan error, 3)
		go func() { _, err := c.do(first, "first", 0); errs <- err }()
		synctest.Wait()
		ctxs := make([]context.CancelFunc, 2)
		for i := range ctxs {
			ctx, cancel := context.WithCancel(context.Background())
			ctxs[i] = cancel
			go func() { _, err := c.do(ctx, fmt.Sprint("k", i), 0); errs <- err }()
			synctest.Wait()
		}
		cancelFirst()
		<-errs // nil or context.Canceled: its batch ends as it leaves
		// The first batch's only caller left: its context ends, and the
		// queued writes go next, together, held at the gate in turn.
		synctest.Wait()
		r.mu.Lock()
		if len(r.ctxErr) != 1 || !errors.Is(r.ctxErr[0], context.Canceled) {
			t.Errorf("batch contexts at their end = %v, want the first batch's cancelled", r.ctxErr)
		}
		r.mu.Unlock()
		if got := r.seen(); len(got) != 2 || !slices.Equal(got[1], []string{"k0", "k1"}) {
			t.Fatalf("batches = %v, want the two queued writes together next", got)
		}
		ctxs[0]()
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Fatalf("k0, gone: %v", err)
		}
		synctest.Wait()
		r.mu.Lock()
		if len(r.ctxErr) != 1 || !errors.Is(r.ctxErr[0], context.Canceled) {
			t.Errorf("batch contexts at their end = %v, want the second batch still running for k1", r.ctxErr)
		}
		r.mu.Unlock()
		ctxs[1]()
		<-errs
		synctest.Wait()
		r.mu.Lock()
		if len(r.ctxErr) != 2 || !errors.Is(r.ctxErr[1], context.Canceled) {
			t.Errorf("batch contexts at their end = %v, want both cancelled once their callers left", r.ctxErr)
		}
		r.mu.Unlock()
	})
}

// holder is a combiner's exec that holds a batch holding a key of held
// until that key's channel closes, and records each batch.
type holder struct {
	mu      sync.Mutex
	held    map[string]chan struct{}
	batches [][]string
}

func (h *holder) exec(ctx context.Context, batch []*call[int]) {
	h.mu.Lock()
	keys := make([]string, len(batch))
	var wait []chan struct{}
	for i, w := range batch {
		keys[i] = w.key
		if ch := h.held[w.key]; ch != nil {
			wait = append(wait, ch)
		}
	}
	h.batches = append(h.batches, keys)
	h.mu.Unlock()
	for _, ch := range wait {
		select {
		case <-ch:
		case <-ctx.Done():
		}
	}
	for _, w := range batch {
		w.ok = true
	}
}

func (h *holder) seen() [][]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.batches)
}

// A batch in flight for the stall time lets the writes queued behind it
// go in a spare batch, never one of a key still in flight; a spare batch
// leaves the queue to the others when it ends; and once the stuck batch
// ends its timer stops (the bubble would not end otherwise).
func TestCombinerStalledBatchLetsQueuedWritesPass(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		h := &holder{held: map[string]chan struct{}{"stuck": release}}
		c := &combiner[int]{limit: 1, max: 8, spare: 1, stall: 20 * time.Millisecond, exec: h.exec}
		var wg sync.WaitGroup
		answered := make(chan string, 8)
		// next is the key answered since the last look; the stall timer
		// keeps the bubble's clock going, so a missing answer must fail
		// here rather than block.
		next := func() string {
			select {
			case key := <-answered:
				return key
			default:
				return "nothing"
			}
		}
		do := func(key string) {
			wg.Go(func() {
				if ok, err := c.do(context.Background(), key, 0); !ok || err != nil {
					t.Errorf("%s: do = %v, %v", key, ok, err)
				}
				answered <- key
			})
			synctest.Wait()
		}
		do("stuck")
		do("a")
		do("stuck") // the same key as the batch in flight: never beside it
		synctest.Wait()
		if got := h.seen(); !slices.EqualFunc(got, [][]string{{"stuck"}}, slices.Equal) {
			t.Fatalf("before the stall: batches = %v", got)
		}
		time.Sleep(20 * time.Millisecond)
		synctest.Wait()
		if got := next(); got != "a" {
			t.Fatalf("answered %q first, want a", got)
		}
		do("b")
		time.Sleep(20 * time.Millisecond) // the next stall
		synctest.Wait()
		if got := next(); got != "b" {
			t.Fatalf("answered %q, want b", got)
		}
		want := [][]string{{"stuck"}, {"a"}, {"b"}}
		if got := h.seen(); !slices.EqualFunc(got, want, slices.Equal) {
			t.Fatalf("batches = %v, want %v", got, want)
		}
		h.mu.Lock()
		delete(h.held, "stuck")
		h.mu.Unlock()
		close(release)
		wg.Wait()
		synctest.Wait() // the batches' goroutines count themselves out after they wake their callers
		want = append(want, []string{"stuck"})
		if got := h.seen(); !slices.EqualFunc(got, want, slices.Equal) {
			t.Fatalf("batches = %v, want %v", got, want)
		}
		c.mu.Lock()
		if c.running != 0 || len(c.busy) != 0 || len(c.queue) != 0 {
			t.Errorf("after the last batch: running %d, busy %v, queued %d", c.running, c.busy, len(c.queue))
		}
		c.mu.Unlock()
	})
}

// A stall timer whose batch has ended, but which fired as it ended (and
// so was not stopped in time), starts nothing and does not re-arm: the
// loop that ended the batch goes on with the queue itself.
func TestCombinerStallAfterTheBatchEndedDoesNothing(t *testing.T) {
	h := &holder{}
	c := &combiner[int]{limit: 1, max: 8, spare: 1, stall: time.Hour, exec: h.exec}
	w := &call[int]{ctx: context.Background(), key: "a", done: make(chan struct{})}
	c.queue = append(c.queue, w)
	c.running = 1
	timer := time.AfterFunc(time.Hour, func() {})
	timer.Stop()
	ended := true
	c.stalled(&timer, &ended)
	if timer.Stop() {
		t.Error("the timer was armed again")
	}
	if len(c.queue) != 1 || c.running != 1 || len(c.busy) != 0 {
		t.Errorf("queued %d, running %d, busy %v; want the queue untouched", len(c.queue), c.running, c.busy)
	}
	if got := h.seen(); len(got) != 0 {
		t.Errorf("batches = %v, want none", got)
	}
}

// A second write of a key in flight, with room for another batch, waits
// for the first without counting as a batch in flight: the combiner
// still starts limit batches at once afterwards.
func TestCombinerSecondWriteOfAKeyInFlightTakesNoBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{gate: make(chan struct{})}
		c := newCombiner(r, 2, 8)
		var wg sync.WaitGroup
		for i := range 2 {
			wg.Go(func() { c.do(t.Context(), "k", i) })
			synctest.Wait()
		}
		c.mu.Lock()
		running, queued := c.running, len(c.queue)
		c.mu.Unlock()
		if running != 1 || queued != 1 {
			t.Errorf("%d batches in flight, %d writes queued; want 1 and 1", running, queued)
		}
		close(r.gate)
		wg.Wait()
		synctest.Wait() // the batch's goroutine counts itself out after it wakes its callers
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.running != 0 {
			t.Errorf("%d batches in flight once every write returned, want 0", c.running)
		}
	})
}
