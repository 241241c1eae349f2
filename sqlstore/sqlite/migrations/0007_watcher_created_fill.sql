-- A watcher row keeps its task's created_at since version 4, but a
-- process of a release before it, still running beside a newer one,
-- adds watchers with its own statements, which write none: a listing
-- read through the watcher index would place such a row among the
-- undated tasks, whatever its task's time. A trigger gives a watcher row
-- inserted without a created_at its task's; the rows written so before
-- it are given theirs. Every release since version 4 writes the time
-- itself, and the trigger leaves its rows alone.
CREATE TRIGGER "{prefix}watchers_created" AFTER INSERT ON {watchers}
WHEN NEW.created_at IS NULL BEGIN
	UPDATE {watchers} SET created_at = (SELECT t.created_at FROM {tasks} t WHERE t.id = NEW.task_id) WHERE seq = NEW.seq;
END;

UPDATE {watchers} SET created_at = (SELECT t.created_at FROM {tasks} t WHERE t.id = {watchers}.task_id)
WHERE created_at IS NULL;
