-- The task records. id, run_id, queue, owner and created_at are the
-- identity; the rest is the state a run writes. owner is derived from the
-- id at insert (workers.OwnerOf) and is NULL for a global-scope id. Times
-- are Unix microseconds; NULL is the zero time. result is JSON text.
CREATE TABLE {tasks} (
	id           TEXT NOT NULL PRIMARY KEY,
	run_id       TEXT NOT NULL,
	queue        TEXT NOT NULL DEFAULT '',
	owner        TEXT,
	created_at   INTEGER,
	status       TEXT NOT NULL,
	progress     INTEGER NOT NULL DEFAULT 0,
	attempt      INTEGER NOT NULL DEFAULT 0,
	result       TEXT CHECK (result IS NULL OR json_valid(result)),
	error        TEXT NOT NULL DEFAULT '',
	started_at   INTEGER,
	completed_at INTEGER
) STRICT;

-- Listing one user's tasks starts here and at the watchers index.
CREATE INDEX "{prefix}tasks_owner" ON {tasks} (owner, id);

-- Recovery scans for RUNNING records; cleanup deletes old terminal ones.
CREATE INDEX "{prefix}tasks_status" ON {tasks} (status, completed_at);

-- One row per watcher: an append is an INSERT, and the unique key makes a
-- repeated one a no-op. seq (the rowid) keeps the list in append order.
CREATE TABLE {watchers} (
	seq     INTEGER PRIMARY KEY,
	task_id TEXT NOT NULL REFERENCES {tasks} (id) ON DELETE CASCADE,
	user_id TEXT NOT NULL,
	UNIQUE (task_id, user_id)
) STRICT;

CREATE INDEX "{prefix}watchers_user" ON {watchers} (user_id, task_id);
