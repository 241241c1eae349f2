package sqlcore

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/taskgate/workers"
)

// PageSize is the page size of the paged listings IndexedStatements
// returns: below the records a fixture user sees.
const PageSize = 4

// Statement is one query of a Store with its arguments.
type Statement struct {
	Name string
	SQL  string
	Args []any
	// Page, for a paged listing, is its page size: no step of its plan
	// should handle more rows.
	Page int
}

// IndexedStatements returns the reads whose plans must be index lookups,
// for the dialect packages' plan tests: the status read of id, the listing
// of userID's tasks, the scan for RUNNING records that recovery makes, and
// the cleanup's delete of old terminal records. It is a function rather
// than a method so that it is not promoted into the dialect packages' API.
//
// The paged listings start after after, a record visible to userID in
// the middle of its history, or half a microsecond later, where no stored
// time is; each reads pages of PageSize records.
func IndexedStatements(s *Store, id, userID string, after workers.Position) []Statement {
	list, listArgs := s.listQuery(workers.Filter{VisibleTo: userID})
	running, runningArgs := s.listQuery(workers.Filter{Statuses: []workers.Status{workers.StatusRunning}})
	page := func(name string, f workers.Filter) Statement {
		f.Limit = PageSize
		q, args := s.listQuery(f)
		return Statement{Name: name, SQL: q, Args: args, Page: PageSize}
	}
	done := []workers.Status{workers.StatusCompleted}
	between := workers.Position{CreatedAt: after.CreatedAt.Add(500 * time.Nanosecond), ID: after.ID}
	return []Statement{
		{Name: "get task", SQL: s.q.get, Args: []any{id}},
		{Name: "list visible to user", SQL: list, Args: listArgs},
		{Name: "list running", SQL: running, Args: runningArgs},
		page("page: user's newest", workers.Filter{VisibleTo: userID, Order: workers.NewestFirst}),
		page("page: user's next newest", workers.Filter{VisibleTo: userID, Order: workers.NewestFirst, After: &after}),
		page("page: user's next oldest", workers.Filter{VisibleTo: userID, After: &after}),
		page("page: user's next completed, newest", workers.Filter{VisibleTo: userID, Order: workers.NewestFirst, After: &after, Statuses: done}),
		page("page: user's next newest, between microseconds", workers.Filter{VisibleTo: userID, Order: workers.NewestFirst, After: &between}),
		page("page: user's next oldest, between microseconds", workers.Filter{VisibleTo: userID, After: &between}),
		page("page: all, newest", workers.Filter{Order: workers.NewestFirst}),
		page("page: all, next newest", workers.Filter{Order: workers.NewestFirst, After: &after}),
		{Name: "delete finished", SQL: s.q.deleteFinished, Args: []any{s.time(time.Unix(1e9, 0)),
			string(workers.StatusCompleted), string(workers.StatusFailed), string(workers.StatusCancelled), deleteBatch}},
	}
}

// MigrateTo applies the migrations up to version only, for tests that
// build an older schema and then migrate it forward. It is a function
// rather than a method so that it is not promoted into the dialect
// packages' API.
func MigrateTo(ctx context.Context, s *Store, version int) error { return s.migrate(ctx, version) }

// MigrateAsRelease runs Migrate as a release that knows the migrations
// up to version only would, over whatever the database holds: for tests
// of a rollout, in which a replica of the release before a migration
// starts against tables that a newer replica migrated past it.
func MigrateAsRelease(ctx context.Context, s *Store, version int) error {
	migs, err := loadMigrations(s.d.Migrations, s.d.CompatibleFrom)
	if err != nil {
		return err
	}
	known := slices.DeleteFunc(migs, func(m migration) bool { return m.version > version })
	if len(known) == 0 {
		return fmt.Errorf("no migration up to version %d", version)
	}
	return s.migrateOnce(ctx, known, version)
}

// MigrationLockKey returns the argument of the store's migration lock
// (Dialect.MigrationLock), for tests that hold it as a concurrent
// migration would.
func MigrationLockKey(s *Store) int64 { return s.lockKey() }

// ExecRaw runs q on the write handle with {tasks} and {watchers} expanded
// and time.Time arguments encoded for the dialect (the zero time as
// NULL), for tests that write rows the way an older release did.
func ExecRaw(ctx context.Context, s *Store, q string, args ...any) error {
	for i, a := range args {
		if t, ok := a.(time.Time); ok {
			args[i] = s.time(t)
		}
	}
	_, err := s.w.ExecContext(ctx, s.cfg.expand(q), args...)
	return err
}

// GroupWriteSQL returns the statement of group commit (Dialect.WriteMany,
// expanded), or "" where the dialect has none, for the plan tests. It is
// a function rather than a method so that it is not promoted into the
// dialect packages' API.
func GroupWriteSQL(s *Store) string { return s.q.writeMany }
