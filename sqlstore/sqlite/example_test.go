package sqlite_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/sqlite"
)

// A task's record outlives the runtime that ran it and the store that
// wrote it.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "workers-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "tasks.db")

	s, err := sqlite.Open(ctx, path)
	if err != nil {
		log.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	rt := workers.NewRuntime(s, workers.Config{})
	alice := workers.MustOwner("alice")
	sub, err := rt.Submit(ctx, "report", func(context.Context, *workers.Task) (any, error) {
		return map[string]int{"rows": 3}, nil
	}, alice)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := rt.Wait(ctx, sub.ID, alice); err != nil {
		log.Fatal(err)
	}
	if err := rt.Shutdown(ctx); err != nil {
		log.Fatal(err)
	}
	s.Close()

	s, err = sqlite.Open(ctx, path)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	rec, err := s.GetTask(ctx, sub.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(rec.ID, rec.Status, string(rec.Result))
	// Output: alice::report completed {"rows":3}
}
