-- The task records. id, run_id, queue, owner and created_at are the
-- identity; the rest is the state a run writes. owner is derived from the
-- id at insert (workers.OwnerOf) and is NULL for a global-scope id.
CREATE TABLE {tasks} (
	id           text COLLATE "C" PRIMARY KEY,
	run_id       text NOT NULL,
	queue        text NOT NULL DEFAULT '',
	owner        text,
	created_at   timestamptz,
	status       text NOT NULL,
	progress     integer NOT NULL DEFAULT 0,
	attempt      integer NOT NULL DEFAULT 0,
	result       jsonb,
	error        text NOT NULL DEFAULT '',
	started_at   timestamptz,
	completed_at timestamptz
);

-- Listing one user's tasks starts here and at the watchers index.
CREATE INDEX "{prefix}tasks_owner" ON {tasks} (owner, id);

-- Recovery scans for RUNNING records; cleanup deletes old terminal ones.
CREATE INDEX "{prefix}tasks_status" ON {tasks} (status, completed_at);

-- One row per watcher: an append is an INSERT, so concurrent appends never
-- overwrite each other, and the primary key makes a repeated one a no-op.
-- seq keeps the list in append order.
CREATE TABLE {watchers} (
	task_id text COLLATE "C" NOT NULL REFERENCES {tasks} (id) ON DELETE CASCADE,
	user_id text NOT NULL,
	seq     bigint GENERATED ALWAYS AS IDENTITY,
	PRIMARY KEY (task_id, user_id)
);

CREATE INDEX "{prefix}watchers_user" ON {watchers} (user_id, task_id);
