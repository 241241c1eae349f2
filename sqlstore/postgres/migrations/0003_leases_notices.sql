-- Instance leases (workers.Leaser): one row per runtime, live while
-- expires_at is after the database's now(). extended is what the last
-- renewal found: whether the lease it extended was still live.
CREATE TABLE {leases} (
	instance   text COLLATE "C" PRIMARY KEY,
	expires_at timestamptz NOT NULL,
	extended   boolean NOT NULL DEFAULT false
);

-- Notices (workers.Notifier): every committed insert or update of a task
-- row, and every added watcher, sends its task id, run id and status on
-- the store's channel. NOTIFY is delivered at commit, so a notice never
-- announces a write that did not become durable. A payload too long for
-- NOTIFY is sent empty, which listeners take as "re-read everything".
CREATE FUNCTION {notify_fn}() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
	payload text;
BEGIN
	IF TG_TABLE_NAME = '{prefix}watchers' THEN
		payload := json_build_object('id', NEW.task_id)::text;
	ELSE
		payload := json_build_object('id', NEW.id, 'run', NEW.run_id, 'status', NEW.status)::text;
	END IF;
	IF octet_length(payload) > 7000 THEN
		payload := '';
	END IF;
	PERFORM pg_notify('{channel}', payload);
	RETURN NULL;
END
$$;

CREATE TRIGGER "{prefix}tasks_notify" AFTER INSERT OR UPDATE ON {tasks}
	FOR EACH ROW EXECUTE FUNCTION {notify_fn}();
CREATE TRIGGER "{prefix}watchers_notify" AFTER INSERT ON {watchers}
	FOR EACH ROW EXECUTE FUNCTION {notify_fn}();

-- Results are kept byte for byte: json, unlike jsonb, stores the text as
-- written, \u0000 escapes included.
ALTER TABLE {tasks} ALTER COLUMN result TYPE json USING result::json;
