package postgres_test

import (
	"context"
	"errors"
	"iter"
	"testing"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// readSignal is a store that says when a read begins: a GetTask of task
// id, or a ListTasks.
type readSignal struct {
	*postgres.Store
	id   string
	read chan struct{} // signalled (without blocking) as such a read begins
}

func (s *readSignal) signal() {
	select {
	case s.read <- struct{}{}:
	default:
	}
}

func (s *readSignal) GetTask(ctx context.Context, id string) (workers.Record, error) {
	if id == s.id {
		s.signal()
	}
	return s.Store.GetTask(ctx, id)
}

func (s *readSignal) ListTasks(ctx context.Context, f workers.Filter) ([]workers.Record, error) {
	s.signal()
	return s.Store.ListTasks(ctx, f)
}

// A stream (Watch, Subscribe) ends with ErrClosed once the runtime's
// Shutdown has returned, as their docs say, even when the store read it
// is making then hangs: a stream (an SSE response, say) must not outlive
// the runtime for as long as the database does not answer.
func TestAStreamEndsWithErrClosedAfterShutdownWhileTheDatabaseHangs(t *testing.T) {
	testDSN(t)
	for _, c := range []struct {
		name   string
		stream func(rt *workers.Runtime[*readSignal], ctx context.Context, id string, auth workers.TaskAuthority) iter.Seq2[workers.Snapshot, error]
	}{
		{"Watch", func(rt *workers.Runtime[*readSignal], ctx context.Context, id string, auth workers.TaskAuthority) iter.Seq2[workers.Snapshot, error] {
			return rt.Watch(ctx, id, auth)
		}},
		{"Subscribe", func(rt *workers.Runtime[*readSignal], ctx context.Context, _ string, auth workers.TaskAuthority) iter.Seq2[workers.Snapshot, error] {
			return rt.Subscribe(ctx, auth)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ps, px := hungStore(t)
			alice := workers.MustOwner("alice")
			id, err := workers.ScopedTaskKey("watched", alice)
			if err != nil {
				t.Fatal(err)
			}
			s := &readSignal{Store: ps, id: id, read: make(chan struct{}, 1)}
			// No loop of the runtime's reads meanwhile.
			rt := workers.NewRuntime(s, workers.Config{SyncInterval: time.Hour, ProgressInterval: -1,
				LeaseInterval: time.Minute, RecoverInterval: time.Hour})
			if err := rt.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			release := make(chan struct{})
			defer close(release)
			if _, err := rt.Submit(t.Context(), "watched", func(ctx context.Context, _ *workers.Task) (any, error) {
				select {
				case <-release:
				case <-ctx.Done():
				}
				return nil, context.Cause(ctx)
			}, alice); err != nil {
				t.Fatal(err)
			}
			px.hang()
			select {
			case <-s.read: // a read before the hang
			default:
			}

			streamCtx, stop := context.WithCancel(context.Background())
			defer stop()
			ended := make(chan error, 1)
			go func() {
				var last error
				for _, err := range c.stream(rt, streamCtx, id, alice) {
					last = err
				}
				ended <- last
			}()
			select {
			case <-s.read: // the stream's first read, which the database does not answer
			case <-time.After(10 * time.Second):
				t.Fatal("the stream made no read")
			}

			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			_ = rt.Shutdown(ctx)
			select {
			case err := <-ended:
				if !errors.Is(err, workers.ErrClosed) {
					t.Errorf("the stream ended with %v, want ErrClosed", err)
				}
			case <-time.After(5 * time.Second):
				t.Errorf("the stream had not ended 5s after Shutdown returned: it waits for the hung database")
				stop()
				<-ended
			}
		})
	}
}
