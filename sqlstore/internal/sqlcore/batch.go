package sqlcore

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/taskgate/workers"
)

// A combiner gathers concurrent writes of one kind into batches, so that
// one statement and one commit carry the rows of many callers (group
// commit). A write that finds fewer than limit batches in flight leaves at
// once, with whatever else is waiting: a lone write pays no delay and no
// tick. Writes that arrive while limit batches are in flight queue, and
// the first batch to finish takes them all (up to max) as the next. Each
// write keeps its own condition in the statement (the store's fences are
// per row) and its caller is told its own outcome.
//
// A batch holds at most one write per key, and no batch takes a key
// another batch in flight holds, so that no statement touches a row twice
// and no two race for it; a second write of a key waits for a later
// batch, behind the first, in the order they came.
//
// A batch that stays in flight longer than stall (one stuck on a row lock
// that a long transaction elsewhere holds, say) would hold back every
// write queued behind it. So each stall that it stays in flight, one more
// batch may start with the queued writes, up to spare more than limit at
// once; a batch that finds more than limit in flight when it ends leaves
// the queue to the others.
//
// A batch runs on a goroutine of its own, under a context that ends when
// every caller in it has stopped waiting, so a batch never outlives the
// calls it serves, and a caller whose context ends returns at once: its
// write may still land, as any write cut off in flight may. A caller
// whose context ends while its write still queues is dropped from the
// queue and never written. exec may answer a call before the batch ends
// (call.finish), or hand it to a goroutine of its own that answers it
// after (call.detached): its caller then has its outcome, counts as no
// longer waiting, and its key is free for the next write of it, which
// the batch in flight takes next, or, with none in flight, a batch that
// the freed key starts.
type combiner[T any] struct {
	limit, max int
	spare      int
	// exec writes the batch and sets each call's ok and err. It must
	// not keep the calls after it returns.
	exec func(ctx context.Context, batch []*call[T])

	mu      sync.Mutex
	queue   []*call[T]          // guarded by mu, in arrival order
	running int                 // guarded by mu: batches in flight
	busy    map[string]struct{} // guarded by mu: the keys of the batches in flight
	stall   time.Duration       // guarded by mu; 0: never start a spare batch
}

// call is one caller's write in a combiner.
type call[T any] struct {
	ctx  context.Context
	key  string
	in   T
	ok   bool  // set by exec
	err  error // set by exec
	done chan struct{}
	gone atomic.Bool // the caller stopped waiting

	// finish answers the call, once ok and err are set, and frees its
	// key; set by run for exec, which may call it before the batch ends,
	// and called by run for every call exec did not answer and did not
	// detach.
	finish func()
	// detached is set by exec when it hands the call to a goroutine of
	// its own, which finishes it, so that the batch can end before it.
	detached bool
}

// do queues in for writing and waits for its outcome, or for ctx.
func (c *combiner[T]) do(ctx context.Context, key string, in T) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	w := &call[T]{ctx: ctx, key: key, in: in, done: make(chan struct{})}
	c.mu.Lock()
	c.queue = append(c.queue, w)
	// Nothing starts when the key is in a batch in flight, which then
	// takes the write as its next.
	batch := c.startLocked()
	c.mu.Unlock()
	if len(batch) > 0 {
		go c.loop(batch)
	}
	select {
	case <-w.done:
	case <-ctx.Done():
		w.gone.Store(true)
		select {
		case <-w.done: // finished all the same: its outcome is known
		default:
			return false, ctx.Err()
		}
	}
	if w.err != nil && errors.Is(w.err, context.Canceled) && ctx.Err() != nil {
		// The batch's context ended because its callers left, this one
		// among them, and that is all its error says: the caller's own
		// context's error says why (context.DeadlineExceeded, say).
		return false, ctx.Err()
	}
	return w.ok, w.err
}

// startLocked takes the next batch, counted in flight, if fewer than
// limit are; the caller runs it with loop. c.mu is held.
func (c *combiner[T]) startLocked() []*call[T] {
	if c.running >= c.limit {
		return nil
	}
	batch := c.take()
	if len(batch) > 0 {
		c.running++
	}
	return batch
}

// take removes the next batch from the queue: up to max calls, one per
// key and none of a key in flight, in arrival order, leaving out the
// calls nobody waits for. It marks the batch's keys in flight. c.mu is
// held.
func (c *combiner[T]) take() []*call[T] {
	var batch, rest []*call[T]
	if c.busy == nil {
		c.busy = make(map[string]struct{})
	}
	for i, w := range c.queue {
		if len(batch) == c.max {
			rest = append(rest, c.queue[i:]...)
			break
		}
		// A caller whose context ended may not have woken yet to say it
		// left: its write is dropped all the same.
		if w.gone.Load() || w.ctx.Err() != nil {
			w.err = w.ctx.Err()
			close(w.done)
			continue
		}
		if _, dup := c.busy[w.key]; dup {
			rest = append(rest, w)
			continue
		}
		c.busy[w.key] = struct{}{}
		batch = append(batch, w)
	}
	clear(c.queue)
	c.queue = append(c.queue[:0], rest...)
	return batch
}

// loop writes batch, then every batch queued meanwhile, and returns when
// the queue is empty, or after a batch that ended with more than limit in
// flight (the others go on with the queue).
func (c *combiner[T]) loop(batch []*call[T]) {
	for len(batch) > 0 {
		var stalled *time.Timer // guarded by c.mu, as is ended
		ended := false
		c.mu.Lock()
		if c.stall > 0 {
			stalled = time.AfterFunc(c.stall, func() { c.stalled(&stalled, &ended) })
		}
		c.mu.Unlock()
		c.run(batch)
		c.mu.Lock()
		if stalled != nil {
			ended = true
			stalled.Stop()
		}
		batch = nil
		if c.running <= c.limit {
			batch = c.take()
		}
		if len(batch) == 0 {
			c.running--
		}
		c.mu.Unlock()
	}
}

// stalled runs each c.stall that a batch stays in flight: it starts a
// spare batch with the writes queued meanwhile, if there is room for one,
// and looks again after another stall. Once the batch has ended (ended,
// set under c.mu) it does nothing.
func (c *combiner[T]) stalled(t **time.Timer, ended *bool) {
	c.mu.Lock()
	if *ended {
		c.mu.Unlock()
		return
	}
	var batch []*call[T]
	if c.running < c.limit+c.spare {
		batch = c.take()
	}
	if len(batch) > 0 {
		c.running++
	}
	if c.stall > 0 {
		(*t).Reset(c.stall)
	}
	c.mu.Unlock()
	if len(batch) > 0 {
		go c.loop(batch)
	}
}

// run writes one batch under a context that keeps the first caller's
// values and ends when every caller has stopped waiting (or has been
// answered), then answers the calls exec did not.
func (c *combiner[T]) run(batch []*call[T]) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(batch[0].ctx))
	var waiting atomic.Int32
	waiting.Store(int32(len(batch)))
	leave := func() {
		if waiting.Add(-1) == 0 {
			cancel()
		}
	}
	for _, w := range batch {
		stop := context.AfterFunc(w.ctx, leave)
		var once sync.Once
		w.finish = func() {
			once.Do(func() {
				c.mu.Lock()
				delete(c.busy, w.key)
				// With no batch in flight to take what queued behind the
				// key (a detached call outlives its batch), one starts.
				next := c.startLocked()
				c.mu.Unlock()
				if len(next) > 0 {
					go c.loop(next)
				}
				if stop() { // the caller is still waiting: it leaves now
					leave()
				}
				close(w.done)
			})
		}
	}
	c.exec(ctx, batch)
	for _, w := range batch {
		if !w.detached {
			w.finish()
		}
	}
	cancel()
}

// Group commit's sizes: batches in flight, and the most rows one
// statement carries. One batch in flight measured best: commits that send
// notices are serialized by PostgreSQL anyway, so a second batch in
// flight only splits the rows that would have gone together
// (bench/BENCHMARKS.md).
//
// A batch in flight for batchStall lets another start with the writes
// queued behind it, up to batchSpare more: a statement takes 1 to 2 ms
// here, so only a batch that waits on a lock, or on a database that
// stalls, takes that long.
//
// Inserts that go apart (Dialect.InsertMany) have the same sizes: two of
// their batches in flight measured no better than one.
const (
	batchLimit = 1
	batchMax   = 256
	batchStall = 20 * time.Millisecond
	batchSpare = 3
)

// groupWrite is one InsertTask or one TransitionTask, checked, for group
// commit: exactly one of its fields is set.
type groupWrite struct {
	insert     *workers.Record
	transition *transitionRow
}

// transitionRow is one TransitionTask of a checked state.
type transitionRow struct {
	id, runID string
	from      []workers.Status
	next      workers.State
}

// stateColumns holds the State columns of a batch's rows, one array per
// column, as Dialect.WriteMany takes them; a NULL is a nil pointer.
type stateColumns struct {
	status, errText, cause, cancelledBy, cancelReason, stack []string
	progress, attempt                                        []int64
	result                                                   []*string
	started, completed                                       []*time.Time
}

// makeStateColumns returns columns with room for n rows, so that adding
// them allocates nothing more.
func makeStateColumns(n int) stateColumns {
	return stateColumns{
		status: room[string](n), errText: room[string](n), cause: room[string](n),
		cancelledBy: room[string](n), cancelReason: room[string](n), stack: room[string](n),
		progress: room[int64](n), attempt: room[int64](n),
		result:  room[*string](n),
		started: room[*time.Time](n), completed: room[*time.Time](n),
	}
}

// joinStatuses joins statuses, each known (see knownStatuses), with
// commas, as a batch row's fence; the common fence of one status costs
// no allocation.
func joinStatuses(ss []workers.Status) string {
	if len(ss) == 1 {
		return string(ss[0])
	}
	from := make([]string, len(ss))
	for i, st := range ss {
		from[i] = string(st)
	}
	return strings.Join(from, ",")
}

// room returns an empty slice with room for n elements, or nil for none:
// a column without rows goes as NULL, as it did before it was sized.
func room[T any](n int) []T {
	if n == 0 {
		return nil
	}
	return make([]T, 0, n)
}

// add appends st's columns; times holds the timestamps the rows point
// to (see timeOrNull).
func (c *stateColumns) add(st *workers.State, times *[]time.Time) {
	var result *string
	if len(st.Result) > 0 {
		r := string(st.Result)
		result = &r
	}
	c.status = append(c.status, string(st.Status))
	c.progress = append(c.progress, int64(st.Progress))
	c.attempt = append(c.attempt, int64(st.Attempt))
	c.result = append(c.result, result)
	c.errText = append(c.errText, st.Error)
	c.started = append(c.started, timeOrNull(st.StartedAt, times))
	c.completed = append(c.completed, timeOrNull(st.CompletedAt, times))
	c.cause = append(c.cause, string(st.Cause))
	c.cancelledBy = append(c.cancelledBy, st.CancelledBy)
	c.cancelReason = append(c.cancelReason, st.CancelReason)
	c.stack = append(c.stack, st.Stack)
}

// args returns the columns in the order of stateArgs after the id.
func (c *stateColumns) args() []any {
	return []any{c.status, c.progress, c.attempt, c.result, c.errText, c.started, c.completed,
		c.cause, c.cancelledBy, c.cancelReason, c.stack}
}

// timeOrNull is a batch's timestamptz element: nil for the zero time,
// else a pointer to t in UTC, appended to times, the batch's one array of
// them. Should times grow, the elements added before keep pointing into
// its old array, which holds their values still.
func timeOrNull(t time.Time, times *[]time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	*times = append(*times, t.UTC())
	return &(*times)[len(*times)-1]
}

// writeMany is the combiner's exec: the batch, a lone write too, goes
// in one Dialect.WriteMany statement (see writeGroup), whose wait for a
// row lock is bounded, so that a row held elsewhere holds back its own
// write alone, made on a goroutine of its own, and never a batch in
// flight, which would hold back every other write of the store.
func (s *Store) writeMany(ctx context.Context, batch []*call[groupWrite]) {
	s.writeGroup(ctx, batch, s.q.writeMany, groupWriteArgs(batch))
}

// insertMany is the exec of the inserts' combiner: the batch, a lone
// insert too, goes in one Dialect.InsertMany statement (see writeGroup),
// which sends no notice, and the rows it inserted are announced once it
// has committed. An insert made alone, after a batch that failed so,
// notifies as any other write.
func (s *Store) insertMany(ctx context.Context, batch []*call[groupWrite]) {
	s.announce.add(announced(batch, s.writeGroup(ctx, batch, s.q.insertMany, groupWriteArgs(batch)[:insertArgs])))
}

// announced returns the ids of the rows an InsertMany statement that
// ended so may have inserted: those it inserted, or, after a failure
// that leaves its commit unknown, every one (the notice of a row that is
// not there is not sent, and one of a row another write inserted is a
// hint like any other).
func announced(batch []*call[groupWrite], end groupEnd) []string {
	var ids []string
	for _, w := range batch {
		if end == groupUnsure || end == groupWrote && w.ok {
			ids = append(ids, w.key)
		}
	}
	return ids
}

// groupEnd is how a group statement ended.
type groupEnd int

const (
	groupWrote  groupEnd = iota // it wrote the batch, each row on its own condition
	groupNone                   // nothing of it landed: each write was made alone, or is to be
	groupUnsure                 // it failed after it may have committed
)

// writeGroup writes batch in the group statement query, with args, and
// sets each call's outcome: an insert it did not make found its id taken
// (ErrConflict), and a transition it did not make was fenced off (ok
// false; TransitionTask then reads why).
//
// Should a row wait too long for a lock another transaction holds
// (Dialect.LockBusy), or the database refuse the statement, nothing
// landed, and each write goes on alone, on a goroutine of its own under
// its own caller's context, each caller answered as its own ends and its
// key freed then (see call.detached): the batch ends at once, so a held
// row holds back only its own caller and the writes of its own task
// behind it, and a row the database refuses fails only its own call. A
// write of a batch of several is tried first in the group statement on
// its own, which gives up on a held row as the batch did: one whose row
// is free lands so. These tries hold a connection each, 100 ms at most,
// no more than Config.LoneWrites and one more at a time (see tryAlone),
// so that a large batch that met held rows does not take every
// connection of the pool for its tries: a write whose row is free may
// wait for the tries ahead of it, and never for a held row's write made
// alone.
// The others are made as the caller would make them alone (see
// writeOne), each holding a connection while it waits for its row, no
// more than Config.LoneWrites at a time, so that rows held elsewhere
// cannot take every connection.
// Any other failure (a lost connection, after which the
// statement may or may not have committed) is every call's error, as it
// would be for a lone write: the caller learns that the outcome is
// unknown, not a guess.
func (s *Store) writeGroup(ctx context.Context, batch []*call[groupWrite], query string, args []any) groupEnd {
	end, err := s.tryGroup(ctx, batch, query, args)
	if end != groupNone {
		return end
	}
	// Tried alone already, or refused by the database: made alone, to
	// find the row it refuses.
	alone := len(batch) == 1 || s.d.LockBusy == nil || !s.d.LockBusy(err)
	for _, w := range batch {
		w.detached = true
		go func() {
			defer w.finish()
			if !alone {
				free, ok := s.tryAlone(w.ctx)
				if !ok {
					w.err = w.ctx.Err()
					return
				}
				one := []*call[groupWrite]{w}
				end, _ := s.tryGroup(w.ctx, one, query, groupWriteArgs(one)[:len(args)])
				free()
				if end != groupNone {
					if query == s.q.insertMany {
						s.announce.add(announced(one, end)) // an InsertMany statement sends no notice
					}
					return
				}
			}
			if s.lone != nil {
				select {
				case s.lone <- struct{}{}:
					defer func() { <-s.lone }()
				case <-w.ctx.Done():
					w.err = w.ctx.Err()
					return
				}
			}
			s.writeOne(w.ctx, w)
		}()
	}
	return groupNone
}

// tryAlone takes a slot for a write's try on its own in the group
// statement (see writeGroup), or returns false when ctx ends first, and
// returns the slot's release: a slot of Config.LoneWrites, or the one
// slot more kept for these tries. Each try waits for a held row 100 ms
// at most, so a write whose row is free waits for a slot only behind
// other tries, each of which ends so, and never behind the writes of
// held rows made alone, which may hold every slot of LoneWrites for as
// long as their rows are held.
func (s *Store) tryAlone(ctx context.Context) (func(), bool) {
	if s.lone == nil {
		return func() {}, true
	}
	select {
	case s.lone <- struct{}{}:
		return func() { <-s.lone }, true
	case s.tries <- struct{}{}:
		return func() { <-s.tries }, true
	case <-ctx.Done():
		return nil, false
	}
}

// tryGroup runs the group statement query, with args, for batch. It sets
// each call's outcome and returns groupWrote or groupUnsure, or returns
// groupNone, and the statement's error, when nothing of it landed: a row
// waited too long for a lock (Dialect.LockBusy), or the database refused
// the statement.
func (s *Store) tryGroup(ctx context.Context, batch []*call[groupWrite], query string, args []any) (groupEnd, error) {
	written, err := s.writeBatch(ctx, query, args)
	if err == nil {
		for _, w := range batch {
			_, w.ok = written[w.key]
			if !w.ok && w.in.insert != nil {
				w.err = workers.ErrConflict
			}
		}
		return groupWrote, nil
	}
	if s.d.LockBusy != nil && s.d.LockBusy(err) || s.refused(ctx, err) {
		return groupNone, err
	}
	for _, w := range batch {
		w.err = err
	}
	return groupUnsure, err
}

// writeOne makes the write w in a statement of its own, and sets its
// outcome.
func (s *Store) writeOne(ctx context.Context, w *call[groupWrite]) {
	if w.in.insert != nil {
		w.err = s.insertOne(ctx, *w.in.insert)
		w.ok = w.err == nil
	} else {
		w.ok, w.err = s.transitionOne(ctx, *w.in.transition)
	}
}

// writeBatch runs a group statement with args and returns the ids it
// inserted or updated.
func (s *Store) writeBatch(ctx context.Context, query string, args []any) (map[string]struct{}, error) {
	rows, err := s.w.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, s.wrap(ctx, "write tasks", err)
	}
	defer rows.Close()
	written := make(map[string]struct{})
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, s.wrap(ctx, "write tasks", err)
		}
		written[id] = struct{}{}
	}
	if err := rows.Err(); err != nil {
		return nil, s.wrap(ctx, "write tasks", err)
	}
	return written, nil
}

// insertArgs is how many of WriteMany's arguments are the inserts',
// InsertMany's.
const insertArgs = 18

// sendNotices is the announcer's send: one Dialect.Announce statement,
// which returns the ids of the rows it found held and skipped. Its
// errors go back to the announcer unwrapped, so a lost connection is
// reported here (see lost), as wrap reports every other statement's.
func (s *Store) sendNotices(ctx context.Context, ids []string) (_ []string, err error) {
	defer func() {
		if err != nil {
			s.lost(err)
		}
	}()
	rows, err := s.w.QueryContext(ctx, s.q.announce, ids)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var held []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		held = append(held, id)
	}
	return held, rows.Err()
}

// groupWriteArgs returns Dialect.WriteMany's arguments for batch, in the
// keys' order: rows are locked in the order of the statement's arrays,
// so two processes' batches over the same rows never wait for each other
// in a cycle, which the database would break only after its deadlock
// check (a second, by default).
func groupWriteArgs(batch []*call[groupWrite]) []any {
	slices.SortFunc(batch, func(a, b *call[groupWrite]) int { return strings.Compare(a.key, b.key) })
	nIns, nWatchers := 0, 0
	for _, w := range batch {
		if rec := w.in.insert; rec != nil {
			nIns++
			nWatchers += len(rec.Watchers)
		}
	}
	nTr := len(batch) - nIns
	var (
		inserted, updated          = makeStateColumns(nIns), makeStateColumns(nTr)
		ids, runs, queues          = room[string](nIns), room[string](nIns), room[string](nIns)
		owners                     = room[*string](nIns)
		created                    = room[*time.Time](nIns)
		watcherTasks, watcherUsers = room[string](nWatchers), room[string](nWatchers)
		trIDs, trRuns, trFroms     = room[string](nTr), room[string](nTr), room[string](nTr)
		times                      = room[time.Time](3*nIns + 2*nTr) // created, started, completed
	)
	for _, w := range batch {
		if rec := w.in.insert; rec != nil {
			ids = append(ids, rec.ID)
			inserted.add(&rec.State, &times)
			runs = append(runs, rec.RunID)
			queues = append(queues, rec.Queue)
			created = append(created, timeOrNull(rec.CreatedAt, &times))
			var owner *string
			if o, ok := workers.OwnerOf(rec.ID); ok {
				id := o.ID()
				owner = &id
			}
			owners = append(owners, owner)
			for _, u := range rec.Watchers {
				watcherTasks = append(watcherTasks, rec.ID)
				watcherUsers = append(watcherUsers, u)
			}
			continue
		}
		tr := w.in.transition
		trIDs = append(trIDs, tr.id)
		trRuns = append(trRuns, tr.runID)
		trFroms = append(trFroms, joinStatuses(tr.from))
		updated.add(&tr.next, &times)
	}
	args := append([]any{ids}, inserted.args()...)
	args = append(args, runs, queues, created, owners, watcherTasks, watcherUsers, trIDs, trRuns, trFroms)
	return append(args, updated.args()...)
}

// refused reports whether a batch statement's err was the database's
// answer that the statement failed, so that none of it landed, and ctx
// still allows its writes to be made alone.
func (s *Store) refused(ctx context.Context, err error) bool {
	return ctx.Err() == nil && s.d.Refused != nil && s.d.Refused(err)
}

// Queued reports how many writes of s wait behind a batch in flight, for
// tests that need a batch to gather known writes.
func Queued(s *Store) int {
	n := 0
	for _, c := range []*combiner[groupWrite]{s.writes, s.inserts} {
		if c != nil {
			n += c.queued()
		}
	}
	return n
}

// Announced reports how many ids of inserted rows s has queued to
// announce since it was made, for tests that need a notice queued before
// they go on.
func Announced(s *Store) int {
	if s.announce == nil {
		return 0
	}
	s.announce.mu.Lock()
	defer s.announce.mu.Unlock()
	return s.announce.total
}

// AnnounceFailing reports whether the last statement of s's announcer
// failed, so that s's inserts go as its other writes do.
func AnnounceFailing(s *Store) bool { return s.announce != nil && s.announce.failing.Load() }

// SetStall sets how long a batch of s stays in flight before another may
// start beside it (0: never), for tests that need writes to gather
// behind a batch held on purpose.
func SetStall(s *Store, d time.Duration) {
	for _, c := range []*combiner[groupWrite]{s.writes, s.inserts} {
		if c != nil {
			c.mu.Lock()
			c.stall = d
			c.mu.Unlock()
		}
	}
}

func (c *combiner[T]) queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue)
}
