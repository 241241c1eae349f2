-- A new task's start waits for the commit of its insert, and PostgreSQL
-- serializes the commits of transactions that send a notice: each holds a
-- database-wide lock from its notices' queueing to the end of its commit,
-- WAL flush included, so an insert that notified queued behind every
-- commit of an outcome, a cancel or a progress write. Group commit's
-- inserts now go through a function of their own, insert_many, which
-- sends no notice: the store announces the rows it inserted once the
-- insert has committed, with announce, in a transaction of its own (a
-- notice still never announces a write that did not become durable).
-- insert_many sets workers.announce for its own statements only, and
-- the trigger stays silent while it is 'later'. Every other write
-- notifies as before, a fix made by hand included; the release before
-- this one never sets the setting, and its inserts notify from the
-- trigger.
CREATE OR REPLACE FUNCTION {notify_fn}() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
	payload text;
BEGIN
	IF current_setting('workers.announce', true) = 'later' THEN
		RETURN NULL;
	END IF;
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

-- The inserts of group commit, as write_many's first 18 arguments; it
-- returns the ids it inserted. Its plans read the primary key, and its
-- waits for a row lock are bounded, as write_many's.
CREATE FUNCTION {schema}"{prefix}insert_many"(
	text[], text[], bigint[], bigint[], text[], text[], timestamptz[], timestamptz[],
	text[], text[], text[], text[], text[], text[], timestamptz[], text[],
	text[], text[])
RETURNS SETOF text
LANGUAGE plpgsql
SET enable_seqscan = off
SET lock_timeout = '100ms'
SET workers.announce = 'later'
AS $$
BEGIN
	RETURN QUERY
	WITH t AS (
		INSERT INTO {tasks} (id, status, progress, attempt, result, error, started_at, completed_at,
			cause, cancelled_by, cancel_reason, stack, run_id, queue, created_at, owner)
		SELECT id, status, progress, attempt, result::json, error, started_at, completed_at,
			cause, cancelled_by, cancel_reason, stack, run_id, queue, created_at, owner
		FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::text[], $6::text[],
			$7::timestamptz[], $8::timestamptz[], $9::text[], $10::text[], $11::text[], $12::text[],
			$13::text[], $14::text[], $15::timestamptz[], $16::text[])
		AS v(id, status, progress, attempt, result, error, started_at, completed_at,
			cause, cancelled_by, cancel_reason, stack, run_id, queue, created_at, owner)
		ON CONFLICT (id) DO NOTHING
		RETURNING id, created_at
	), w AS (
		INSERT INTO {watchers} (task_id, created_at, user_id)
		SELECT t.id, t.created_at, x.user_id
		FROM unnest($17::text[], $18::text[]) WITH ORDINALITY AS x(task_id, user_id, n) JOIN t ON t.id = x.task_id
		ORDER BY x.n
		ON CONFLICT DO NOTHING
	)
	SELECT id FROM t;
END
$$;

-- The notices of rows insert_many inserted, as the trigger builds them
-- from each row as it is now: a write made to a row since its insert
-- notified from the trigger, and the row's notice here, which comes
-- after, names that write's run and status or a later one's, so that the
-- notices of a task still come in the order of its writes. The rows are
-- locked, in the order of their ids, until the notices commit: a write
-- to one of them meanwhile waits, so that its notice comes after. A row
-- that a transaction elsewhere holds locked is skipped rather than waited
-- for, and its id returned, to be announced again later: one row held by
-- an open transaction would otherwise fail the whole statement, and every
-- notice behind it, for as long as that transaction stays open. An empty
-- id sends an empty notice, which listeners take as "re-read
-- everything".
CREATE FUNCTION {schema}"{prefix}announce"(text[]) RETURNS SETOF text
LANGUAGE plpgsql
SET enable_seqscan = off
SET lock_timeout = '100ms'
AS $$
DECLARE
	row_id text;
	payload text;
	sent text[] := '{}';
BEGIN
	IF '' = ANY($1) THEN
		PERFORM pg_notify('{channel}', '');
	END IF;
	FOR row_id, payload IN
		SELECT id, json_build_object('id', id, 'run', run_id, 'status', status)::text
		FROM {tasks} WHERE id = ANY($1) ORDER BY id FOR SHARE SKIP LOCKED
	LOOP
		IF octet_length(payload) > 7000 THEN
			payload := '';
		END IF;
		PERFORM pg_notify('{channel}', payload);
		sent := sent || row_id;
	END LOOP;
	IF cardinality(sent) < cardinality($1) THEN
		RETURN QUERY SELECT id FROM {tasks} WHERE id = ANY($1) AND id NOT IN (SELECT unnest(sent));
	END IF;
END
$$;
