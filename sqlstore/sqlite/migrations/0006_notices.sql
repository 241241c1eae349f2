-- Notices (workers.Notifier): every committed insert or update of a task
-- row, and every added watcher, appends a row naming its task (with the
-- run and status a task row holds after the write) to changes. SQLite has
-- one writer at a time and gives each new row the rowid after the
-- largest, so seq grows by one per change, in commit order; Listen
-- reads the rows after the last one it read. Every 256th append deletes
-- the rows more than 4096 before it (deleting one row at each append
-- would write the table's oldest page at every commit; the bound is
-- computed once, so the other appends search no rows), so the table
-- holds at least the last 4096 changes, and at most 4351, whether or not
-- anyone listens, and code that does not listen can use these tables; a
-- listener that falls further behind re-reads everything.
CREATE TABLE "{prefix}changes" (
	seq     INTEGER PRIMARY KEY,
	task_id TEXT NOT NULL,
	run_id  TEXT NOT NULL DEFAULT '',
	status  TEXT NOT NULL DEFAULT ''
) STRICT;

CREATE TRIGGER "{prefix}tasks_insert_notice" AFTER INSERT ON {tasks} BEGIN
	INSERT INTO "{prefix}changes" (task_id, run_id, status) VALUES (NEW.id, NEW.run_id, NEW.status);
	DELETE FROM "{prefix}changes" WHERE seq <= CASE WHEN last_insert_rowid() % 256 = 0 THEN last_insert_rowid() - 4096 ELSE 0 END;
END;

CREATE TRIGGER "{prefix}tasks_update_notice" AFTER UPDATE ON {tasks} BEGIN
	INSERT INTO "{prefix}changes" (task_id, run_id, status) VALUES (NEW.id, NEW.run_id, NEW.status);
	DELETE FROM "{prefix}changes" WHERE seq <= CASE WHEN last_insert_rowid() % 256 = 0 THEN last_insert_rowid() - 4096 ELSE 0 END;
END;

CREATE TRIGGER "{prefix}watchers_insert_notice" AFTER INSERT ON {watchers} BEGIN
	INSERT INTO "{prefix}changes" (task_id) VALUES (NEW.task_id);
	DELETE FROM "{prefix}changes" WHERE seq <= CASE WHEN last_insert_rowid() % 256 = 0 THEN last_insert_rowid() - 4096 ELSE 0 END;
END;
