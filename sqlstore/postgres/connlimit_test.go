package postgres_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/sqlstore/postgres"
)

// A server that refuses a new connection because it has too many (SQLSTATE
// 53300: max_connections reached, or a role's or a database's connection
// limit, as in a connection storm) is unavailable for now, not refusing
// the caller's data: the store's error wraps ErrUnavailable (503 with a
// Retry-After over HTTP), as for a server that is down, so that the
// runtime makes a registering write again and a caller may retry.
func TestTooManyConnectionsIsUnavailable(t *testing.T) {
	sc := newScratchT(t)
	sc.store(t) // migrates
	ctx := t.Context()
	cfg, err := pgxpool.ParseConfig(testDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = appRole(t, sc, "LOGIN CONNECTION LIMIT 0"), appRolePassword
	s := storeOver(t, cfg, postgres.WithSchema(sc.schema))

	if _, err := s.GetTask(ctx, "u::a"); !errors.Is(err, workers.ErrUnavailable) || !strings.Contains(err.Error(), "53300") {
		t.Errorf("GetTask while the server refuses connections for too many: %v, want ErrUnavailable (53300)", err)
	}
	rec := workers.Record{ID: "u::a", RunID: "run-1", Watchers: []string{"u"}, CreatedAt: time.Now(), State: workers.State{Status: workers.StatusPending}}
	if err := s.InsertTask(ctx, rec); !errors.Is(err, workers.ErrUnavailable) {
		t.Errorf("InsertTask while the server refuses connections for too many: %v, want ErrUnavailable", err)
	}
	if errors.Is(err, workers.ErrInvalidData) {
		t.Errorf("a refused connection taken for the caller's data: %v", err)
	}
}
