package postgres_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// A cutter cuts one connection of a store's pool at a chosen point of one
// statement, as a network that fails there would: before the statement
// reaches the server, so that nothing of it lands, or once the server has
// answered it, so that it has committed and its caller never hears so.
// Each arming cuts once.
type cutter struct {
	match  atomic.Pointer[func([]byte) bool] // the statement to cut, by what the client writes
	before atomic.Bool                       // cut match's statement before it is sent, not after its answer
	pid    atomic.Int32                      // the backend whose next answer is cut
	cuts   atomic.Int32                      // statements cut
}

var errCut = errors.New("connection cut by the test")

// cutWrite arms c to cut the next statement whose write matches, before
// it is sent if before is set, else once it is answered.
func (c *cutter) cutWrite(match func([]byte) bool, before bool) {
	c.before.Store(before)
	c.match.Store(&match)
}

// cutAnswerOf arms c to cut the connection of backend pid once the
// server next answers on it.
func (c *cutter) cutAnswerOf(pid int32) { c.pid.Store(pid) }

// pool makes the connections of the pool configuration cfg ones that c
// can cut, and returns cfg. They go without TLS, whose bytes c could not
// read; t is skipped if the server takes only TLS connections.
func (c *cutter) pool(t *testing.T, cfg *pgxpool.Config) *pgxpool.Config {
	t.Helper()
	cc := cfg.ConnConfig
	if cc.TLSConfig != nil {
		plain := -1
		for i, fb := range cc.Fallbacks {
			if fb.TLSConfig == nil {
				plain = i
				break
			}
		}
		if plain < 0 {
			t.Skip("the test database takes only TLS connections, which the cutter cannot read")
		}
		cc.Host, cc.Port, cc.TLSConfig = cc.Fallbacks[plain].Host, cc.Fallbacks[plain].Port, nil
	}
	cc.Fallbacks = nil
	dial := cc.DialFunc
	cc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &cutConn{Conn: conn, c: c}, nil
	}
	return cfg
}

// cutConn is a connection a cutter may cut. It follows the server's
// messages as they are read, to learn its backend's pid (BackendKeyData)
// and to find the end of an answer (ReadyForQuery).
type cutConn struct {
	net.Conn
	c *cutter

	mu     sync.Mutex
	cut    bool   // at the end of the next answer
	hdr    []byte // the header of the server's message being read, while it is shorter than 5 bytes
	inBody bool
	typ    byte
	left   int    // bytes of the message's body still to come
	key    []byte // the body of a BackendKeyData message, as it comes
	pid    int32
}

func (cc *cutConn) Write(p []byte) (int, error) {
	if m := cc.c.match.Load(); m != nil && (*m)(p) && cc.c.match.CompareAndSwap(m, nil) {
		cc.c.cuts.Add(1)
		if cc.c.before.Load() {
			_ = cc.Conn.Close()
			return len(p), &net.OpError{Op: "write", Net: "tcp", Err: errCut}
		}
		cc.mu.Lock()
		cc.cut = true
		cc.mu.Unlock()
	}
	return cc.Conn.Write(p)
}

func (cc *cutConn) Read(p []byte) (int, error) {
	n, err := cc.Conn.Read(p)
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if pid := cc.c.pid.Load(); pid != 0 && pid == cc.pid && cc.c.pid.CompareAndSwap(pid, 0) {
		cc.c.cuts.Add(1)
		cc.cut = true
	}
	if cc.answered(p[:n]) && cc.cut {
		_ = cc.Conn.Close()
		return 0, &net.OpError{Op: "read", Net: "tcp", Err: errCut}
	}
	return n, err
}

// answered follows the server's messages through b and reports whether
// one of them ended an answer (ReadyForQuery); mu is held.
func (cc *cutConn) answered(b []byte) (ready bool) {
	for len(b) > 0 {
		if !cc.inBody {
			k := min(5-len(cc.hdr), len(b))
			cc.hdr, b = append(cc.hdr, b[:k]...), b[k:]
			if len(cc.hdr) < 5 {
				return ready
			}
			cc.typ, cc.left, cc.inBody = cc.hdr[0], int(binary.BigEndian.Uint32(cc.hdr[1:]))-4, true
			cc.hdr, cc.key = cc.hdr[:0], cc.key[:0]
		}
		k := min(cc.left, len(b))
		if cc.typ == 'K' {
			cc.key = append(cc.key, b[:k]...)
		}
		b, cc.left = b[k:], cc.left-k
		if cc.left > 0 {
			return ready
		}
		cc.inBody = false
		switch cc.typ {
		case 'K':
			cc.pid = int32(binary.BigEndian.Uint32(cc.key))
		case 'Z':
			ready = true
		}
	}
	return ready
}

// cutStore returns a migrated store in sc's schema whose connections c
// can cut.
func (sc scratch) cutStore(t *testing.T, c *cutter) *postgres.Store {
	t.Helper()
	s := storeOver(t, c.pool(t, testConfig(t)), postgres.WithSchema(sc.schema))
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s
}

// holding reports whether a statement's bytes carry id and not other:
// a write of id's tried on its own, not its batch's statement.
func holding(id, other string) func([]byte) bool {
	return func(p []byte) bool { return bytes.Contains(p, []byte(id)) && !bytes.Contains(p, []byte(other)) }
}

// pendingOf is a PENDING record of run-1 for task id, watched by u.
func pendingOf(id string) workers.Record {
	return workers.Record{ID: id, RunID: "run-1", Watchers: []string{"u"}, CreatedAt: time.Now(),
		State: workers.State{Status: workers.StatusPending}}
}

// cutOnRelease arms c to cut the statement that match finds (before it
// is sent, or after its answer), releases g's gate, and checks that the
// writes answered on outs, by id, were told ErrUnavailable, and that one
// statement was cut.
func (c *cutter) cutOnRelease(t *testing.T, g *gather, match func([]byte) bool, before bool, outs map[string]chan error) {
	t.Helper()
	c.cutWrite(match, before)
	if err := g.release(); err != nil {
		t.Fatal(err)
	}
	for id, out := range outs {
		if err := <-out; !errors.Is(err, workers.ErrUnavailable) {
			t.Errorf("%s, whose statement lost its connection: %v, want ErrUnavailable", id, err)
		}
	}
	if n := c.cuts.Load(); n != 1 {
		t.Fatalf("%d statements cut, want one", n)
	}
}

// cutPoint names a subtest by where its statement is cut.
func cutPoint(before bool) string {
	if before {
		return "BeforeItIsSent"
	}
	return "AfterItsCommit"
}

// A batch that met a held row tries each of its writes on its own in the
// group statement. A try that loses its connection, before it reached
// the server or after it committed, tells its caller that its outcome is
// unknown (ErrUnavailable), for the caller to read back, and is not made
// again: made again, a transition that had landed would find its own
// write and report itself fenced off, and an insert would report its own
// row as a taken id (ErrConflict). An insert that may have landed so is
// announced.
func TestAWriteTriedAloneThatLosesItsConnection(t *testing.T) {
	from := []workers.Status{workers.StatusPending}
	running := workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: time.Now()}
	for _, before := range []bool{true, false} {
		t.Run("Transition/"+cutPoint(before), func(t *testing.T) {
			sc := newScratchT(t)
			c := &cutter{}
			s := sc.cutStore(t, c)
			ctx := t.Context()
			insertPending(t, s, "run-1", "u::gate", "u::held", "u::free")
			var wg sync.WaitGroup
			defer wg.Wait()
			holder := holdRow(t, sc, "u::held")
			defer func() { _ = holder.Rollback(context.Background()) }()
			transition := func(id string, out chan<- error) func() {
				return func() {
					ok, err := s.TransitionTask(ctx, id, "run-1", from, running)
					if err == nil && !ok {
						err = errors.New("fenced off")
					}
					out <- err
				}
			}
			unboundLockWaits(t, sc)
			g := gateOn(t, sc, s, "u::gate", "run-1")
			held, free := make(chan error, 1), make(chan error, 1)
			g.queue(&wg, transition("u::held", held))
			g.queue(&wg, transition("u::free", free))
			boundLockWaits(t, sc) // the batch of the two gives up on u::held after 100 ms
			c.cutOnRelease(t, g, holding("u::free", "u::held"), before, map[string]chan error{"u::free": free})
			want := map[bool]workers.Status{true: workers.StatusPending, false: workers.StatusRunning}[before]
			if rec, err := s.GetTask(ctx, "u::free"); err != nil || rec.Status != want {
				t.Errorf("u::free = %s, %v; want %s", rec.Status, err, want)
			}
			if err := holder.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-held; err != nil {
				t.Errorf("u::held, once its row was free: %v", err)
			}
		})
	}
	for _, before := range []bool{true, false} {
		t.Run("Insert/"+cutPoint(before), func(t *testing.T) {
			sc := newScratchT(t)
			c := &cutter{}
			s := sc.cutStore(t, c)
			listener := sc.store(t)
			ch, _ := listening(t, listener)
			nextResync(t, ch)
			ctx := t.Context()
			var wg sync.WaitGroup
			defer wg.Wait()
			holder, err := sc.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = holder.Rollback(context.Background()) }()
			if _, err := holder.Exec(ctx, `INSERT INTO "`+sc.schema+`".workers_tasks (id, run_id, status) VALUES ('u::held', 'other', 'pending')`); err != nil {
				t.Fatal(err)
			}
			setInsertManyLockWait(t, sc, "SET lock_timeout = 0")
			g := blockBehind(t, sc, s, `INSERT INTO "`+sc.schema+`".workers_tasks (id, run_id, status) VALUES ('u::gate', 'other', 'pending')`,
				func() error { return s.InsertTask(ctx, pendingOf("u::gate")) })
			held, free := make(chan error, 1), make(chan error, 1)
			g.queue(&wg, func() { held <- s.InsertTask(ctx, pendingOf("u::held")) })
			g.queue(&wg, func() { free <- s.InsertTask(ctx, pendingOf("u::free")) })
			setInsertManyLockWait(t, sc, "SET lock_timeout = '100ms'") // migration 0009's bound
			c.cutOnRelease(t, g, holding("u::free", "u::held"), before, map[string]chan error{"u::free": free})
			rec, err := s.GetTask(ctx, "u::free")
			switch {
			case before && !errors.Is(err, workers.ErrNotFound):
				t.Errorf("u::free, cut before it was sent: %+v, %v; want ErrNotFound", rec, err)
			case !before && (err != nil || rec.RunID != "run-1"):
				t.Errorf("u::free, cut after its commit: %+v, %v; want run-1's record", rec, err)
			case !before:
				if c := nextFor(t, ch, "u::free"); c.RunID != "run-1" {
					t.Errorf("notice of u::free %+v, want run-1's: an insert that landed unannounced", c)
				}
			}
			if err := holder.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-held; err != nil {
				t.Errorf("u::held, once the other transaction rolled back: %v", err)
			}
		})
	}
}

// A write whose row another transaction holds waits for it alone, within
// Config.LoneWrites. One that loses its connection after it committed
// tells its caller that its outcome is unknown (ErrUnavailable), and is
// not made again: an insert made again would report its own row as a
// taken id (ErrConflict), a transition its own write as a fence.
func TestAHeldRowsLoneWriteThatLosesItsConnectionAfterItsCommit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		hold  string // the statement that holds u::held in another transaction
		write func(s *postgres.Store, ctx context.Context) error
		lone  string // how the lone write's statement begins
	}{
		{"Transition", `SELECT 1 FROM "{schema}".workers_tasks WHERE id = 'u::held' FOR UPDATE`, func(s *postgres.Store, ctx context.Context) error {
			ok, err := s.TransitionTask(ctx, "u::held", "run-1", []workers.Status{workers.StatusPending},
				workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: time.Now()})
			if err == nil && !ok {
				err = errors.New("fenced off")
			}
			return err
		}, "UPDATE"},
		{"Insert", `INSERT INTO "{schema}".workers_tasks (id, run_id, status) VALUES ('u::held', 'other', 'pending')`, func(s *postgres.Store, ctx context.Context) error {
			return s.InsertTask(ctx, pendingOf("u::held"))
		}, "WITH"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := newScratchT(t)
			c := &cutter{}
			s := sc.cutStore(t, c)
			ctx := t.Context()
			if tc.name == "Transition" {
				insertPending(t, s, "run-1", "u::held")
			}
			holder, err := sc.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = holder.Rollback(context.Background()) }()
			if _, err := holder.Exec(ctx, strings.ReplaceAll(tc.hold, "{schema}", sc.schema)); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- tc.write(s, ctx) }()
			// The write, alone once its batch gave up on the row, waits.
			var pid int32
			waitFor(t, func() bool {
				err := sc.pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'
					AND position($1 in query) > 0 AND starts_with(query, $2)`, sc.schema, tc.lone).Scan(&pid)
				return err == nil
			})
			c.cutAnswerOf(pid)
			if err := holder.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-done; !errors.Is(err, workers.ErrUnavailable) {
				t.Errorf("a lone write that lost its connection after its commit: %v, want ErrUnavailable", err)
			}
			if n := c.cuts.Load(); n != 1 {
				t.Fatalf("%d statements cut, want the lone write", n)
			}
			rec, err := s.GetTask(ctx, "u::held")
			if err != nil || rec.RunID != "run-1" || (tc.name == "Transition") != (rec.Status == workers.StatusRunning) {
				t.Errorf("u::held = %+v, %v; want run-1's, written", rec, err)
			}
		})
	}
}

// setInsertManyLockWait alters migration 0009's function in sc's schema
// by the clause set.
func setInsertManyLockWait(t *testing.T, sc scratch, set string) {
	t.Helper()
	if _, err := sc.pool.Exec(t.Context(), `ALTER FUNCTION "`+sc.schema+`".workers_insert_many(`+insertManyArgs+`) `+set); err != nil {
		t.Fatal(err)
	}
}

// A batch whose group statement loses its connection, before it reached
// the server or after it committed, tells each of its callers that its
// outcome is unknown (ErrUnavailable), and none is made again; inserts
// that may have landed so are announced.
func TestABatchThatLosesItsConnection(t *testing.T) {
	from := []workers.Status{workers.StatusPending}
	running := workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: time.Now()}
	both := func(p []byte) bool { return bytes.Contains(p, []byte("u::a")) && bytes.Contains(p, []byte("u::b")) }
	for _, before := range []bool{true, false} {
		t.Run("Transitions/"+cutPoint(before), func(t *testing.T) {
			sc := newScratchT(t)
			c := &cutter{}
			s := sc.cutStore(t, c)
			ctx := t.Context()
			insertPending(t, s, "run-1", "u::gate", "u::a", "u::b")
			unboundLockWaits(t, sc)
			g := gateOn(t, sc, s, "u::gate", "run-1")
			var wg sync.WaitGroup
			defer wg.Wait()
			errs := map[string]chan error{"u::a": make(chan error, 1), "u::b": make(chan error, 1)}
			for id, out := range errs {
				g.queue(&wg, func() {
					ok, err := s.TransitionTask(ctx, id, "run-1", from, running)
					if err == nil && !ok {
						err = errors.New("fenced off")
					}
					out <- err
				})
			}
			c.cutOnRelease(t, g, both, before, errs)
			want := map[bool]workers.Status{true: workers.StatusPending, false: workers.StatusRunning}[before]
			for id := range errs {
				if rec, err := s.GetTask(ctx, id); err != nil || rec.Status != want {
					t.Errorf("%s = %s, %v; want %s", id, rec.Status, err, want)
				}
			}
		})
	}
	for _, before := range []bool{true, false} {
		t.Run("Inserts/"+cutPoint(before), func(t *testing.T) {
			sc := newScratchT(t)
			c := &cutter{}
			s := sc.cutStore(t, c)
			ch, _ := listening(t, sc.store(t))
			nextResync(t, ch)
			ctx := t.Context()
			setInsertManyLockWait(t, sc, "SET lock_timeout = 0")
			g := blockBehind(t, sc, s, `INSERT INTO "`+sc.schema+`".workers_tasks (id, run_id, status) VALUES ('u::gate', 'other', 'pending')`,
				func() error { return s.InsertTask(ctx, pendingOf("u::gate")) })
			var wg sync.WaitGroup
			defer wg.Wait()
			errs := map[string]chan error{"u::a": make(chan error, 1), "u::b": make(chan error, 1)}
			for id, out := range errs {
				g.queue(&wg, func() { out <- s.InsertTask(ctx, pendingOf(id)) })
			}
			c.cutOnRelease(t, g, both, before, errs)
			for id := range errs {
				rec, err := s.GetTask(ctx, id)
				switch {
				case before && !errors.Is(err, workers.ErrNotFound):
					t.Errorf("%s, cut before it was sent: %+v, %v; want ErrNotFound", id, rec, err)
				case !before && (err != nil || rec.RunID != "run-1"):
					t.Errorf("%s, cut after its commit: %+v, %v; want run-1's record", id, rec, err)
				}
			}
			if !before {
				for _, id := range []string{"u::a", "u::b"} {
					if c := nextFor(t, ch, id); c.RunID != "run-1" {
						t.Errorf("notice of %s %+v, want run-1's: an insert that landed unannounced", id, c)
					}
				}
			}
		})
	}
}
