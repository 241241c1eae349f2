package workers

import (
	"context"
	"runtime/pprof"
	"sync"
)

// maxIdleRunners bounds the runner goroutines kept parked between runs.
const maxIdleRunners = 32

// runners are the goroutines that execute async runs. A run is handed to
// a runner parked waiting for one, whose stack has already grown to what a
// run needs, or else to a new runner; a runner that finishes parks again
// unless maxIdleRunners already wait, and ends otherwise. Runners never
// bound how many runs execute at once.
type runners struct {
	work chan *Task    // unbuffered: a send lands only with a runner parked in receive
	quit chan struct{} // closed by stop: parked runners end

	// What a runner writes each time it parks, a cache line away from
	// work, which every submission reads (see cacheLinePad).
	_      cacheLinePad
	mu     sync.Mutex
	live   int           // guarded by mu: runners started and not ended
	idle   int           // guarded by mu: runners parked in receive, or about to be
	closed bool          // guarded by mu: set once by stop
	gone   chan struct{} // closed once closed and live is 0
}

func newRunners() *runners {
	return &runners{work: make(chan *Task), quit: make(chan struct{}), gone: make(chan struct{})}
}

// run executes t on a runner. After stop it starts a goroutine of t's own,
// which the caller's wait on t covers.
func (rt *Runtime[S]) run(t *Task) {
	r := rt.runners
	select {
	case r.work <- t:
		return
	default:
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		go rt.execute(t)
		return
	}
	r.live++
	r.mu.Unlock()
	go rt.runner(t)
}

// runner executes t, then the runs handed to it while it parks. It first
// grows its stack to what a run needs (see growStack).
//
// A callback that calls runtime.Goexit ends the runner from inside
// execute, which has recorded and settled its run (see attempts): the
// runner's deferred call counts it ended.
func (rt *Runtime[S]) runner(t *Task) {
	r := rt.runners
	growStack(0)
	// Started from a submitter's goroutine, whose profiler labels it
	// would keep while it parks and runs other owners' runs' writes (a
	// callback gets its own, see invoke).
	pprof.SetGoroutineLabels(context.Background())
	ended := false
	defer func() {
		if !ended {
			r.mu.Lock()
			r.exit()
			r.mu.Unlock()
		}
	}()
	for {
		rt.execute(t)
		if !r.park() {
			ended = true
			return
		}
		select {
		case t = <-r.work:
			r.mu.Lock()
			r.idle--
			r.mu.Unlock()
		case <-r.quit:
			r.mu.Lock()
			r.idle--
			r.exit()
			r.mu.Unlock()
			ended = true
			return
		}
	}
}

// park counts a runner about to wait for work, or reports false, having
// ended it, when enough already wait or the runners are stopping.
func (r *runners) park() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.idle >= maxIdleRunners {
		r.exit()
		return false
	}
	r.idle++
	return true
}

// exit ends a runner; mu is held.
func (r *runners) exit() {
	if r.live--; r.live == 0 && r.closed {
		close(r.gone)
	}
}

// stop ends the parked runners, and those executing once their runs
// settle, and returns a channel closed when the last has ended.
func (r *runners) stop() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.closed = true
		close(r.quit)
		if r.live == 0 {
			close(r.gone)
		}
	}
	return r.gone
}

// runStack is about what a run's calls need of its goroutine's stack,
// from execute down to the store's check of an outcome, with the
// runtime's guard below them: growStack makes room for it.
const runStack = 6 << 10

// growStack grows the calling goroutine's stack, while the goroutine is
// shallow, to hold runStack bytes more. A stack grows by copying itself
// and adjusting every frame on it, which costs by the frame; a new
// runner's first run would otherwise grow its stack twice, the second
// time from deep in the run, which took a fifth of the CPU time of
// BenchmarkSubmitToCompletion. Growing it here copies one frame. Call it
// with 0: reading another index than the one written keeps the compiler
// from dropping the array, and with it the frame.
//
//go:noinline
func growStack(i int) byte {
	var frame [runStack]byte
	frame[i] = 1
	return frame[i/2]
}
