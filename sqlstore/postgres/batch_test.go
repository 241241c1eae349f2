package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/internal/sqlcore"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// gather holds a store's writes of one kind behind a batch in flight:
// block starts the write that goes first and returns once the database
// holds it, so every write made after it queues; release lets it finish,
// and the queued writes go together as one batch.
type gather struct {
	t       *testing.T
	s       *postgres.Store
	tx      pgx.Tx
	first   chan error
	pending int
}

// blockBehind opens a transaction with lock (a statement that takes a
// row lock the first write will need), then starts first. It turns off
// the store's stall escape; the database's own bound on a batch's lock
// wait (100 ms, migration 0007) stays, so that a test which must have
// its writes gather behind the held batch however long it takes to
// queue them on a loaded machine calls unboundLockWaits first.
func blockBehind(t *testing.T, sc scratch, s *postgres.Store, lock string, first func() error) *gather {
	t.Helper()
	sqlcore.SetStall(postgres.Core(s), 0)
	tx, err := sc.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(t.Context(), lock); err != nil {
		t.Fatal(err)
	}
	g := &gather{t: t, s: s, tx: tx, first: make(chan error, 1)}
	go func() { g.first <- first() }()
	// The first write is in flight once its statement waits on the lock.
	waitFor(t, func() bool {
		var n int
		err := sc.pool.QueryRow(t.Context(),
			`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`, sc.schema).Scan(&n)
		return err == nil && n > 0
	})
	return g
}

// gateOn is blockBehind whose first write starts the PENDING record id
// of run runID, held by a lock on its row.
func gateOn(t *testing.T, sc scratch, s *postgres.Store, id, runID string) *gather {
	t.Helper()
	return blockBehind(t, sc, s, `SELECT 1 FROM "`+sc.schema+`".workers_tasks WHERE id = '`+id+`' FOR UPDATE`, func() error {
		_, err := s.TransitionTask(t.Context(), id, runID, []workers.Status{workers.StatusPending},
			workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: time.Now()})
		return err
	})
}

// queue starts fn, which makes one write, and returns once it queues.
func (g *gather) queue(wg *sync.WaitGroup, fn func()) {
	g.pending++
	wg.Go(fn)
	waitFor(g.t, func() bool { return sqlcore.Queued(postgres.Core(g.s)) >= g.pending })
}

// release ends the blocking transaction and returns the first write's
// error.
func (g *gather) release() error {
	if err := g.tx.Rollback(g.t.Context()); err != nil {
		g.t.Fatal(err)
	}
	return <-g.first
}

// insertPending inserts a PENDING record of run runID, watched by u,
// for each of ids.
func insertPending(t *testing.T, s *postgres.Store, runID string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		rec := workers.Record{ID: id, RunID: runID, Watchers: []string{"u"}, CreatedAt: time.Now(), State: workers.State{Status: workers.StatusPending}}
		if err := s.InsertTask(t.Context(), rec); err != nil {
			t.Fatal(err)
		}
	}
}

// holdRow locks the row of task id in a transaction of its own, on a
// connection of its own (the store's pool keeps its connections), as an
// administrator's open transaction might, and returns the transaction,
// rolled back in t's cleanup if the test has not ended it.
func holdRow(t *testing.T, sc scratch, id string) pgx.Tx {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), testDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	tx, err := conn.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(t.Context(), `SELECT 1 FROM "`+sc.schema+`".workers_tasks WHERE id = $1 FOR UPDATE`, id); err != nil {
		t.Fatal(err)
	}
	return tx
}

// refusal is the text that refuseInTheDatabase has the database refuse,
// in a task's error or its queue.
const refusal = "refused-by-the-database"

// refuseInTheDatabase has the tasks table of sc's schema refuse, with a
// data exception (class 22, as a value out of a column's range), a row
// whose error or queue is refusal, as a constraint of the application's
// might: the store sends what it checked, and the database refuses it.
func refuseInTheDatabase(t *testing.T, sc scratch) {
	t.Helper()
	for _, q := range []string{
		`CREATE FUNCTION "` + sc.schema + `".refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.error = '` + refusal + `' OR NEW.queue = '` + refusal + `' THEN
		RAISE EXCEPTION 'refused by the test' USING ERRCODE = '22023';
	END IF;
	RETURN NEW;
END $$`,
		`CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON "` + sc.schema + `".workers_tasks
	FOR EACH ROW EXECUTE FUNCTION "` + sc.schema + `".refuse()`,
	} {
		if _, err := sc.pool.Exec(t.Context(), q); err != nil {
			t.Fatal(err)
		}
	}
}

// waitFor polls cond until it holds, failing t after 10 seconds.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10s")
		}
		time.Sleep(time.Millisecond) // polling with a deadline
	}
}

// insertManyArgs are the argument types of migration 0009's function.
const insertManyArgs = `text[], text[], bigint[], bigint[], text[], text[], timestamptz[], timestamptz[],
	text[], text[], text[], text[], text[], text[], timestamptz[], text[], text[], text[]`

// TestGroupCommitTransitions: transitions that queue behind one in flight
// go as one UPDATE, and each caller gets its own answer: updated, fenced
// off by run id or status, missing, or refused by the database (only the
// refused row fails), with a second transition of one task applied after
// the first.
func TestGroupCommitTransitions(t *testing.T) {
	sc := newScratchT(t)
	s := sc.store(t)
	refuseInTheDatabase(t, sc)
	ctx := t.Context()
	pending := workers.State{Status: workers.StatusPending}
	for i := range 6 {
		rec := workers.Record{ID: fmt.Sprint("u::t", i), RunID: "run-1", Watchers: []string{"u"}, CreatedAt: time.Now(), State: pending}
		if err := s.InsertTask(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	from := []workers.Status{workers.StatusPending}
	running := workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: time.Now()}
	unboundLockWaits(t, sc) // the batch in flight waits for the test, however long it takes
	g := blockBehind(t, sc, s, `SELECT 1 FROM "`+sc.schema+`".workers_tasks WHERE id = 'u::t0' FOR UPDATE`, func() error {
		_, err := s.TransitionTask(ctx, "u::t0", "run-1", from, running)
		return err
	})

	type answer struct {
		ok  bool
		err error
	}
	var mu sync.Mutex
	answers := map[string]answer{}
	var wg sync.WaitGroup
	transition := func(name, id, run string, from []workers.Status, next workers.State) {
		g.queue(&wg, func() {
			ok, err := s.TransitionTask(ctx, id, run, from, next)
			mu.Lock()
			answers[name] = answer{ok, err}
			mu.Unlock()
		})
	}
	done := workers.State{Status: workers.StatusCompleted, Attempt: 1, Progress: 100, StartedAt: time.Now(), CompletedAt: time.Now(), Result: []byte(`{"n":1}`)}
	transition("start t1", "u::t1", "run-1", from, running)
	transition("end t1", "u::t1", "run-1", []workers.Status{workers.StatusRunning}, done) // the next batch, after the start
	transition("stale run t2", "u::t2", "run-0", from, running)
	transition("wrong status t3", "u::t3", "run-1", []workers.Status{workers.StatusRunning}, done)
	transition("missing", "u::none", "run-1", from, running)
	refused := workers.State{Status: workers.StatusFailed, Attempt: 1, StartedAt: time.Now(), CompletedAt: time.Now(), Error: refusal}
	transition("refused t4", "u::t4", "run-1", from, refused)
	transition("start t5", "u::t5", "run-1", from, running)
	if err := g.release(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()

	for name, want := range map[string]answer{
		"start t1": {ok: true}, "end t1": {ok: true}, "stale run t2": {}, "wrong status t3": {},
		"start t5": {ok: true},
	} {
		if got := answers[name]; got != want {
			t.Errorf("%s: TransitionTask = %v, %v; want %v, %v", name, got.ok, got.err, want.ok, want.err)
		}
	}
	if a := answers["missing"]; a.ok || !errors.Is(a.err, workers.ErrNotFound) {
		t.Errorf("missing: TransitionTask = %v, %v; want ErrNotFound", a.ok, a.err)
	}
	if a := answers["refused t4"]; a.ok || !errors.Is(a.err, workers.ErrInvalidData) {
		t.Errorf("refused t4: TransitionTask = %v, %v; want ErrInvalidData", a.ok, a.err)
	}
	for id, want := range map[string]workers.Status{
		"u::t0": workers.StatusRunning, "u::t1": workers.StatusCompleted, "u::t2": workers.StatusPending,
		"u::t3": workers.StatusPending, "u::t4": workers.StatusPending, "u::t5": workers.StatusRunning,
	} {
		rec, err := s.GetTask(ctx, id)
		if err != nil || rec.Status != want {
			t.Errorf("%s: %s, %v; want %s", id, rec.Status, err, want)
		}
		if id == "u::t1" && (string(rec.Result) != `{"n":1}` || rec.Progress != 100 || rec.CompletedAt.IsZero()) {
			t.Errorf("u::t1's ending: %+v", rec.State)
		}
	}
}

// TestGroupCommitUnknownFromStatusMatchesNothing: in a batched
// transition, as in a lone one, only the known statuses of from fence
// the write; one that is not known (one holding a comma, which the
// batch's fence joins statuses with, among them) matches nothing, and is
// not split into the statuses it names.
func TestGroupCommitUnknownFromStatusMatchesNothing(t *testing.T) {
	sc := newScratchT(t)
	s := sc.store(t)
	ctx := t.Context()
	insertPending(t, s, "run-1", "u::gate", "u::pending")
	now := time.Now()
	for _, rec := range []workers.Record{
		{ID: "u::failed", RunID: "run-1", CreatedAt: now, State: workers.State{Status: workers.StatusFailed, CompletedAt: now}},
		{ID: "u::running", RunID: "run-1", CreatedAt: now, State: workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: now}},
	} {
		if err := s.InsertTask(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	pending := workers.State{Status: workers.StatusPending}
	cases := []struct {
		id     string
		from   []workers.Status
		wantOK bool
		want   workers.Status // the record's status afterwards
	}{
		{"u::failed", []workers.Status{"completed,failed", workers.StatusPending}, false, workers.StatusFailed},
		{"u::running", []workers.Status{"bogus", "pending,running", workers.StatusCompleted}, false, workers.StatusRunning},
		{"u::pending", []workers.Status{"running,failed", workers.StatusPending}, true, workers.StatusPending},
	}
	unboundLockWaits(t, sc) // the batch in flight waits for the test, however long it takes
	g := gateOn(t, sc, s, "u::gate", "run-1")
	var wg sync.WaitGroup
	oks, errs := make([]bool, len(cases)), make([]error, len(cases))
	for i, c := range cases {
		g.queue(&wg, func() { oks[i], errs[i] = s.TransitionTask(ctx, c.id, "run-1", c.from, pending) })
	}
	if err := g.release(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, c := range cases {
		if oks[i] != c.wantOK || errs[i] != nil {
			t.Errorf("TransitionTask(%s, from %q) = %v, %v; want %v, nil", c.id, c.from, oks[i], errs[i], c.wantOK)
		}
		if rec, err := s.GetTask(ctx, c.id); err != nil || rec.Status != c.want {
			t.Errorf("%s is now %s (%v), want %s", c.id, rec.Status, err, c.want)
		}
	}
}

// TestGroupCommitInserts: inserts that queue behind one in flight go as
// one statement; a taken id, or the same id twice, is ErrConflict for
// that call alone, a record the database refuses fails alone, and every
// record keeps its watchers in order.
func TestGroupCommitInserts(t *testing.T) {
	sc := newScratchT(t)
	s := sc.store(t)
	refuseInTheDatabase(t, sc)
	ctx := t.Context()
	rec := func(id string, watchers ...string) workers.Record {
		return workers.Record{ID: id, RunID: "run-1", Watchers: watchers, CreatedAt: time.Now(),
			State: workers.State{Status: workers.StatusPending}}
	}
	if err := s.InsertTask(ctx, rec("taken", "x")); err != nil {
		t.Fatal(err)
	}
	// The first insert waits on the row an open transaction inserted,
	// for as long as the test holds it: the function's own bound on a
	// lock wait (100 ms) would let the batch go alone.
	if _, err := sc.pool.Exec(ctx, `ALTER FUNCTION "`+sc.schema+`".workers_insert_many(`+insertManyArgs+`) SET lock_timeout = 0`); err != nil {
		t.Fatal(err)
	}
	g := blockBehind(t, sc, s, `INSERT INTO "`+sc.schema+`".workers_tasks (id, run_id, status) VALUES ('first', 'other', 'pending')`, func() error {
		return s.InsertTask(ctx, rec("first", "u"))
	})
	var mu sync.Mutex
	errs := map[string]error{}
	var wg sync.WaitGroup
	insert := func(name string, r workers.Record) {
		g.queue(&wg, func() {
			err := s.InsertTask(ctx, r)
			mu.Lock()
			errs[name] = err
			mu.Unlock()
		})
	}
	insert("a", rec("u::a", "w1", "w2", "w3"))
	insert("b", rec("b"))
	insert("taken", rec("taken", "y"))
	insert("a again", rec("u::a", "z"))
	refused := rec("u::refused", "u")
	refused.Queue = refusal
	insert("refused", refused)
	insert("c", rec("u::c", "w3", "w1"))
	if err := g.release(); err != nil {
		t.Fatalf("the first insert, after the blocking row rolled back: %v", err)
	}
	wg.Wait()

	for name, want := range map[string]error{"a": nil, "b": nil, "c": nil, "taken": workers.ErrConflict, "a again": workers.ErrConflict} {
		if err := errs[name]; !errors.Is(err, want) || (want == nil && err != nil) {
			t.Errorf("%s: InsertTask = %v, want %v", name, err, want)
		}
	}
	if err := errs["refused"]; !errors.Is(err, workers.ErrInvalidData) {
		t.Errorf("refused: InsertTask = %v, want ErrInvalidData", err)
	}
	for id, want := range map[string][]string{"u::a": {"w1", "w2", "w3"}, "b": nil, "u::c": {"w3", "w1"}, "taken": {"x"}, "first": {"u"}} {
		got, err := s.GetTask(ctx, id)
		if err != nil {
			t.Errorf("%s: %v", id, err)
			continue
		}
		if w := got.Watchers; !slices.Equal(w, want) {
			t.Errorf("%s: watchers %q, want %q", id, w, want)
		}
	}
}

// A write stuck on a row lock that another transaction holds does not
// hold back the store's other writes: after the stall time, they go in a
// batch of their own. The stuck write lands once the lock is gone; or,
// if its backend is ended while it waits, it fails having written
// nothing, and the same write made again lands.
func TestGroupCommitStuckWriteDoesNotHoldBackOthers(t *testing.T) {
	for _, terminate := range []bool{false, true} {
		t.Run(map[bool]string{false: "LockReleased", true: "BackendEnded"}[terminate], func(t *testing.T) {
			stuckWrite(t, terminate)
		})
	}
}

func stuckWrite(t *testing.T, terminate bool) {
	sc := newScratchT(t)
	s, app := sc.namedStore(t, "workers-stuck")
	ctx := t.Context()
	insertPending(t, s, "run-1", "u::stuck", "u::free")
	tx := holdRow(t, sc, "u::stuck")
	from := []workers.Status{workers.StatusPending}
	running := workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: time.Now()}
	start := func(id string) error {
		ok, err := s.TransitionTask(ctx, id, "run-1", from, running)
		if err == nil && !ok {
			err = errors.New(id + ": fenced off")
		}
		return err
	}
	stuck := make(chan error, 1)
	go func() { stuck <- start("u::stuck") }()
	const waiting = `FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`
	waitFor(t, func() bool {
		var n int
		err := sc.pool.QueryRow(ctx, `SELECT count(*) `+waiting, app).Scan(&n)
		return err == nil && n > 0
	})

	// Both arrive while the stuck batch is in flight, and no write
	// arrives after them.
	done := make(chan error, 2)
	go func() { done <- start("u::free") }()
	go func() {
		done <- s.InsertTask(ctx, workers.Record{ID: "u::new", RunID: "run-1", Watchers: []string{"u"}, CreatedAt: time.Now(),
			State: workers.State{Status: workers.StatusPending}})
	}()
	for range 2 {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case err := <-stuck:
			t.Fatalf("the stuck write ended while the lock was held: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("writes queued behind a stuck batch did not pass it")
		}
	}
	if got, err := s.GetTask(ctx, "u::free"); err != nil || got.Status != workers.StatusRunning {
		t.Fatalf("u::free = %v, %v; want RUNNING", got.Status, err)
	}
	select {
	case err := <-stuck:
		t.Fatalf("the stuck write ended while the lock was held: %v", err)
	default:
	}
	if terminate {
		if _, err := sc.pool.Exec(ctx, `SELECT pg_terminate_backend(pid) `+waiting, app); err != nil {
			t.Fatal(err)
		}
		if err := <-stuck; err == nil {
			t.Fatal("the stuck write whose backend was ended reported success")
		}
		if got, err := s.GetTask(ctx, "u::stuck"); err != nil || got.Status != workers.StatusPending {
			t.Fatalf("u::stuck = %v, %v; want PENDING: the ended write landed nothing", got.Status, err)
		}
		go func() { stuck <- start("u::stuck") }() // made again, behind the lock
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-stuck; err != nil {
		t.Fatalf("the stuck write, once the lock was gone: %v", err)
	}
	if got, err := s.GetTask(ctx, "u::stuck"); err != nil || got.Status != workers.StatusRunning {
		t.Fatalf("u::stuck = %v, %v; want RUNNING", got.Status, err)
	}
}

// Two processes' batches over the same rows, gathered in opposite
// orders, lock them in one order, so neither waits for the other in a
// cycle: both land as soon as the rows are free, not once the
// database's deadlock check (deadlock_timeout, here 5 s) breaks a cycle.
// The function's bound on lock waits (migration 0007) is lifted, since
// it would break the cycle too, after 100 ms.
func TestGroupCommitBatchesOverTheSameRowsDoNotDeadlock(t *testing.T) {
	sc := newScratchT(t)
	sc.store(t)
	ctx := t.Context()
	params := map[string]string{"deadlock_timeout": "5s"}
	unboundLockWaits(t, sc) // the order alone keeps the batches apart
	s1, s2 := sc.ownStore(t, params), sc.ownStore(t, params)
	sqlcore.SetStall(postgres.Core(s1), 0)
	sqlcore.SetStall(postgres.Core(s2), 0)
	insertPending(t, s1, "run-1", "u::a", "u::b", "u::g1", "u::g2")
	// Each lock is held by a transaction of its own, on a pool apart.
	lockers := sc.ownStore(t, nil).Pool()
	lock := func(id string) (pgx.Tx, int) {
		tx, err := lockers.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		var pid int
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid() FROM "`+sc.schema+`".workers_tasks WHERE id = $1 FOR UPDATE`, id).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		return tx, pid
	}
	// blockedBy waits until n backends wait for a lock the backend pid holds.
	blockedBy := func(pid, n int) {
		t.Helper()
		waitFor(t, func() bool {
			var k int
			err := sc.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, pid).Scan(&k)
			return err == nil && k >= n
		})
	}
	ta, pa := lock("u::a")
	tb, _ := lock("u::b")
	tg1, pg1 := lock("u::g1")
	tg2, pg2 := lock("u::g2")

	from := []workers.Status{workers.StatusPending, workers.StatusRunning}
	running := workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: time.Now()}
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	transition := func(s *postgres.Store, id string) {
		wg.Go(func() {
			ok, err := s.TransitionTask(ctx, id, "run-1", from, running)
			if err == nil && !ok {
				err = errors.New(id + " fenced off")
			}
			errs <- err
		})
	}
	// Each store has a batch in flight, held by a gate row, and gathers
	// the next: [a, b] on one, [b, a] on the other.
	transition(s1, "u::g1")
	blockedBy(pg1, 1)
	transition(s1, "u::a")
	waitFor(t, func() bool { return sqlcore.Queued(postgres.Core(s1)) == 1 })
	transition(s1, "u::b")
	waitFor(t, func() bool { return sqlcore.Queued(postgres.Core(s1)) == 2 })
	transition(s2, "u::g2")
	blockedBy(pg2, 1)
	transition(s2, "u::b")
	waitFor(t, func() bool { return sqlcore.Queued(postgres.Core(s2)) == 1 })
	transition(s2, "u::a")
	waitFor(t, func() bool { return sqlcore.Queued(postgres.Core(s2)) == 2 })

	// bothWait waits until both batches of two wait for a row lock (or
	// for each other), none for a lock that the backends pids held.
	bothWait := func(pids ...int) {
		t.Helper()
		waitFor(t, func() bool {
			var waiting, forReleased int
			err := sc.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE pg_blocking_pids(pid) && $1::int[])
				FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND position($2 in query) > 0`, pids, sc.schema).Scan(&waiting, &forReleased)
			return err == nil && waiting == 2 && forReleased == 0
		})
	}
	// The gates open: both batches of two wait, for a or b.
	_ = tg1.Rollback(ctx)
	_ = tg2.Rollback(ctx)
	bothWait(pg1, pg2)
	// The store that waited for a takes it, and both wait again.
	_ = ta.Rollback(ctx)
	bothWait(pg1, pg2, pa)
	start := time.Now()
	_ = tb.Rollback(ctx)
	wg.Wait()
	took := time.Since(start)
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if took > 2*time.Second {
		t.Errorf("the batches took %v once their rows were free: they waited for each other until the deadlock check", took)
	}
}

// One row of a batch that waits on a lock another transaction holds (an
// administrator's open transaction, a replica stopped mid-write) does
// not hold back the batch's other rows: the batch gives up the wait
// after 100 ms, having written nothing, and each write is made alone,
// so that a row nobody holds lands at once, and the held one once its
// lock is free.
func TestGroupCommitRowHeldByAnotherTransactionDoesNotHoldBackItsBatch(t *testing.T) {
	sc := newScratchT(t)
	s := sc.store(t)
	ctx := t.Context()
	insertPending(t, s, "run-1", "u::gate", "u::held", "u::free")
	holder := holdRow(t, sc, "u::held")
	from := []workers.Status{workers.StatusPending}
	running := workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: time.Now()}
	g := gateOn(t, sc, s, "u::gate", "run-1")
	var wg sync.WaitGroup
	held := make(chan error, 1)
	g.queue(&wg, func() {
		ok, err := s.TransitionTask(ctx, "u::held", "run-1", from, running)
		if err == nil && !ok {
			err = errors.New("u::held fenced off")
		}
		held <- err
	})
	free := make(chan error, 1)
	g.queue(&wg, func() {
		ok, err := s.TransitionTask(ctx, "u::free", "run-1", from, running)
		if err == nil && !ok {
			err = errors.New("u::free fenced off")
		}
		free <- err
	})
	if err := g.release(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-free:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("u::free, a row nobody else holds, waits on u::held's lock")
	}
	select {
	case err := <-held:
		t.Fatalf("u::held's write returned (%v) while its row was held", err)
	default:
	}
	_ = holder.Rollback(ctx)
	wg.Wait()
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"u::held", "u::free"} {
		if rec, err := s.GetTask(ctx, id); err != nil || rec.Status != workers.StatusRunning {
			t.Errorf("%s: %s, %v; want running", id, rec.Status, err)
		}
	}
}

// unboundLockWaits undoes migration 0007 in sc's schema: group commit's
// function then waits for a row lock as long as it is held.
func unboundLockWaits(t *testing.T, sc scratch) {
	t.Helper()
	setWriteManyLockWait(t, sc, "RESET lock_timeout")
}

// boundLockWaits sets migration 0007's bound again in sc's schema: group
// commit's function gives up on a held row after 100 ms.
func boundLockWaits(t *testing.T, sc scratch) {
	t.Helper()
	setWriteManyLockWait(t, sc, "SET lock_timeout = '100ms'")
}

// setWriteManyLockWait alters group commit's function in sc's schema by
// the clause set.
func setWriteManyLockWait(t *testing.T, sc scratch, set string) {
	t.Helper()
	if _, err := sc.pool.Exec(t.Context(), `ALTER FUNCTION "`+sc.schema+`".workers_write_many(
	text[], text[], bigint[], bigint[], text[], text[], timestamptz[], timestamptz[],
	text[], text[], text[], text[], text[], text[], timestamptz[], text[],
	text[], text[],
	text[], text[], text[], text[], bigint[], bigint[], text[], text[],
	timestamptz[], timestamptz[], text[], text[], text[], text[]) `+set); err != nil {
		t.Fatal(err)
	}
}

// An insert whose id another open transaction is inserting waits in its
// batch statement 100 ms at most, then goes alone; the inserts behind it
// land meanwhile, and the held one lands, and notifies, once the other
// transaction rolls back.
func TestAnInsertHeldByAnotherTransactionGoesAlone(t *testing.T) {
	sc := newScratchT(t)
	listener, s := sc.store(t), sc.store(t)
	ch, _ := listening(t, listener)
	nextResync(t, ch)
	ctx := t.Context()
	holder, err := sc.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(context.Background()) }()
	if _, err := holder.Exec(ctx, `INSERT INTO "`+sc.schema+`".workers_tasks (id, run_id, status) VALUES ('u::held', 'other', 'pending')`); err != nil {
		t.Fatal(err)
	}
	pending := func(id string) workers.Record {
		return workers.Record{ID: id, RunID: "run-1", CreatedAt: time.Now(), State: workers.State{Status: workers.StatusPending}}
	}
	// waiting reports whether a statement on the schema's tables waits
	// for a lock, in the batch statement or alone.
	waiting := func(batch bool) func() bool {
		return func() bool {
			var n int
			err := sc.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
				AND position($1 in query) > 0 AND (position('insert_many' in query) > 0) = $2`, sc.schema, batch).Scan(&n)
			return err == nil && n > 0
		}
	}
	held := make(chan error, 1)
	go func() { held <- s.InsertTask(ctx, pending("u::held")) }()
	waitFor(t, waiting(true))
	free := make(chan error, 1)
	go func() { free <- s.InsertTask(ctx, pending("u::free")) }()
	select {
	case err := <-free:
		if err != nil {
			t.Fatalf("the insert behind the held one: %v", err)
		}
	case err := <-held:
		t.Fatalf("the held insert ended while the other transaction was open: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the insert behind the held one waited for the other transaction")
	}
	if c := nextFor(t, ch, "u::free"); c.RunID != "run-1" {
		t.Errorf("notice of the free insert %+v", c)
	}
	waitFor(t, waiting(false)) // the held insert, alone now
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-held; err != nil {
		t.Fatalf("the held insert, once the other transaction rolled back: %v", err)
	}
	if got, err := s.GetTask(ctx, "u::held"); err != nil || got.RunID != "run-1" {
		t.Fatalf("u::held = %+v, %v; want run-1's", got, err)
	}
	if c := nextFor(t, ch, "u::held"); c.RunID != "run-1" {
		t.Errorf("notice of the held insert %+v, want run-1's", c)
	}
}

// A batch the database refuses, one of whose rows another transaction
// holds, holds back none of its other callers: each makes its write
// alone, under its own context, so the refused row's caller learns of
// the refusal and a free row's caller of its write while the held row
// still waits.
func TestARefusedBatchWithAHeldRowHoldsBackNoOtherCaller(t *testing.T) {
	sc := newScratchT(t)
	s := sc.store(t)
	refuseInTheDatabase(t, sc)
	ctx := t.Context()
	insertPending(t, s, "run-1", "u::gate", "u::bad", "u::free", "u::held")
	holder := holdRow(t, sc, "u::held")
	from := []workers.Status{workers.StatusPending}
	running := workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: time.Now()}
	refused := workers.State{Status: workers.StatusFailed, Attempt: 1, StartedAt: time.Now(), CompletedAt: time.Now(), Error: refusal}
	g := gateOn(t, sc, s, "u::gate", "run-1")
	type answer struct {
		ok  bool
		err error
	}
	var wg sync.WaitGroup
	answers := map[string]chan answer{}
	for _, w := range []struct {
		id   string
		next workers.State
	}{{"u::bad", refused}, {"u::free", running}, {"u::held", running}} {
		answers[w.id] = make(chan answer, 1)
		g.queue(&wg, func() {
			ok, err := s.TransitionTask(ctx, w.id, "run-1", from, w.next)
			answers[w.id] <- answer{ok, err}
		})
	}
	// The batch of the three, which starts as the gate's ends, may have
	// another start beside it while it stays in flight, as by default.
	sqlcore.SetStall(postgres.Core(s), 20*time.Millisecond)
	if err := g.release(); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(10 * time.Second)
	for id, want := range map[string]func(answer) bool{
		"u::bad":  func(a answer) bool { return !a.ok && errors.Is(a.err, workers.ErrInvalidData) },
		"u::free": func(a answer) bool { return a.ok && a.err == nil },
	} {
		select {
		case a := <-answers[id]:
			if !want(a) {
				t.Errorf("%s: TransitionTask = %v, %v", id, a.ok, a.err)
			}
		case <-timeout:
			rec, _ := s.GetTask(ctx, id)
			t.Fatalf("%s: no answer in 10 s while another row of its batch is held (its record is %s)", id, rec.Status)
		}
	}
	// The free row's next write goes while the held row still waits: its
	// task's key was freed as its caller was answered.
	next := make(chan answer, 1)
	go func() {
		done := workers.State{Status: workers.StatusCompleted, Attempt: 1, Progress: 100, StartedAt: running.StartedAt, CompletedAt: time.Now()}
		ok, err := s.TransitionTask(ctx, "u::free", "run-1", []workers.Status{workers.StatusRunning}, done)
		next <- answer{ok, err}
	}()
	select {
	case a := <-next:
		if !a.ok || a.err != nil {
			t.Errorf("u::free's next write: TransitionTask = %v, %v", a.ok, a.err)
		}
	case <-timeout:
		t.Fatal("u::free's next write: no answer in 10 s while another row of its first batch is held")
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if a := <-answers["u::held"]; !a.ok || a.err != nil {
		t.Errorf("u::held, once free: TransitionTask = %v, %v", a.ok, a.err)
	}
	wg.Wait()
}

// A write made alone after its batch gave up on a held row goes within
// its own caller's wait: once that caller has left (its deadline passed),
// the write is cut off, and does not land when the row is let go, though
// another caller of the batch still waits on a row of its own.
func TestAWriteMadeAloneEndsWithItsCaller(t *testing.T) {
	sc := newScratchT(t)
	s := sc.store(t)
	ctx := t.Context()
	insertPending(t, s, "run-1", "u::gate", "u::held1", "u::held2")
	h1, h2 := holdRow(t, sc, "u::held1"), holdRow(t, sc, "u::held2")
	from := []workers.Status{workers.StatusPending}
	running := workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: time.Now()}
	g := gateOn(t, sc, s, "u::gate", "run-1")
	var wg sync.WaitGroup
	short := make(chan error, 1)
	g.queue(&wg, func() {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := s.TransitionTask(sctx, "u::held1", "run-1", from, running)
		short <- err
	})
	g.queue(&wg, func() { _, _ = s.TransitionTask(ctx, "u::held2", "run-1", from, running) })
	if err := g.release(); err != nil {
		t.Fatal(err)
	}
	if err := <-short; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the caller with a deadline: %v, want DeadlineExceeded", err)
	}
	// Its statement is gone from the server: only the other one waits.
	waitFor(t, func() bool {
		var n int
		err := sc.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`, sc.schema).Scan(&n)
		return err == nil && n == 1
	})
	if err := h1.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h2.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait() // u::held2's write, once its row is free
	if rec, err := s.GetTask(ctx, "u::held1"); err != nil || rec.Status != workers.StatusPending {
		t.Errorf("u::held1: %s, %v; want its write, whose caller left, not to land", rec.Status, err)
	}
}

// A batch that gave up on a held row ends at once, its writes each going
// on alone: the held row keeps no batch in flight, so the store's other
// writes go while it waits, even with no spare batch to start beside a
// stuck one.
func TestAHeldRowKeepsNoBatchInFlight(t *testing.T) {
	sc := newScratchT(t)
	s := sc.store(t)
	ctx := t.Context()
	insertPending(t, s, "run-1", "u::gate", "u::held", "u::free", "u::other")
	holder := holdRow(t, sc, "u::held")
	from := []workers.Status{workers.StatusPending}
	running := workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: time.Now()}
	g := gateOn(t, sc, s, "u::gate", "run-1") // and no spare batches
	var wg sync.WaitGroup
	answers := map[string]chan error{"u::held": make(chan error, 1), "u::free": make(chan error, 1), "u::other": make(chan error, 1)}
	write := func(id string) {
		ok, err := s.TransitionTask(ctx, id, "run-1", from, running)
		if err == nil && !ok {
			err = errors.New(id + " fenced off")
		}
		answers[id] <- err
	}
	for _, id := range []string{"u::held", "u::free"} {
		g.queue(&wg, func() { write(id) })
	}
	if err := g.release(); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(10 * time.Second)
	for _, id := range []string{"u::free", "u::other"} {
		if id == "u::other" {
			wg.Go(func() { write(id) }) // after the batch gave up on u::held
		}
		select {
		case err := <-answers[id]:
			if err != nil {
				t.Fatalf("%s: %v", id, err)
			}
		case <-timeout:
			t.Fatalf("%s: no answer in 10 s while u::held's row is held", id)
		}
	}
	// A second write of u::held queues behind its first, which holds the
	// task's key; when the first ends, with no batch in flight, the freed
	// key starts one.
	second := make(chan error, 1)
	wg.Go(func() {
		done := workers.State{Status: workers.StatusCompleted, Attempt: 1, Progress: 100, StartedAt: running.StartedAt, CompletedAt: time.Now()}
		ok, err := s.TransitionTask(ctx, "u::held", "run-1", []workers.Status{workers.StatusRunning}, done)
		if err == nil && !ok {
			err = errors.New("u::held's end fenced off")
		}
		second <- err
	})
	waitFor(t, func() bool { return sqlcore.Queued(postgres.Core(s)) >= 1 })
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for name, ch := range map[string]chan error{"u::held's start": answers["u::held"], "u::held's end": second} {
		select {
		case err := <-ch:
			if err != nil {
				t.Errorf("%s, once free: %v", name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no answer in 10 s once the row is free", name)
		}
	}
	wg.Wait()
}

// Writes each alone of more held rows than there may be batches in
// flight (one, and three spare) hold back no other task's write: a lone
// write goes in the batch statement too, which gives up on a held row
// after 100 ms and leaves the write to a goroutine of its own, so no
// batch stays in flight, however many rows are held.
func TestLoneWritesOfManyHeldRowsHoldBackNoOtherTask(t *testing.T) {
	sc := newScratchT(t)
	cfg := testConfig(t)
	cfg.MaxConns = 10 // room for five held writes and the others
	s := storeOver(t, cfg, postgres.WithSchema(sc.schema))
	ctx := t.Context()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	held := []string{"u::held1", "u::held2", "u::held3", "u::held4", "u::held5"}
	insertPending(t, s, "run-1", append(held, "u::free")...)
	from := []workers.Status{workers.StatusPending}
	running := workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: time.Now()}
	waiting := func() int {
		var n int
		err := sc.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`, sc.schema).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	var holders []pgx.Tx
	var wg sync.WaitGroup
	errs := make(chan error, len(held))
	for i, id := range held {
		holders = append(holders, holdRow(t, sc, id))
		wg.Go(func() {
			ok, err := s.TransitionTask(ctx, id, "run-1", from, running)
			if err == nil && !ok {
				err = fmt.Errorf("%s: fenced off", id)
			}
			errs <- err
		})
		deadline := time.Now().Add(10 * time.Second)
		for waiting() < i+1 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: its write did not reach the database in 10 s, with %d held rows' writes waiting there", id, i)
			}
			time.Sleep(time.Millisecond) // polling with a deadline
		}
	}
	free := make(chan error, 1)
	go func() {
		_, err := s.TransitionTask(ctx, "u::free", "run-1", from, running)
		free <- err
	}()
	select {
	case err := <-free:
		if err != nil {
			t.Errorf("u::free: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("u::free: no answer in 10 s while five other rows are held")
	}
	for _, tx := range holders {
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}
