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
	role := "workers_app_" + strings.ToLower(rand.Text())
	ctx := t.Context()
	q := `"` + sc.schema + `"`
	for _, stmt := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT USAGE ON SCHEMA ` + q + ` TO ` + role,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA ` + q + ` TO ` + role,
		`GRANT USAGE ON ALL SEQUENCES IN SCHEMA ` + q + ` TO ` + role,
	} {
		if _, err := sc.pool.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = sc.pool.Exec(ctx, `DROP OWNED BY `+role)
		_, _ = sc.pool.Exec(ctx, `DROP ROLE `+role)
	})
	cfg, err := pgxpool.ParseConfig(testDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = role
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := postgres.New(pool, postgres.WithSchema(sc.schema))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate over current tables, by a role that may use them but create none: %v", err)
	}
}
