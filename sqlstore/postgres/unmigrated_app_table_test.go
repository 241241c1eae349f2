package postgres_test

import (
	"context"
	"strings"
	"testing"

	"github.com/taskgate/workers"
)

// A migrated store whose write fails on a table of the application's own
// (a trigger the application put on the store's table names a table it
// dropped since) does not say to call Migrate: the store's tables are
// there and current, and Migrate would change nothing.
func TestAnApplicationTableMissingDoesNotSayToMigrate(t *testing.T) {
	sc := newScratchT(t)
	s := sc.store(t)
	schema := `"` + sc.schema + `".`
	for _, q := range []string{
		`CREATE TABLE ` + schema + `audit (task_id text)`,
		`CREATE FUNCTION ` + schema + `audit_task() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO ` + schema + `audit VALUES (NEW.id); RETURN NEW; END $$`,
		`CREATE TRIGGER audit_task AFTER INSERT ON ` + schema + `"workers_tasks" FOR EACH ROW EXECUTE FUNCTION ` + schema + `audit_task()`,
		`DROP TABLE ` + schema + `audit`,
	} {
		if _, err := sc.pool.Exec(t.Context(), q); err != nil {
			t.Fatal(err)
		}
	}
	rt := workers.NewRuntime(s, workers.Config{})
	t.Cleanup(func() { rt.Shutdown(context.Background()) })
	_, err := rt.Submit(t.Context(), "report", func(context.Context, *workers.Task) (any, error) { return nil, nil }, workers.MustOwner("alice"))
	if err == nil {
		t.Fatal("Submit succeeded over a trigger that names a dropped table")
	}
	if !strings.Contains(err.Error(), "audit") {
		t.Errorf("Submit = %v, want the database's error, naming the table", err)
	}
	if strings.Contains(err.Error(), "Migrate") {
		t.Errorf("Submit = %v, want an error that does not say to call Migrate", err)
	}
}
