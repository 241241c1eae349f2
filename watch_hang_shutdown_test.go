package workers_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/taskgate/workers"
)

// hungReads is a MemStore whose reads hang, once hung is set, until their
// context ends, as reads on a database that stopped answering do. reading
// is signalled as such a read begins.
type hungReads struct {
	*workers.MemStore
	hung    atomic.Bool
	reading chan struct{}
}

func (s *hungReads) hang(ctx context.Context) error {
	if !s.hung.Load() {
		return nil
	}
	select {
	case s.reading <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return ctx.Err()
}

func (s *hungReads) GetTask(ctx context.Context, id string) (workers.Record, error) {
	if err := s.hang(ctx); err != nil {
		return workers.Record{}, err
	}
	return s.MemStore.GetTask(ctx, id)
}

func (s *hungReads) ListTasks(ctx context.Context, f workers.Filter) ([]workers.Record, error) {
	if err := s.hang(ctx); err != nil {
		return nil, err
	}
	return s.MemStore.ListTasks(ctx, f)
}

// Watch and Subscribe end with ErrClosed once Shutdown has returned, as
// their docs say, even when a store read of theirs hangs then: a stream
// (an SSE response) must not outlive the runtime for as long as the
// store does not answer.
func TestStreamsEndWithErrClosedAfterShutdownWhileTheirReadHangs(t *testing.T) {
	for _, name := range []string{"Watch", "Subscribe"} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := &hungReads{MemStore: workers.NewMemStore(), reading: make(chan struct{}, 1)}
				rt := workers.NewRuntime(s, workers.Config{Logger: quiet})
				alice := workers.MustOwner("alice")
				release := make(chan struct{})
				sub, err := rt.Submit(t.Context(), "watched", func(ctx context.Context, _ *workers.Task) (any, error) {
					select {
					case <-release:
					case <-ctx.Done():
					}
					return nil, context.Cause(ctx)
				}, alice)
				if err != nil {
					t.Fatal(err)
				}
				synctest.Wait()
				s.hung.Store(true)

				streamCtx, stop := context.WithCancel(context.Background())
				defer stop()
				ended := make(chan error, 1)
				go func() {
					var last error
					stream := rt.Watch(streamCtx, sub.ID, alice)
					if name == "Subscribe" {
						stream = rt.Subscribe(streamCtx, alice)
					}
					for _, err := range stream {
						last = err
					}
					ended <- last
				}()
				<-s.reading // the stream's read, which hangs

				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				_ = rt.Shutdown(ctx)
				time.Sleep(time.Minute) // a minute after Shutdown returned
				synctest.Wait()
				select {
				case err := <-ended:
					if !errors.Is(err, workers.ErrClosed) {
						t.Errorf("the %s ended with %v, want ErrClosed", name, err)
					}
				default:
					t.Errorf("a minute after Shutdown returned, the %s still waits for its hung store read", name)
					stop()
					<-ended
				}
				close(release)
			})
		})
	}
}
