package postgres

import (
	"time"

	"github.com/taskgate/workers/sqlstore/internal/sqlcore"
)

// WithListenCheck sets how long Listen's connection may carry no notice
// before it is pinged, and how long the ping may take.
func WithListenCheck(check, ping time.Duration) Option {
	return func(o *options) { o.listen = listenTiming{check: check, ping: ping} }
}

// Core returns the implementation s shares with the SQLite store.
func Core(s *Store) *sqlcore.Store { return s.core }

// Channel returns the name of the notification channel s listens on.
func Channel(s *Store) string { return sqlcore.Channel(s.core) }
