package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// aheadStore is a replica's store whose clock is d ahead of the other
// replica's: the store keeps the times the runtime hands it (CreatedAt,
// StartedAt, CompletedAt), read on the replica's clock, so they are
// shifted by d. Leases are on the database's clock, as designed.
type aheadStore struct {
	*postgres.Store
	d time.Duration
}

func (s *aheadStore) shift(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.Add(s.d)
}

func (s *aheadStore) InsertTask(ctx context.Context, rec workers.Record) error {
	rec.CreatedAt, rec.StartedAt, rec.CompletedAt = s.shift(rec.CreatedAt), s.shift(rec.StartedAt), s.shift(rec.CompletedAt)
	return s.Store.InsertTask(ctx, rec)
}

func (s *aheadStore) ReplaceTask(ctx context.Context, rec workers.Record, prev string) error {
	rec.CreatedAt, rec.StartedAt, rec.CompletedAt = s.shift(rec.CreatedAt), s.shift(rec.StartedAt), s.shift(rec.CompletedAt)
	return s.Store.ReplaceTask(ctx, rec, prev)
}

func (s *aheadStore) TransitionTask(ctx context.Context, id, runID string, from []workers.Status, next workers.State) (bool, error) {
	if cur, err := s.Store.GetTask(ctx, id); err == nil && !cur.StartedAt.Equal(next.StartedAt) {
		next.StartedAt = s.shift(next.StartedAt)
	}
	next.CompletedAt = s.shift(next.CompletedAt)
	return s.Store.TransitionTask(ctx, id, runID, from, next)
}

// Replica A's clock is 10 s ahead of replica B's. B cancels A's run: the
// record says it completed 10 s before it started, and B's observer
// hears a negative Duration.
func TestClockSkewCancelAcrossReplicasEndsBeforeStart(t *testing.T) {
	testDSN(t)
	t.Parallel()
	sc := newScratchT(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ends := make(chan workers.Event, 8)
	obs := workers.ObserverFunc(func(_ context.Context, e workers.Event) {
		if e.Kind == workers.EventFinished {
			ends <- e
		}
	})
	a := workers.NewRuntime(&aheadStore{sc.store(t), 10 * time.Second}, workers.Config{})
	b := workers.NewRuntime(sc.store(t), workers.Config{Observers: []workers.Observer{obs}})
	defer func() {
		for _, rt := range []interface{ Shutdown(context.Context) error }{a, b} {
			if err := rt.Shutdown(ctx); err != nil {
				t.Error(err)
			}
		}
	}()
	alice := workers.MustOwner("alice")
	started := make(chan struct{})
	sub, err := a.Submit(ctx, "long", func(ctx context.Context, _ *workers.Task) (any, error) {
		close(started)
		<-ctx.Done()
		return nil, context.Cause(ctx)
	}, alice)
	if err != nil {
		t.Fatal(err)
	}
	<-started
	if err := b.Cancel(ctx, sub.ID, alice); err != nil {
		t.Fatal(err)
	}
	snap, err := b.Status(ctx, sub.ID, alice)
	if err != nil {
		t.Fatal(err)
	}
	if snap.CompletedAt.Before(snap.StartedAt) {
		t.Errorf("the record completed at %v, %v before it started at %v", snap.CompletedAt, snap.StartedAt.Sub(snap.CompletedAt), snap.StartedAt)
	}
	if e := <-ends; e.Duration < 0 {
		t.Errorf("B's observer heard run %s end with Duration %v", e.RunID, e.Duration)
	}
}
