-- A watcher row keeps its task's created_at since version 4, but a
-- replica of a release before it, still running beside a newer one
-- during a rollout, adds watchers with its own statements, which write
-- none: a listing read through the watcher index would place such a row
-- among the undated tasks, whatever its task's time. A trigger gives a
-- watcher row inserted without a created_at its task's; the rows written
-- so before it are given theirs. Every release since version 4 writes
-- the time itself, and the trigger leaves its rows alone. The trigger is
-- created first: it holds off the inserts of other transactions until
-- this one commits, so that none slips in between.
CREATE FUNCTION {schema}"{prefix}watcher_created"() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	NEW.created_at := (SELECT created_at FROM {tasks} WHERE id = NEW.task_id);
	RETURN NEW;
END
$$;

CREATE TRIGGER "{prefix}watchers_created" BEFORE INSERT ON {watchers}
	FOR EACH ROW WHEN (NEW.created_at IS NULL) EXECUTE FUNCTION {schema}"{prefix}watcher_created"();

UPDATE {watchers} w SET created_at = t.created_at FROM {tasks} t
WHERE t.id = w.task_id AND w.created_at IS NULL AND t.created_at IS NOT NULL;
