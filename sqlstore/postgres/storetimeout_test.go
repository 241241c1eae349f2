package postgres_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/taskgate/workers"
)

// lockedBuffer is a bytes.Buffer that a logger and a test share.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A run's outcome write that the database does not answer (here it waits
// on a row lock that another transaction holds) is cut off after
// Config.StoreTimeout, through the group commit and the driver, and tried
// again; once the lock is released, a try lands and the run completes.
func TestARunWriteTheDatabaseDoesNotAnswerIsCutOff(t *testing.T) {
	testDSN(t)
	t.Parallel()
	sc := newScratchT(t)
	s := sc.store(t)
	logs := &lockedBuffer{}
	rt := workers.NewRuntime(s, workers.Config{StoreTimeout: 200 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	defer func() {
		if err := rt.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	}()

	proceed := make(chan struct{})
	sub, err := rt.Submit(ctx, "stuck", func(context.Context, *workers.Task) (any, error) {
		<-proceed
		return "done", nil
	}, workers.MustOwner("alice"))
	if err != nil {
		t.Fatal(err)
	}
	tx := holdRow(t, sc, sub.ID)
	close(proceed)
	// Each try cut off has its statement cancelled by the driver, which
	// sends the cancel request as the next try begins: the tries, each a
	// statement of its own, wait on the lock one at a time, or two for
	// the moment the cancel takes to land. Tries never cancelled would
	// pile up.
	tries := map[string]bool{}
	waitFor(t, func() bool {
		rows, err := sc.pool.Query(ctx, `SELECT pid::text || '@' || query_start::text FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`, sc.schema)
		if err != nil {
			t.Fatal(err)
		}
		waiting, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if len(waiting) > 2 {
			t.Fatalf("%d statements wait on the lock at once: the tries cut off were not cancelled", len(waiting))
		}
		for _, w := range waiting {
			tries[w] = true
		}
		return len(tries) >= 4
	})
	if !strings.Contains(logs.String(), "did not answer within StoreTimeout") {
		t.Errorf("the log does not name the bound:\n%s", logs)
	}
	if snap, err := rt.Status(ctx, sub.ID, workers.MustOwner("alice")); err != nil || snap.Status != workers.StatusRunning {
		t.Fatalf("while the lock is held the record stays RUNNING: got %v, %v", snap.Status, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	snap, err := rt.Wait(ctx, sub.ID, workers.MustOwner("alice"))
	if err != nil {
		t.Fatal(err)
	}
	if snap.Status != workers.StatusCompleted {
		t.Fatalf("status %s, want completed", snap.Status)
	}
}
