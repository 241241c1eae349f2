package workers_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/storetest"
)

// logRecorder is a slog.Handler that keeps every record logged, at every
// level, with its attributes.
type logRecorder struct {
	mu   *sync.Mutex
	recs *[]slog.Record
}

func newLogRecorder() logRecorder {
	return logRecorder{mu: new(sync.Mutex), recs: new([]slog.Record)}
}

func (h logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h logRecorder) WithGroup(string) slog.Handler            { return h }

func (h logRecorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.recs = append(*h.recs, r.Clone())
	return nil
}

// records returns the records logged so far.
func (h logRecorder) records() []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(*h.recs)
}

// messages returns the messages of recs.
func messages(recs []slog.Record) []string {
	var msgs []string
	for _, r := range recs {
		msgs = append(msgs, r.Message)
	}
	return msgs
}

// attrOf returns the attribute key of r, resolved.
func attrOf(r slog.Record, key string) (v slog.Value, ok bool) {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v, ok = a.Value.Resolve(), true
			return false
		}
		return true
	})
	return v, ok
}

// assertEachWrittenOrUnwritten checks that each item of backlog, left
// by a Shutdown that returned se, was either recorded CANCELLED in mem or
// counted among se's unwritten records.
func assertEachWrittenOrUnwritten(t *testing.T, mem *workers.MemStore, backlog []workers.Submission, se *workers.ShutdownError) {
	t.Helper()
	written := 0
	for _, sub := range backlog {
		r, err := mem.GetTask(context.Background(), sub.ID)
		require.NoError(t, err)
		if r.Status == workers.StatusCancelled {
			written++
		}
	}
	assert.Equal(t, len(backlog), written+se.Unwritten, "each item is written or counted unwritten")
}

// backlogBehindAHead submits to queue "q" of rt a head that runs until its
// context ends and n items behind it, waits until the head runs, and
// returns the items' submissions.
func backlogBehindAHead[S workers.Store](t *testing.T, rt *workers.Runtime[S], n int) []workers.Submission {
	t.Helper()
	_, err := rt.SubmitSequential(context.Background(), "q", "head", func(ctx context.Context, _ *workers.Task) (any, error) {
		<-ctx.Done()
		return nil, context.Cause(ctx)
	}, owner)
	require.NoError(t, err)
	backlog := make([]workers.Submission, 0, n)
	for i := range n {
		sub, err := rt.SubmitSequential(context.Background(), "q", fmt.Sprint("item-", i), result(i), owner)
		require.NoError(t, err)
		backlog = append(backlog, sub)
	}
	synctest.Wait()
	return backlog
}

// assertCutoffSummary asserts that r is the one line that sums up the
// writes given up at a cutoff: how many (want), the first few ids, each
// one of ids, and the error that names them all.
func assertCutoffSummary(t *testing.T, r slog.Record, want int, ids []string, names string) {
	t.Helper()
	assert.Equal(t, slog.LevelError, r.Level)
	assert.Contains(t, r.Message, names, "the line says where every id is named")
	n, ok := attrOf(r, "writes")
	require.True(t, ok, "the line counts the writes given up")
	assert.EqualValues(t, want, n.Int64(), "writes given up")
	tasks, ok := attrOf(r, "tasks")
	require.True(t, ok, "the line names a few of them")
	shown, _ := tasks.Any().([]string)
	assert.Len(t, shown, min(want, 5), "ids shown: %v", shown)
	for _, id := range shown {
		assert.Contains(t, ids, id, "an id shown is one given up")
	}
	ops, ok := attrOf(r, "ops")
	require.True(t, ok, "the line counts the writes given up by kind")
	require.Equal(t, slog.KindGroup, ops.Kind())
	total := int64(0)
	for _, a := range ops.Group() {
		total += a.Value.Int64()
	}
	assert.EqualValues(t, want, total, "the writes given up, by kind: %v", ops)
}

// A Shutdown whose ctx ends with a long queue backlog gives up the
// writes it could not make at its cutoff, and logs them in one line, not
// one each: how many, a few ids, and that its ShutdownError names them
// all. A write that failed for a reason of its own before the cutoff
// still logs its own line.
func TestFaultShutdownLogsTheWritesItGaveUpAtItsCutoffInOneLine(t *testing.T) {
	for _, fault := range []storetest.Fault{storetest.Delay, storetest.FailBefore} {
		t.Run(fault.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				logs := newLogRecorder()
				f := &storetest.Faults{}
				mem := workers.NewMemStore()
				rt := workers.NewRuntime(storetest.Faulty(mem, f), workers.Config{Logger: slog.New(logs)})
				abandons := func(c *storetest.Call) bool {
					return c.Next.Cause == workers.CauseShutdown && slices.Equal(c.From, []workers.Status{workers.StatusPending})
				}
				const failed = 16 // the first write of each abandon writer
				if fault == storetest.FailBefore {
					f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Fault: fault, Times: failed, Match: abandons})
				}
				f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Fault: storetest.Delay, Delay: 10 * time.Millisecond, Match: abandons})
				backlog := backlogBehindAHead(t, rt, 2000)
				before := len(logs.records())

				ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
				defer cancel()
				err := rt.Shutdown(ctx)
				require.ErrorIs(t, err, context.DeadlineExceeded)
				var se *workers.ShutdownError
				require.ErrorAs(t, err, &se)
				require.Greater(t, se.Unwritten, 1000, "most of the backlog is left: %v", err)
				assert.Zero(t, se.Executing, "%v", err)
				synctest.Wait()

				recs := logs.records()[before:]
				var retried, summaries []slog.Record
				for _, r := range recs {
					switch {
					case strings.Contains(r.Message, "retrying"):
						retried = append(retried, r)
					case strings.Contains(r.Message, "cutoff"):
						summaries = append(summaries, r)
					}
				}
				wantRetried := 0
				if fault == storetest.FailBefore {
					wantRetried = failed // each failed try logs its own line
				}
				assert.Equal(t, wantRetried, len(retried), "lines of writes that failed on their own")
				assert.Equal(t, wantRetried+1, len(recs), "Shutdown logged %d lines: %q", len(recs), messages(recs[:min(len(recs), 5)]))
				if assert.Equal(t, 1, len(summaries), "one line sums up the writes given up at the cutoff") {
					assertCutoffSummary(t, summaries[0], se.Unwritten, se.UnwrittenIDs, "ShutdownError")
				}

				assertEachWrittenOrUnwritten(t, mem, backlog, se)
			})
		})
	}
}

// A Reset whose ctx ends before the writes of a long queue backlog are
// made gives them up and logs them in one line, as Shutdown does, and
// the next Shutdown names them all.
func TestFaultResetLogsTheWritesItGaveUpInOneLine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := newLogRecorder()
		f := &storetest.Faults{}
		// A store without RecordClearer, so that the records stay.
		s := struct{ workers.Store }{workers.NewMemStore()}
		rt := workers.NewRuntime(storetest.Faulty(s, f), workers.Config{Logger: slog.New(logs)})
		f.Add(storetest.Rule{Op: storetest.OpTransitionTask, Fault: storetest.Delay, Delay: 10 * time.Millisecond, Match: func(c *storetest.Call) bool {
			return c.Next.Cause == workers.CauseShutdown && slices.Equal(c.From, []workers.Status{workers.StatusPending})
		}})
		backlogBehindAHead(t, rt, 2000)
		before := len(logs.records())

		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, rt.Reset(ctx), context.DeadlineExceeded)
		recs := logs.records()[before:]
		assert.Equal(t, 1, len(recs), "Reset logged %d lines: %q", len(recs), messages(recs[:min(len(recs), 5)]))

		err := rt.Shutdown(context.Background())
		var se *workers.ShutdownError
		require.ErrorAs(t, err, &se)
		require.Greater(t, se.Unwritten, 1000, "most of the backlog is left: %v", err)
		if len(recs) == 1 {
			assertCutoffSummary(t, recs[0], se.Unwritten, se.UnwrittenIDs, "ShutdownError")
		}
	})
}
