-- Notices of deletes (workers.Notifier): a live task row (PENDING,
-- RUNNING, any status but a terminal one) deleted by a committed
-- statement, an operator's DELETE say, sends its task id alone, with no
-- run and no status: a listener reads the record, finds it gone, and
-- ends the run it holds for it (workers.ErrDeleted), one waiting for
-- its turn included, at once rather than at its turn. A statement that
-- deletes more than 1,000 live rows sends one empty notice instead,
-- which listeners take as "re-read everything": a re-read costs each
-- runtime a read of each of its runs, where a notice per row would cost
-- every listener a notice per row, and the commit a place in the
-- database's notice queue for each. The trigger fires once per
-- statement, and reads the deleted rows from its transition table.
--
-- Finished rows are deleted silently: no run waits on them, and the
-- store's own deletes, those of Cleanup (DeleteFinished), delete only
-- finished rows, so that retention sends no notice, in this release or
-- in the one before it. A TRUNCATE, which deletes without firing the
-- delete trigger, sends one empty notice. Watcher rows, deleted with
-- their task, send nothing of their own.
CREATE FUNCTION {schema}"{prefix}notify_delete"() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
	live bigint;
	row_id text;
	payload text;
BEGIN
	IF TG_OP = 'TRUNCATE' THEN
		PERFORM pg_notify('{channel}', '');
		RETURN NULL;
	END IF;
	SELECT count(*) INTO live FROM gone WHERE status NOT IN ('completed', 'failed', 'cancelled');
	IF live = 0 THEN
		RETURN NULL;
	END IF;
	IF live > 1000 THEN
		PERFORM pg_notify('{channel}', '');
		RETURN NULL;
	END IF;
	FOR row_id IN SELECT id FROM gone WHERE status NOT IN ('completed', 'failed', 'cancelled') LOOP
		payload := json_build_object('id', row_id)::text;
		IF octet_length(payload) > 7000 THEN
			payload := '';
		END IF;
		PERFORM pg_notify('{channel}', payload);
	END LOOP;
	RETURN NULL;
END
$$;

CREATE TRIGGER "{prefix}tasks_delete_notify" AFTER DELETE ON {tasks}
	REFERENCING OLD TABLE AS gone
	FOR EACH STATEMENT EXECUTE FUNCTION {schema}"{prefix}notify_delete"();
CREATE TRIGGER "{prefix}tasks_truncate_notify" AFTER TRUNCATE ON {tasks}
	FOR EACH STATEMENT EXECUTE FUNCTION {schema}"{prefix}notify_delete"();
