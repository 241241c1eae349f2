-- Paged listings, newest or oldest first, read one page through an index
-- however many tasks a user has: a user's listing is a union of the tasks
-- it owns and the tasks it watches, each read in (created_at, id) order
-- from its own index. For that, a watcher row keeps its task's
-- created_at, written with the row (the task's created_at changes only
-- when ReplaceTask rewrites the watcher rows too).
ALTER TABLE {watchers} ADD COLUMN created_at timestamptz;
UPDATE {watchers} w SET created_at = t.created_at FROM {tasks} t WHERE t.id = w.task_id;

CREATE INDEX "{prefix}tasks_owner_created" ON {tasks} (owner, created_at NULLS FIRST, id);
CREATE INDEX "{prefix}tasks_created" ON {tasks} (created_at NULLS FIRST, id);
CREATE INDEX "{prefix}watchers_user_created" ON {watchers} (user_id, created_at NULLS FIRST, task_id);
