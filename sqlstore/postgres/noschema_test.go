package postgres_test

import (
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// A store whose schema does not exist says so, by name, from Migrate
// and from every other call before it, and Migrate leaves the database
// without that schema: it names the mistake instead of a table it could
// not create or find.
func TestMissingSchemaIsNamed(t *testing.T) {
	sc := newScratchT(t)
	schema := "workers_none_" + strings.ToLower(rand.Text())
	s, err := postgres.New(sc.pool, postgres.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := t.Context()
	check := func(name string, err error) {
		t.Helper()
		if !errors.Is(err, postgres.ErrNoSchema) || !strings.Contains(err.Error(), `"`+schema+`"`) {
			t.Errorf("%s with schema %q missing = %v, want an error wrapping ErrNoSchema that names it", name, schema, err)
		}
	}
	check("Migrate", s.Migrate(ctx))
	var exists bool
	if err := sc.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Errorf("Migrate created schema %q", schema)
	}

	rec := workers.Record{ID: "alice::report", RunID: "r1", State: workers.State{Status: workers.StatusPending}}
	_, getErr := s.GetTask(ctx, "alice::report")
	_, transErr := s.TransitionTask(ctx, "alice::report", "r1", []workers.Status{workers.StatusPending}, workers.State{Status: workers.StatusRunning})
	_, watchErr := s.AddWatcher(ctx, "alice::report", "r1", "bob")
	_, listErr := s.ListTasks(ctx, workers.Filter{Limit: 10})
	_, deleteErr := s.DeleteFinished(ctx, time.Now())
	_, renewErr := s.RenewLease(ctx, "instance", time.Minute)
	_, liveErr := s.LiveInstances(ctx)
	for name, err := range map[string]error{
		"GetTask":        getErr,
		"InsertTask":     s.InsertTask(ctx, rec),
		"SetTask":        s.SetTask(ctx, rec),
		"ReplaceTask":    s.ReplaceTask(ctx, rec, "r0"),
		"TransitionTask": transErr,
		"AddWatcher":     watchErr,
		"ListTasks":      listErr,
		"DeleteFinished": deleteErr,
		"RenewLease":     renewErr,
		"ReleaseLease":   s.ReleaseLease(ctx, "instance"),
		"LiveInstances":  liveErr,
	} {
		check(name, err)
	}

	rt := workers.NewRuntime(s, workers.Config{})
	t.Cleanup(func() { rt.Shutdown(context.Background()) })
	check("Runtime.Start", rt.Start(ctx))
}
