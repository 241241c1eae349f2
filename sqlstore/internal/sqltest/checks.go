package sqltest

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
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
		{"Lease/ExpiresByTheDatabaseClock", leaseExpiry},
		{"Lease/LostLeaseRecordsNoLateResult", lostLease},
		{"Delete/ALongHistoryInBatches", deleteLongHistory},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.check(t, newStore(t))
		})
	}
}

// deleteLongHistory checks that DeleteFinished deletes every finished
// record of a history longer than one of its batches, and counts them.
func deleteLongHistory(t *testing.T, s workers.Store) {
	const n = 2500 // two and a half batches
	done := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			rec := workers.Record{ID: fmt.Sprintf("owner::done-%d", i), RunID: "run-1", Watchers: []string{"owner"}, CreatedAt: done,
				State: workers.State{Status: workers.StatusCompleted, StartedAt: done, CompletedAt: done}}
			if err := s.InsertTask(t.Context(), rec); err != nil {
				t.Error(err)
			}
		})
		if i%16 == 15 {
			wg.Wait() // sixteen at a time
		}
	}
	wg.Wait()
	live := workers.Record{ID: "owner::live", RunID: "run-1", CreatedAt: done, State: workers.State{Status: workers.StatusPending}}
	if err := s.InsertTask(t.Context(), live); err != nil {
		t.Fatal(err)
	}
	deleted, err := s.DeleteFinished(t.Context(), done.Add(time.Hour))
	if err != nil || deleted != n {
		t.Fatalf("DeleteFinished = %d, %v; want %d, nil", deleted, err, n)
	}
	left, err := s.ListTasks(t.Context(), workers.Filter{})
	if err != nil || len(left) != 1 || left[0].ID != live.ID {
		t.Errorf("left after DeleteFinished: %d records (%v), want only the live one", len(left), err)
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
// the migrations it knows, and that it accepts versions newer than it
// knows when each was recorded as compatible with its code. fresh returns a
// newly migrated store and a function that runs SQL on its database, in
// which {versions} and {tasks} stand for the store's table names.
func MigrateRefusals[M Migrator](t *testing.T, fresh func(t *testing.T) (M, func(query string) error), tooNew, mismatch error) {
	for _, c := range []struct {
		name, sql string
		want      error
	}{
		{"NewerVersion", `INSERT INTO {versions} (version, name, checksum) VALUES (9999, 'from_the_future', '')`, tooNew},
		// A newer release recorded that this one can use its tables, as
		// during a rollout or after a rollback: Migrate goes on.
		{"NewerCompatibleVersions", `INSERT INTO {versions} (version, name, checksum, compatible_from) VALUES (9998, 'adds_a_function', '', 1), (9999, 'adds_an_index', '', 2)`, nil},
		{"NewerVersionUsableByTheNewestKnown", `INSERT INTO {versions} (version, name, checksum, compatible_from) SELECT 9999, 'adds_an_index', '', max(version) FROM {versions}`, nil},
		{"NewerVersionNeedingNewerCode", `INSERT INTO {versions} (version, name, checksum, compatible_from) SELECT 9999, 'from_the_future', '', max(version) + 1 FROM {versions}`, tooNew},
		{"NewerVersionsOneNeedingNewerCode", `INSERT INTO {versions} (version, name, checksum, compatible_from) VALUES (9998, 'from_the_future', '', NULL), (9999, 'adds_an_index', '', 1)`, tooNew},
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
	// A version table from before checksums, or compatibility, were
	// kept gains the column, and what is then recorded in it is read: an
	// edited file's checksum refused, a compatible version accepted.
	for _, c := range []struct {
		column, then string
		want         error
	}{
		{"checksum", `UPDATE {versions} SET checksum = 'edited' WHERE version = 1`, mismatch},
		{"compatible_from", `INSERT INTO {versions} (version, name, checksum, compatible_from) VALUES (9999, 'adds_an_index', '', 1)`, nil},
	} {
		t.Run("ColumnAddedToOlderTables/"+c.column, func(t *testing.T) {
			t.Parallel()
			s, exec := fresh(t)
			if err := exec(`ALTER TABLE {versions} DROP COLUMN ` + c.column); err != nil {
				t.Fatal(err)
			}
			if err := s.Migrate(t.Context()); err != nil {
				t.Fatalf("Migrate over a version table without %s: %v", c.column, err)
			}
			if err := exec(c.then); err != nil {
				t.Fatal(err)
			}
			if err := s.Migrate(t.Context()); !errors.Is(err, c.want) {
				t.Fatalf("Migrate then = %v, want %v", err, c.want)
			}
		})
	}
}

// leaseExpiry checks the Leaser of a SQL store: a lease's expiry is
// computed by the database from the ttl alone (no caller's time is sent),
// a lease is live until then and not after, a renewal reports whether it
// extended a live lease, and a released lease is gone at once.
func leaseExpiry(t *testing.T, s workers.Store) {
	l, ok := s.(workers.Leaser)
	if !ok {
		t.Fatalf("%T is not a workers.Leaser", s)
	}
	ctx := t.Context()
	live := func(instance string) bool {
		t.Helper()
		ids, err := l.LiveInstances(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			if id == instance {
				return true
			}
		}
		return false
	}
	renew := func(instance string, ttl time.Duration, want bool) {
		t.Helper()
		extended, err := l.RenewLease(ctx, instance, ttl)
		if err != nil {
			t.Fatal(err)
		}
		if extended != want {
			t.Fatalf("RenewLease(%s) extended = %v, want %v", instance, extended, want)
		}
	}
	for _, ttl := range []time.Duration{0, -time.Second} {
		if _, err := l.RenewLease(ctx, "a", ttl); !errors.Is(err, workers.ErrInvalidOption) {
			t.Fatalf("RenewLease with ttl %v = %v, want ErrInvalidOption", ttl, err)
		}
	}
	const ttl = 300 * time.Millisecond
	start := time.Now()
	renew("a", ttl, false)
	renew("a", ttl, true)
	renew("b", time.Hour, false)
	if !live("a") || !live("b") {
		t.Fatal("fresh leases are not live")
	}
	// Poll until a's lease expires: never sooner than ttl after it was
	// taken (the clocks run at one rate, whichever computes it), and soon
	// after.
	deadline := start.Add(ttl + 10*time.Second)
	for live("a") {
		if time.Now().After(deadline) {
			t.Fatalf("a lease of %v still live after %v", ttl, time.Since(start))
		}
		waitTick(ctx)
	}
	if d := time.Since(start); d < ttl-10*time.Millisecond {
		t.Fatalf("a lease of %v expired after %v", ttl, d)
	}
	if !live("b") {
		t.Fatal("another instance's lease expired with it")
	}
	renew("a", ttl, false) // expired: a new lease
	renew("a", time.Hour, true)
	if err := l.ReleaseLease(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if live("a") {
		t.Fatal("a released lease is live")
	}
	renew("a", time.Hour, false)
	if err := l.ReleaseLease(ctx, "never-leased"); err != nil {
		t.Fatalf("ReleaseLease of no lease = %v", err)
	}
}

// waitTick waits a few milliseconds between polls.
func waitTick(ctx context.Context) {
	tick := time.NewTimer(5 * time.Millisecond)
	defer tick.Stop()
	select {
	case <-ctx.Done():
	case <-tick.C:
	}
}

// lostLease checks, over the store, a runtime whose lease renewals stall
// with no peer to recover its run: once it finds its lease lost it
// cancels the run with ErrAbandoned, and the result the callback returns
// afterwards is not recorded: the record ends FAILED as abandoned, and
// stays so.
func lostLease(t *testing.T, s workers.Store) {
	ctx := t.Context()
	g := leased(s)
	// A lease of a second, as the replicas' stall tests have: one of a
	// tenth of a second could run out on a busy machine before the
	// callback starts, and its run would then never start.
	rt := workers.NewRuntime[workers.Store](g, workers.Config{LeaseInterval: stallInterval, LeaseTTL: stallTTL})
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		if err := rt.Shutdown(sctx); err != nil {
			t.Error(err)
		}
	}()
	if err := rt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	alice := workers.MustOwner("alice")
	started, cause := make(chan struct{}), make(chan error, 1)
	sub, err := rt.Submit(ctx, "stalled", func(ctx context.Context, _ *workers.Task) (any, error) {
		close(started)
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return "a late result", nil // as a callback that ignores its context would
	}, alice)
	if err != nil {
		t.Fatal(err)
	}
	recv(t, started, "the callback starting")
	resume := g.stallRenewals()
	if err := recv(t, cause, "the callback's cancellation"); !errors.Is(err, workers.ErrAbandoned) {
		t.Errorf("the callback was cancelled with %v, want ErrAbandoned", err)
	}
	wctx, cancel := context.WithTimeout(ctx, waitLimit)
	defer cancel()
	snap, err := rt.Wait(wctx, sub.ID, alice)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Status != workers.StatusFailed || snap.Cause != workers.CauseAbandoned {
		t.Errorf("a run cancelled for a lost lease recorded %s %q (cause %s), want FAILED, abandoned", snap.Status, snap.Error, snap.Cause)
	}
	resume()
}

// MigrationFiles counts the migration files of the calling test's package
// (its migrations directory): Migrate records each version once, whether
// or not the numbers leave gaps.
func MigrationFiles(t *testing.T) int {
	t.Helper()
	files, err := filepath.Glob("migrations/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("no migration files: %v", err)
	}
	return len(files)
}

// Unmigrated checks that a runtime over s, a store whose Migrate has not
// run, answers Start, Status and List with an error that says to call
// Migrate, instead of leaving the caller with the database's "no such
// table" alone.
func Unmigrated(t *testing.T, s workers.Store) {
	t.Helper()
	alice := workers.MustOwner("alice")
	rt := workers.NewRuntime(s, workers.Config{})
	t.Cleanup(func() { rt.Shutdown(context.Background()) })
	_, statusErr := rt.Status(t.Context(), "alice::report", alice)
	_, listErr := rt.List(t.Context(), alice)
	for name, err := range map[string]error{
		"Start":  rt.Start(t.Context()),
		"Status": statusErr,
		"List":   listErr,
	} {
		if err == nil || !strings.Contains(err.Error(), "call Migrate") {
			t.Errorf("%s before Migrate = %v, want an error that says to call Migrate", name, err)
		}
	}
}
