package sqlite

import "github.com/taskgate/workers/sqlstore/internal/sqlcore"

// Core returns the implementation s shares with the PostgreSQL store.
func Core(s *Store) *sqlcore.Store { return s.core }
