package postgres_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// Listen reports a Resync once it listens, then a notice for each
// committed change made through any handle on the tables; after its
// connection is killed it reconnects and reports a Resync again; and it
// returns ctx's error when ctx ends.
func TestListen(t *testing.T) {
	t.Parallel()
	sc := newScratchT(t)
	listener, writer := sc.store(t), sc.store(t)
	ch, stop := listening(t, listener)
	firstResync(t, ch)

	at := time.Now().UTC().Truncate(time.Microsecond)
	rec := workers.Record{ID: "alice::k", RunID: "inst.1", CreatedAt: at, State: workers.State{Status: workers.StatusPending}}
	if err := writer.InsertTask(t.Context(), rec); err != nil {
		t.Fatal(err)
	}
	if c := next(t, ch); c != (workers.Change{ID: rec.ID, RunID: "inst.1", Status: workers.StatusPending}) {
		t.Errorf("insert notice %+v", c)
	}
	ok, err := writer.TransitionTask(t.Context(), rec.ID, "inst.1", []workers.Status{workers.StatusPending},
		workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: at})
	if err != nil || !ok {
		t.Fatalf("TransitionTask = %v, %v", ok, err)
	}
	if c := next(t, ch); c.ID != rec.ID || c.Status != workers.StatusRunning {
		t.Errorf("transition notice %+v", c)
	}
	if ok, err := writer.AddWatcher(t.Context(), rec.ID, "inst.1", "bob"); err != nil || !ok {
		t.Fatalf("AddWatcher = %v, %v", ok, err)
	}
	if c := next(t, ch); c.ID != rec.ID {
		t.Errorf("watcher notice %+v", c)
	}

	// Kill the listener's connection: it comes back with a resync.
	if _, err := sc.pool.Exec(t.Context(),
		`SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name = 'workers listener' AND query LIKE '%' || $1 || '%'`,
		postgres.Channel(listener)); err != nil {
		t.Fatal(err)
	}
	if c := next(t, ch); !c.Resync {
		t.Fatalf("after the kill: %+v, want a resync", c)
	}
	if err := writer.SetTask(t.Context(), workers.Record{ID: rec.ID, State: workers.State{Status: workers.StatusRunning, Progress: 50, Attempt: 1, StartedAt: at}}); err != nil {
		t.Fatal(err)
	}
	if c := next(t, ch); c.ID != rec.ID {
		t.Errorf("notice after the reconnect %+v", c)
	}

	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Errorf("Listen after ctx ended = %v, want context.Canceled", err)
	}
}

// A new task's insert sends one notice, with its run and status, once
// it has committed, and none from the trigger, for the task or for its
// watchers; an insert that finds its id taken sends none. A row inserted
// by hand still notifies from the trigger.
func TestInsertsAreAnnouncedOnce(t *testing.T) {
	t.Parallel()
	sc := newScratchT(t)
	listener, writer := sc.store(t), sc.store(t)
	ch, _ := listening(t, listener)
	firstResync(t, ch)

	const n = 40
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			// Concurrent inserts: some go alone, some in one statement.
			rec := workers.Record{ID: "alice::t" + strconv.Itoa(i), RunID: "inst." + strconv.Itoa(i), Watchers: []string{"bob", "carol"},
				CreatedAt: time.Now(), State: workers.State{Status: workers.StatusRunning, Attempt: 1, StartedAt: time.Now()}}
			if err := writer.InsertTask(t.Context(), rec); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	taken := workers.Record{ID: "alice::t0", RunID: "inst.again", CreatedAt: time.Now(), State: workers.State{Status: workers.StatusPending}}
	if err := writer.InsertTask(t.Context(), taken); !errors.Is(err, workers.ErrConflict) {
		t.Fatalf("insert of a taken id = %v, want ErrConflict", err)
	}
	// Closing the writer sends what it has yet to announce: every notice
	// of its inserts commits before the row inserted by hand below.
	if err := writer.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.pool.Exec(t.Context(), `INSERT INTO "`+sc.schema+`".workers_tasks (id, run_id, status) VALUES ('by-hand', 'r', 'pending')`); err != nil {
		t.Fatal(err)
	}
	got := map[string][]workers.Change{}
	for {
		c := next(t, ch)
		if c.ID == "by-hand" {
			if c != (workers.Change{ID: "by-hand", RunID: "r", Status: workers.StatusPending}) {
				t.Errorf("the row inserted by hand: notice %+v", c)
			}
			break
		}
		got[c.ID] = append(got[c.ID], c)
	}
	if len(got) != n {
		t.Errorf("notices of %d ids, want %d", len(got), n)
	}
	for i := range n {
		id := "alice::t" + strconv.Itoa(i)
		want := workers.Change{ID: id, RunID: "inst." + strconv.Itoa(i), Status: workers.StatusRunning}
		if cs := got[id]; len(cs) != 1 || cs[0] != want {
			t.Errorf("%s: notices %+v, want one, %+v", id, cs, want)
		}
	}
}

// A server that ends idle sessions (idle_session_timeout, here in the
// connection string, as a role's or a database's setting would set it
// for every session) does not end the listener's, which waits idle for
// notices: no reconnect, so no Resync, however long the store is quiet,
// and the next notice comes on the same session.
func TestListenOutlivesIdleSessionTimeout(t *testing.T) {
	sc := newScratchT(t)
	needIdleSessionTimeout(t, sc)
	sc.store(t) // migrates
	s := sc.ownStore(t, map[string]string{"idle_session_timeout": "200ms"})
	ch, _ := listening(t, s)
	firstResync(t, ch)
	quiet := time.After(time.Second) // five idle_session_timeouts, with no write
	for waiting := true; waiting; {
		select {
		case c := <-ch:
			t.Fatalf("notice %+v over a quiet store: the server ended the listener's idle session", c)
		case <-quiet:
			waiting = false
		}
	}
	insertPending(t, s, "run-1", "u::a")
	if c := next(t, ch); c.Resync || c.ID != "u::a" {
		t.Errorf("notice %+v, want u::a's insert", c)
	}
}

// A listener whose connection goes silent, as one to a server gone
// behind a partition does (it is never closed, and carries nothing
// more), pings it, finds no answer, and listens again on a new
// connection, with a Resync. Without the ping it would wait for a notice
// until TCP gave up on the connection.
func TestListenDropsAConnectionThatStopsAnswering(t *testing.T) {
	t.Parallel()
	s, px := proxiedStore(t, 50*time.Millisecond, 2*time.Second)

	resyncs := make(chan struct{}, 64)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- s.Listen(ctx, func(c workers.Change) {
			if c.Resync {
				resyncs <- struct{}{}
			}
		})
	}()
	resync := func(what string) {
		t.Helper()
		select {
		case <-resyncs:
		case <-time.After(10 * time.Second):
			t.Fatalf("no resync: want %s", what)
		}
	}
	resync("one as the listener listens")
	// Silent for several checks, each pinged and answered: two pings,
	// each a message from the listener and one back.
	carried := px.carried.Load()
	waitFor(t, func() bool { return px.carried.Load() >= carried+4 })
	select {
	case <-resyncs:
		t.Fatal("a connection that answers its pings was dropped")
	default:
	}
	px.freeze()
	resync("one as the listener listens again, on a new connection")
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Listen returned %v, want context.Canceled", err)
	}
}

// A listener whose server accepts its connection and then answers
// nothing does not wait for it: setting up is bounded too, and Listen
// fails, as it does when its first connection fails.
func TestListenFailsWhenTheServerNeverAnswers(t *testing.T) {
	t.Parallel()
	s, px := proxiedStore(t, 100*time.Millisecond, time.Second)
	px.frozenFromTheStart.Store(true)

	done := make(chan error, 1)
	go func() { done <- s.Listen(t.Context(), func(workers.Change) {}) }()
	select {
	case err := <-done:
		if err == nil || errors.Is(err, context.Canceled) {
			t.Fatalf("Listen returned %v, want the failed setup's error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Listen still waits for a server that never answers")
	}
}

// A pool whose connections have an OnNotification handler of the
// application's (one that listens on its own pooled connections) does
// not take the listener's notices: pgx keeps a notice for
// WaitForNotification only without such a handler.
func TestListenIgnoresThePoolsNotificationHandler(t *testing.T) {
	t.Parallel()
	sc := newScratchT(t)
	writer := sc.store(t)
	cfg := testConfig(t)
	cfg.ConnConfig.OnNotification = func(*pgconn.PgConn, *pgconn.Notification) {}
	s := storeOver(t, cfg, postgres.WithSchema(sc.schema))
	ch, stop := listening(t, s)
	nextResync(t, ch)
	rec := workers.Record{ID: "u::n", RunID: "r1", CreatedAt: time.Now(), State: workers.State{Status: workers.StatusPending}}
	if err := writer.InsertTask(t.Context(), rec); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-ch:
		if c.ID != rec.ID {
			t.Errorf("notice %+v, want one of %s", c, rec.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the insert's notice never came")
	}
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Errorf("Listen returned %v, want context.Canceled", err)
	}
}

// The pool's BeforeConnect hook, which may fetch a credential from a
// service that hangs, is bounded as the rest of the listener's setup is.
func TestListenBoundsThePoolsBeforeConnect(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.MinConns = 0
	cfg.BeforeConnect = func(ctx context.Context, _ *pgx.ConnConfig) error {
		<-ctx.Done() // a credential service that never answers
		return ctx.Err()
	}
	s := storeOver(t, cfg, postgres.WithListenCheck(100*time.Millisecond, time.Second))
	done := make(chan error, 1)
	go func() { done <- s.Listen(t.Context(), func(workers.Change) {}) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Listen returned %v, want the setup's deadline", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Listen still waits in BeforeConnect")
	}
}

// proxiedStore returns a store whose pool, and listener, reach the test
// database through a freezer, with Listen's check and ping as given. It
// skips t if the database is reached through a Unix socket.
func proxiedStore(t *testing.T, check, ping time.Duration) (*postgres.Store, *freezer) {
	t.Helper()
	cfg := testConfig(t)
	if strings.HasPrefix(cfg.ConnConfig.Host, "/") {
		t.Skip("the test database is reached through a Unix socket; this test proxies TCP")
	}
	px := newFreezer(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = px.host, px.port, nil
	cfg.MinConns = 0
	return storeOver(t, cfg, postgres.WithListenCheck(check, ping)), px
}

// freezer is a TCP proxy to addr whose connections can be frozen: they
// stay open, and what is sent on them is dropped, as on a connection to
// a server gone behind a network partition. Connections made after a
// freeze pass.
type freezer struct {
	host string
	port uint16

	carried            atomic.Int64 // reads passed on
	frozenFromTheStart atomic.Bool  // connections made from now on are frozen at once

	ln     net.Listener
	mu     sync.Mutex
	conns  map[net.Conn]*atomic.Bool // each client's frozen flag
	closed bool
	wg     sync.WaitGroup
}

func newFreezer(t *testing.T, addr string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().(*net.TCPAddr)
	f := &freezer{host: a.IP.String(), port: uint16(a.Port), ln: ln, conns: map[net.Conn]*atomic.Bool{}}
	f.wg.Go(func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", addr)
			if err != nil {
				client.Close()
				continue
			}
			frozen := new(atomic.Bool)
			frozen.Store(f.frozenFromTheStart.Load())
			f.mu.Lock()
			if f.closed {
				f.mu.Unlock()
				client.Close()
				server.Close()
				return
			}
			f.conns[client], f.conns[server] = frozen, frozen
			f.mu.Unlock()
			f.wg.Go(func() { f.pipe(client, server, frozen) })
			f.wg.Go(func() { f.pipe(server, client, frozen) })
		}
	})
	t.Cleanup(f.close)
	return f
}

// pipe copies src to dst until either fails, dropping what it reads
// while frozen.
func (f *freezer) pipe(src, dst net.Conn, frozen *atomic.Bool) {
	defer src.Close()
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		if frozen.Load() {
			continue
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
		f.carried.Add(1)
	}
}

// freeze freezes every connection open now.
func (f *freezer) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, frozen := range f.conns {
		frozen.Store(true)
	}
}

// close ends the proxy and its connections, and waits for its goroutines.
func (f *freezer) close() {
	f.mu.Lock()
	f.closed = true
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.ln.Close()
	f.wg.Wait()
}
