package postgres_test

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/taskgate/workers/sqlstore/postgres"
)

// Migrate "does nothing when the tables are current": a replica whose
// role may read and write the tables but not create any (migrations run
// by a deploy job as the schema's owner, the application's role given
// only the rights it needs) calls Migrate at startup, as the package
// documentation asks, to check the schema against its release. Over
// current tables that must succeed, not fail for want of the right to
// create a table that already exists.
func TestMigrateOverCurrentTablesNeedsNoRightToCreate(t *testing.T) {
	sc := newScratchT(t)
	sc.store(t) // migrated by the schema's owner
	ctx := t.Context()
	pool := appRolePool(t, sc)
	s, err := postgres.New(pool, postgres.WithSchema(sc.schema))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate over current tables, by a role that may use them but create none: %v", err)
	}
}

// Over no tables, the same role's Migrate fails to create the version
// table, and says so, not that it failed to add a column to it.
func TestMigrateWithoutTheRightToCreateSaysWhatFailed(t *testing.T) {
	sc := newScratchT(t)
	pool := appRolePool(t, sc)
	s, err := postgres.New(pool, postgres.WithSchema(sc.schema))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.Migrate(t.Context())
	if err == nil || strings.Contains(err.Error(), "add a column") {
		t.Fatalf("Migrate over no tables, by a role that may create none: %v, want an error that does not speak of adding a column", err)
	}
}

// appRolePool returns a pool that connects as a role of its own, which
// may read and write the tables of sc's schema (those there now) but
// create none.
func appRolePool(t *testing.T, sc scratch) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = appRole(t, sc, "LOGIN"), appRolePassword
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// appRolePassword is the password of the roles appRole creates, for a
// server that does not trust local connections.
const appRolePassword = "workers-test"

// appRole creates a role of its own with the options given to CREATE
// ROLE and the password appRolePassword, which may read and write the
// tables of sc's schema (those there now) but create none, and returns
// its name; it is dropped in t's cleanup.
func appRole(t *testing.T, sc scratch, options string) string {
	t.Helper()
	role := "workers_app_" + strings.ToLower(rand.Text())
	q := `"` + sc.schema + `"`
	for _, stmt := range []string{
		`CREATE ROLE ` + role + ` ` + options + ` PASSWORD '` + appRolePassword + `'`,
		`GRANT USAGE ON SCHEMA ` + q + ` TO ` + role,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA ` + q + ` TO ` + role,
		`GRANT USAGE ON ALL SEQUENCES IN SCHEMA ` + q + ` TO ` + role,
	} {
		if _, err := sc.pool.Exec(t.Context(), stmt); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = sc.pool.Exec(ctx, `DROP OWNED BY `+role)
		_, _ = sc.pool.Exec(ctx, `DROP ROLE `+role)
	})
	return role
}
