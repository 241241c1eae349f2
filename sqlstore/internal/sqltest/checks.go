package sqltest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/taskgate/workers"
)

// Run runs the checks the SQL stores add to the conformance suite, each
// as a parallel subtest with a store of its own from newStore: they hold
// the SQL stores to more than the Store contract asks.
func Run(t *testing.T, newStore func(t *testing.T) workers.Store) {
	for _, c := range []struct {
		name  string
		check func(*testing.T, workers.Store)
	}{
		{"Times/ReturnedInUTC", timesUTC},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.check(t, newStore(t))
		})
	}
}

// timesUTC checks that times come back in UTC, to the microsecond.
func timesUTC(t *testing.T, s workers.Store) {
	at := time.Date(2025, 6, 1, 12, 30, 0, 123456000, time.FixedZone("CEST", 2*3600))
	rec := workers.Record{ID: "owner::utc", RunID: "run-1", CreatedAt: at,
		State: workers.State{Status: workers.StatusCompleted, StartedAt: at, CompletedAt: at}}
	if err := s.InsertTask(t.Context(), rec); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetTask(t.Context(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, tm := range []time.Time{got.CreatedAt, got.StartedAt, got.CompletedAt} {
		if !tm.Equal(at) || tm.Location() != time.UTC {
			t.Errorf("stored %v, got back %v; want the same instant in UTC", at, tm)
		}
	}
}

func now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

// Migrator is a store with a Migrate method, as both SQL stores have.
type Migrator interface {
	Migrate(ctx context.Context) error
}

// MigrateConcurrently runs Migrate twice on each of stores at once, as
// several processes starting together would, failing t on any error. The
// caller then checks that the schema was migrated exactly once.
func MigrateConcurrently[M Migrator](t *testing.T, stores []M) {
	var wg sync.WaitGroup
	for _, s := range stores {
		wg.Go(func() {
			for range 2 {
				if err := s.Migrate(t.Context()); err != nil {
					t.Errorf("Migrate: %v", err)
				}
			}
		})
	}
	wg.Wait()
}

// MigrateRefusals checks that Migrate refuses tables that do not match
// the migrations it knows, and changes nothing then. fresh returns a
// newly migrated store and a function that runs SQL on its database, in
// which {versions} and {tasks} stand for the store's table names.
func MigrateRefusals[M Migrator](t *testing.T, fresh func(t *testing.T) (M, func(query string) error), tooNew, mismatch error) {
	for _, c := range []struct {
		name, sql string
		want      error
	}{
		{"NewerVersion", `INSERT INTO {versions} (version, name, checksum) VALUES (9999, 'from_the_future', '')`, tooNew},
		{"EditedMigration", `UPDATE {versions} SET checksum = 'edited' WHERE version = 1`, mismatch},
		{"UnknownVersion", `DELETE FROM {versions} WHERE version = 1; INSERT INTO {versions} (version, name, checksum) VALUES (1, 'init', 'x')`, mismatch},
		{"MissingColumn", `ALTER TABLE {tasks} DROP COLUMN stack`, mismatch},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s, exec := fresh(t)
			if err := exec(c.sql); err != nil {
				t.Fatal(err)
			}
			if err := s.Migrate(t.Context()); !errors.Is(err, c.want) {
				t.Fatalf("Migrate = %v, want %v", err, c.want)
			}
		})
	}
	// A version table from before checksums were kept is upgraded, and
	// the checksums it gains are then enforced.
	t.Run("ChecksumsAddedToOlderTables", func(t *testing.T) {
		t.Parallel()
		s, exec := fresh(t)
		if err := exec(`ALTER TABLE {versions} DROP COLUMN checksum`); err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(t.Context()); err != nil {
			t.Fatalf("Migrate over a version table without checksums: %v", err)
		}
		if err := exec(`UPDATE {versions} SET checksum = 'edited' WHERE version = 1`); err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(t.Context()); !errors.Is(err, mismatch) {
			t.Fatalf("Migrate after an edit = %v, want %v", err, mismatch)
		}
	})
}
