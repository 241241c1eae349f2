package sqlite

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// logBuffer is a slog destination safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A SQLite file that refuses writes while it still answers reads (it is
// full, or read-only) fails a submission with SQLite's own error, which
// wraps ErrUnavailable (it used to wrap no sentinel, which an HTTP
// handler answers 500), never the caller's invalid data, and registers
// nothing: the failed
// submission's run reads that it left no record and writes nothing more.
// A task running meanwhile keeps its outcome, retried until the file
// takes writes again, and lands it once, its callback run once. The
// lease, taken for far longer than the outage, is kept.
func TestWritesRefusedThenAcceptedAgain(t *testing.T) {
	for _, c := range []struct {
		name           string
		refuse, accept string
		fill           bool // refused once the file is full: submit until one fails
		outcomeRefused bool // the running task's outcome write is refused too
	}{
		// max_page_count, set at the file's size, fails whatever needs
		// a new page with SQLITE_FULL, as a full disk does.
		{name: "full", refuse: "PRAGMA max_page_count = %d", accept: "PRAGMA max_page_count = 1073741823", fill: true},
		// query_only refuses every write with SQLITE_READONLY, as a
		// file whose directory or mount went read-only does.
		{name: "read-only", refuse: "PRAGMA query_only = ON", accept: "PRAGMA query_only = OFF", outcomeRefused: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := t.Context()
			s, err := Open(ctx, filepath.Join(t.TempDir(), "tasks.db"))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			logs := &logBuffer{}
			rt := workers.NewRuntime(s, workers.Config{
				Logger:        slog.New(slog.NewTextHandler(logs, nil)),
				LeaseInterval: 50 * time.Millisecond, LeaseTTL: time.Minute,
			})
			if err := rt.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer func() {
				sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := rt.Shutdown(sctx); err != nil {
					t.Errorf("Shutdown: %v", err)
				}
			}()
			release := make(chan struct{})
			var calls atomic.Int32
			running, err := rt.Submit(ctx, "running", func(context.Context, *workers.Task) (any, error) {
				calls.Add(1)
				<-release
				return "done", nil
			}, workers.System)
			if err != nil {
				t.Fatal(err)
			}

			// The write handle's one connection takes the setting.
			refuse := c.refuse
			if strings.Contains(refuse, "%d") {
				var pages int64
				if err := s.write.QueryRowContext(ctx, "PRAGMA page_count").Scan(&pages); err != nil {
					t.Fatal(err)
				}
				refuse = strings.Replace(refuse, "%d", strconv.FormatInt(pages, 10), 1)
			}
			if _, err := s.write.ExecContext(ctx, refuse); err != nil {
				t.Fatal(err)
			}
			var refused error
			var key string
			for i := 0; refused == nil && i < 10000; i++ {
				key = "k" + strconv.Itoa(i)
				_, refused = rt.Submit(ctx, key, func(context.Context, *workers.Task) (any, error) { return nil, nil }, workers.System)
				if !c.fill {
					break
				}
			}
			want := map[string]string{"full": "full", "read-only": "readonly"}[c.name]
			if refused == nil || !strings.Contains(refused.Error(), want) {
				t.Fatalf("Submit to a %s file: %v, want SQLite's refusal", c.name, refused)
			}
			if errors.Is(refused, workers.ErrInvalidData) || !errors.Is(refused, workers.ErrUnavailable) {
				t.Errorf("Submit to a %s file: %v; want ErrUnavailable, for the runtime to retry and an HTTP handler to answer 503, not ErrInvalidData: the data is not at fault", c.name, refused)
			}
			if _, err := rt.Status(ctx, key, workers.System); !errors.Is(err, workers.ErrNotFound) {
				t.Errorf("Status of the refused submission: %v, want ErrNotFound", err)
			}

			close(release)
			if c.outcomeRefused {
				deadline := time.Now().Add(10 * time.Second)
				for !strings.Contains(logs.String(), "task=running") {
					if time.Now().After(deadline) {
						t.Fatalf("the running task's outcome write was never refused; logs:\n%s", logs)
					}
					time.Sleep(time.Millisecond)
				}
				snap, err := rt.Status(ctx, running.ID, workers.System)
				if err != nil || snap.Status != workers.StatusRunning {
					t.Errorf("Status while its outcome is refused: %v, %v; want RUNNING, as the record says", snap.Status, err)
				}
				if _, err := rt.Cleanup(ctx, 0); !errors.Is(err, workers.ErrUnavailable) || errors.Is(err, workers.ErrInvalidData) {
					t.Errorf("Cleanup of a read-only file: %v, want its refusal, ErrUnavailable", err)
				}
			}

			if _, err := s.write.ExecContext(ctx, c.accept); err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			snap, err := rt.Wait(wctx, running.ID, workers.System)
			if err != nil || snap.Status != workers.StatusCompleted || string(snap.Result) != `"done"` {
				t.Fatalf("the running task once writes are accepted: %v %s, %v; want COMPLETED with its result", snap.Status, snap.Result, err)
			}
			if n := calls.Load(); n != 1 {
				t.Errorf("the callback ran %d times, want once", n)
			}
			if err := rt.Ready(ctx); err != nil {
				t.Errorf("Ready: %v", err)
			}
			if strings.Contains(logs.String(), "task="+key+" ") {
				t.Errorf("the refused submission, which left no record, wrote on; logs:\n%s", logs)
			}
		})
	}
}
