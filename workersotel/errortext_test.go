package workersotel_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/workersotel"
)

// nilPtrError is an error whose Error method reads its receiver: a nil
// *nilPtrError returned as an error panics when its text is asked for.
type nilPtrError struct{ msg string }

func (e *nilPtrError) Error() string { return e.msg }

// A callback that fails with an error whose Error method panics (a typed
// nil pointer, the classic slip) fails its run like any other: the
// runtime records the panic's text. Its span still ends, FAILED and
// described by that text, and its retry and its end are recorded.
func TestAnErrorWhoseTextPanicsEndsItsSpan(t *testing.T) {
	f := setupOver(t, workers.NewMemStore(), func(inst *workersotel.Instrumentation) workers.Config {
		return workers.Config{
			Middleware: []workers.Middleware{inst.Middleware()},
			Observers:  []workers.Observer{inst.Observer()},
			Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		}
	})
	sub, err := f.rt.Submit(context.Background(), "k", func(context.Context, *workers.Task) (any, error) {
		var e *nilPtrError
		return nil, e
	}, workers.MustOwner("alice"), workers.WithRetry(workers.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Microsecond}))
	if err != nil {
		t.Fatal(err)
	}
	snap := f.wait(t, sub.ID)
	if snap.Status != workers.StatusFailed {
		t.Fatalf("status %s, want failed", snap.Status)
	}
	sp := f.span(t, sub.RunID)
	if sp.Status().Code != codes.Error || sp.Status().Description != snap.Error {
		t.Errorf("span status %v %q, want Error described as the record is, %q", sp.Status().Code, sp.Status().Description, snap.Error)
	}
	if n := events(sp, "retry"); n != 1 {
		t.Errorf("%d retry events, want 1", n)
	}
	if n := events(sp, "exception"); n != 1 {
		t.Errorf("%d exception events, want 1", n)
	}
	sums, _ := f.metrics(t)
	if sums["workers.tasks.running"] != 0 || sums["workers.tasks.finished/failed"] != 1 {
		t.Errorf("running %d, finished failed %d; want 0, 1", sums["workers.tasks.running"], sums["workers.tasks.finished/failed"])
	}
}
