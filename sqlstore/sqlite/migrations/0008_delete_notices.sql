-- Notices of deletes (workers.Notifier): a live task row (any status but
-- a terminal one) deleted by a committed statement, an operator's DELETE
-- say, appends a change naming its task alone, with no run and no
-- status: a listener reads the record, finds it gone, and ends the run
-- it holds for it (workers.ErrDeleted), one waiting for its turn
-- included, at once rather than at its turn. SQLite's triggers fire for
-- each row, so a delete of many live rows appends as many changes, pruned
-- as every append is: a listener that falls more than the table keeps
-- behind re-reads everything, as after any burst of changes.
--
-- Finished rows are deleted silently: no run waits on them, and the
-- store's own deletes, those of Cleanup (DeleteFinished), delete only
-- finished rows, so that retention appends no change, in this release or
-- in the one before it. Watcher rows, deleted with their task, append
-- nothing of their own.
CREATE TRIGGER "{prefix}tasks_delete_notice" AFTER DELETE ON {tasks}
WHEN OLD.status NOT IN ('completed', 'failed', 'cancelled') BEGIN
	INSERT INTO "{prefix}changes" (task_id) VALUES (OLD.id);
	DELETE FROM "{prefix}changes" WHERE seq <= CASE WHEN last_insert_rowid() % 256 = 0 THEN last_insert_rowid() - 4096 ELSE 0 END;
END;
