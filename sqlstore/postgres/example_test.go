package postgres_test

import (
	"context"
	"log"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// Open a store, migrate it, and run tasks on it. Every process that
// shares the database does the same; Migrate is safe to race.
func Example() {
	ctx := context.Background()
	s, err := postgres.Open(ctx, "postgres://app@db.internal/app", postgres.WithSchema("jobs"))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	rt := workers.NewRuntime(s, workers.Config{})
	if err := rt.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer rt.Shutdown(ctx)
	// Submit, Status, List and Cancel as with any store.
}
