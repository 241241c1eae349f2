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
