-- Instance leases (workers.Leaser): one row per runtime, live while
-- expires_at (Unix microseconds) is after the database's clock. extended
-- is what the last renewal found: whether the lease it extended was still
-- live.
CREATE TABLE {leases} (
	instance   TEXT NOT NULL PRIMARY KEY,
	expires_at INTEGER NOT NULL,
	extended   INTEGER NOT NULL DEFAULT 0
) STRICT;
