package workershttp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/taskgate/workers"
)

// item is one value of an event stream.
type item struct {
	snap workers.Snapshot
	err  error
	// panicked is what seq panicked with (a store's bug), which the
	// handler's goroutine panics with again: there the server recovers
	// it, and only the stream fails, where on the pump's goroutine it
	// would end the process.
	panicked any
}

// raise panics with what the pump's seq panicked with, if it did.
func (it item) raise() {
	if it.panicked != nil {
		panic(it.panicked)
	}
}

// pump ranges over seq on a goroutine of its own, so that the handler can
// send heartbeats while it waits. The goroutine ends when ctx does, and
// the returned channel is closed then; the caller drains it, and calls
// raise on each item it takes.
func pump(ctx context.Context, seq iter.Seq2[workers.Snapshot, error]) <-chan item {
	ch := make(chan item)
	go func() {
		defer close(ch)
		defer func() {
			if p := recover(); p != nil {
				ch <- item{panicked: p} // the caller drains ch whatever happens
			}
		}()
		for s, err := range seq {
			select {
			case ch <- item{snap: s, err: err}:
			case <-ctx.Done():
				return
			}
			if err != nil && !errors.Is(err, workers.ErrSkipped) {
				return
			}
		}
	}()
	return ch
}

// stream writes the items of seq, made with a context that ends with
// the stream, as Server-Sent Events until seq ends or
// the client goes. first decides what to do with the first item before
// any header is written: it returns false when it answered the request
// itself. With a nil first, the stream opens at once.
func (h *handler) stream(w http.ResponseWriter, r *http.Request, auth workers.TaskAuthority, seq func(context.Context) iter.Seq2[workers.Snapshot, error], first func(item) bool) {
	rc := http.NewResponseController(w)
	// Each write gets its own deadline, so that a client that stopped
	// reading cannot hold the handler in a write for good, nor the
	// server's WriteTimeout end a stream that is merely old. The deadline
	// is cleared once the write is flushed: over HTTP/2 it is a timer that
	// resets the stream when it fires, written to or not, and would cut a
	// stream that has nothing to send.
	//
	// Once the stream context ends, a write in progress gets a deadline
	// of now, and so does every later one: a write blocked on a client
	// that reads nothing ends at once, rather than holding
	// http.Server.Shutdown until its own deadline. No deadline is set
	// once the handler has returned.
	var deadlines sync.Mutex
	writing, ended, finished := false, false, false
	defer func() {
		deadlines.Lock()
		finished = true
		deadlines.Unlock()
	}()
	deadline := func() {
		deadlines.Lock()
		defer deadlines.Unlock()
		writing = true
		switch {
		case ended:
			rc.SetWriteDeadline(time.Now())
		case h.cfg.writes > 0:
			rc.SetWriteDeadline(time.Now().Add(h.cfg.writes))
		}
	}
	written := func() {
		deadlines.Lock()
		defer deadlines.Unlock()
		writing = false
		if h.cfg.writes > 0 {
			rc.SetWriteDeadline(time.Time{})
		}
	}
	endWrites := func() {
		deadlines.Lock()
		defer deadlines.Unlock()
		ended = true
		if writing && !finished {
			rc.SetWriteDeadline(time.Now())
		}
	}
	// open sends the stream's headers.
	open := func() {
		hd := w.Header()
		hd.Set("Content-Type", "text/event-stream")
		hd.Set("Cache-Control", "no-store, no-transform") // no compressing proxy buffers it
		hd.Set("X-Accel-Buffering", "no")
		// The stream's own bound, or none, replaces the server's
		// WriteTimeout, which net/http set when it read the request.
		var bound time.Time
		if h.cfg.writes > 0 {
			bound = time.Now().Add(h.cfg.writes)
		}
		if errors.Is(rc.SetWriteDeadline(bound), http.ErrNotSupported) {
			// The stream works, with the server's bound or none: say so
			// once.
			srv, _ := r.Context().Value(http.ServerContextKey).(*http.Server)
			switch {
			case h.cfg.writes > 0:
				h.unbounded.Do(func() {
					h.cfg.logger.Error("workershttp: event streams served without their write timeout: their ResponseWriter cannot set a write deadline (a middleware's writer without an Unwrap method), so a client that stops reading holds its stream until its connection ends", "method", r.Method, "path", r.URL.Path)
				})
			case srv == nil || srv.WriteTimeout > 0:
				h.unbounded.Do(func() {
					h.cfg.logger.Error("workershttp: event streams end at the server's WriteTimeout: their ResponseWriter cannot clear its write deadline (a middleware's writer without an Unwrap method)", "method", r.Method, "path", r.URL.Path)
				})
			}
		}
		deadline()
		w.WriteHeader(http.StatusOK)
		rc.Flush()
		written()
	}
	if !canFlush(w) {
		// No event would reach the client before the stream ended. A
		// 500, unlike a stream that ends empty, is not reconnected to.
		h.fail(w, r, errCannotFlush)
		return
	}
	if h.streamsEnded() {
		// The server is shutting down: the stream would end before its
		// first event. It is refused as on a runtime shut down.
		WriteError(w, workers.ErrClosed)
		return
	}
	if first == nil && r.Method == http.MethodHead {
		// Nothing of the stream decides the answer: the route asked
		// already. A HEAD response has no body, and a stream would never
		// end, since nothing it writes fails.
		open()
		return
	}
	closeStream, err := h.openStream(auth)
	if err != nil {
		WriteError(w, err)
		return
	}
	defer closeStream()
	ctx, cancel := context.WithCancel(r.Context())
	if h.cfg.streams != nil {
		defer context.AfterFunc(h.cfg.streams, func() {
			cancel()
			endWrites()
		})()
	}
	ch := pump(ctx, seq(ctx))
	defer func() {
		cancel()
		for it := range ch {
			it.raise()
		}
	}()
	var it item
	send := false
	if first == nil {
		open()
	} else {
		var ok bool
		select {
		case it, ok = <-ch:
			it.raise()
		case <-ctx.Done():
		}
		if !ok || ctx.Err() != nil || h.streamsEnded() {
			// The stream ended before its first item (ch closes only
			// then): its client went, or the request's deadline passed
			// (a timeout in front of the handler), answered 504 as on
			// the other routes, or the stream context ended, answered as
			// at the start; never with an empty 200.
			switch err := r.Context().Err(); {
			case err == nil:
				WriteError(w, workers.ErrClosed)
			case errors.Is(err, context.DeadlineExceeded):
				h.fail(w, r, err)
			}
			return
		}
		if it.err != nil {
			h.fail(w, r, it.err)
			return
		}
		if !first(it) {
			return
		}
		open()
		send = true
	}
	if r.Method == http.MethodHead {
		return // answered as GET begins
	}
	var beat <-chan time.Time // nil, and never ready, without heartbeats
	if h.cfg.heartbeat > 0 {
		t := time.NewTicker(h.cfg.heartbeat)
		defer t.Stop()
		beat = t.C
	}
	// An event's id is its run's and its number in the run, which goes
	// on from the Last-Event-ID a client resumes with, so that a resumed
	// run's ids do not repeat those the client had. (A long Subscribe
	// stream forgets its counts past 4,096 runs, and starts them again.)
	seqs := map[string]int{}
	if run, n, ok := splitEventID(r.Header.Get("Last-Event-ID")); ok {
		seqs[run] = n
	}
	for {
		if send {
			var err error
			switch {
			case errors.Is(it.err, workers.ErrSkipped):
				// Changes were passed over: a view reads the list again.
				deadline()
				_, err = fmt.Fprint(w, "event: skipped\ndata: {}\n\n")
			case it.err != nil:
				// The client went, or the stream failed after it began,
				// which the client learns only by the stream's end. A
				// runtime shut down is a deploy's expected end.
				if !errors.Is(it.err, workers.ErrClosed) {
					h.logUnexpected(r, "workershttp: event stream failed", it.err)
				}
				return
			default:
				if len(seqs) > 4096 {
					clear(seqs) // bounded on a long Subscribe stream
				}
				seqs[it.snap.RunID]++
				id := it.snap.RunID + "/" + strconv.Itoa(seqs[it.snap.RunID])
				switch {
				case it.snap.Gone:
					id = it.snap.RunID + "/gone"
				case it.snap.Status.Terminal():
					id = it.snap.RunID + "/end"
				}
				deadline()
				err = writeEvent(w, id, it.snap)
			}
			if err != nil {
				return
			}
			if err := rc.Flush(); err != nil {
				return
			}
			written()
		}
		send = true
		select {
		case next, ok := <-ch:
			next.raise()
			if !ok {
				return
			}
			it = next
		case <-beat:
			send = false
			deadline()
			if _, err := fmt.Fprint(w, ": heartbeat\n\n"); err != nil {
				return
			}
			if err := rc.Flush(); err != nil {
				return
			}
			written()
		case <-ctx.Done():
			return
		}
	}
}

// errCannotFlush is the failure of an event stream whose ResponseWriter
// cannot flush.
var errCannotFlush = errors.New("workershttp: event stream not served: its ResponseWriter cannot flush (a middleware's writer that neither implements http.Flusher nor has an Unwrap method)")

// canFlush reports whether w can flush, as http.ResponseController finds
// a Flush method (in w, or in what it unwraps to), without flushing,
// which would send the response's headers.
func canFlush(w http.ResponseWriter) bool {
	for {
		switch t := w.(type) {
		case interface{ FlushError() error }, http.Flusher:
			return true
		case interface{ Unwrap() http.ResponseWriter }:
			w = t.Unwrap()
		default:
			return false
		}
	}
}

// streamsEnded reports whether the context given to WithStreamContext
// has ended.
func (h *handler) streamsEnded() bool {
	return h.cfg.streams != nil && h.cfg.streams.Err() != nil
}

// splitEventID splits an event's id, a run id, "/" and a number, into
// the two.
func splitEventID(id string) (run string, n int, ok bool) {
	i := strings.LastIndexByte(id, '/')
	if i <= 0 {
		return "", 0, false
	}
	n, err := strconv.Atoi(id[i+1:])
	if err != nil || n <= 0 || n > 1<<30 {
		return "", 0, false
	}
	return id[:i], n, true
}

// gone is the data of a "gone" event: the task a stream showed and
// can no longer follow (see workers.Snapshot.Gone).
type gone struct {
	ID    string `json:"id"`
	RunID string `json:"run_id"`
	Queue string `json:"queue,omitempty"`
}

func writeEvent(w http.ResponseWriter, id string, s workers.Snapshot) error {
	var v any = FromSnapshot(s)
	event := "task"
	if s.Gone {
		v, event = gone{ID: s.ID, RunID: s.RunID, Queue: s.Queue}, "gone"
	}
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "id: %s\nevent: %s\ndata: %s\n\n", id, event, data)
	return err
}

// taskEvents streams one task until its terminal snapshot.
func (h *handler) taskEvents(w http.ResponseWriter, r *http.Request, auth workers.TaskAuthority) {
	if h.refuseBody(w, r) {
		return
	}
	last := r.Header.Get("Last-Event-ID")
	id := r.PathValue("id")
	watch := func(ctx context.Context) iter.Seq2[workers.Snapshot, error] { return h.rt.Watch(ctx, id, auth) }
	h.stream(w, r, auth, watch, func(it item) bool {
		// A client that already has this run's end is told to stop.
		if last != "" && it.snap.Status.Terminal() && last == it.snap.RunID+"/end" {
			w.WriteHeader(http.StatusNoContent)
			return false
		}
		return true
	})
}

// allEvents streams every task the caller may see, narrowed by ?status=.
func (h *handler) allEvents(w http.ResponseWriter, r *http.Request, auth workers.TaskAuthority) {
	if h.refuseBody(w, r) {
		return
	}
	statuses, err := parseStatuses(r.URL.Query()["status"])
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var opts []workers.ListOption
	if len(statuses) > 0 {
		opts = append(opts, workers.WithStatus(statuses...))
	}
	subscribe := func(ctx context.Context) iter.Seq2[workers.Snapshot, error] {
		return h.rt.Subscribe(ctx, auth, opts...)
	}
	if h.streamsFull(auth) {
		// Refused before the reads below, and for HEAD as for GET.
		WriteError(w, ErrTooManyStreams)
		return
	}
	// The stream opens before its first event, which may be long in
	// coming: what would refuse it (a runtime shut down or misconfigured,
	// an identity it refuses, a store that fails) is asked first, so that
	// it is answered with its status rather than with an empty stream a
	// client reconnects to.
	if err := h.rt.Ready(r.Context()); err != nil {
		h.fail(w, r, err)
		return
	}
	if _, err := h.rt.List(r.Context(), auth, workers.WithStatus(workers.StatusPending, workers.StatusRunning), workers.WithLimit(1)); err != nil {
		h.fail(w, r, err)
		return
	}
	h.stream(w, r, auth, subscribe, nil)
}

// refuseBody answers 400 to an event stream's request that has a body.
// net/http watches an HTTP/1 connection for its client's going only once
// the request's body is read to its end, which it does for the handler
// only up to 256 KB: a stream that never reads its request's body would
// never learn that its client went, and hold its goroutine,
// subscription and place under WithStreamLimit until a write fails.
func (h *handler) refuseBody(w http.ResponseWriter, r *http.Request) bool {
	if r.ContentLength == 0 {
		return false
	}
	h.fail(w, r, fmt.Errorf("%w: an event stream's request has no body", ErrBadRequest))
	return true
}
