-- Group commit's statement (see sqlcore.Dialect.WriteMany) runs in this
-- function so that its plans find the rows it transitions through the
-- primary key whatever the size of the tasks table when they were made.
-- Run as a prepared statement, as the driver runs it, the statement's plan
-- was made once per connection and cached: on a new table, which is small
-- for its first batches, that plan joined the batch's ids to a scan of the
-- whole table, and went on doing so for every batch while the table grew,
-- until the table was next analyzed. A function's plans are cached the
-- same way, but with sequential scans disabled while they are made, a
-- plan reads the primary key at any size; on a table of a few rows that
-- costs nothing a scan would not. A later change to the statement goes in
-- a function of a new name: during a rollout, processes of the release
-- before it still call this one.
CREATE FUNCTION {schema}"{prefix}write_many"(
	text[], text[], bigint[], bigint[], text[], text[], timestamptz[], timestamptz[],
	text[], text[], text[], text[], text[], text[], timestamptz[], text[],
	text[], text[],
	text[], text[], text[], text[], bigint[], bigint[], text[], text[],
	timestamptz[], timestamptz[], text[], text[], text[], text[])
RETURNS SETOF text
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
BEGIN
	RETURN QUERY
	WITH v AS (
		SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::text[], $6::text[],
			$7::timestamptz[], $8::timestamptz[], $9::text[], $10::text[], $11::text[], $12::text[],
			$13::text[], $14::text[], $15::timestamptz[], $16::text[])
		AS v(id, status, progress, attempt, result, error, started_at, completed_at,
			cause, cancelled_by, cancel_reason, stack, run_id, queue, created_at, owner)
	), t AS (
		INSERT INTO {tasks} (id, status, progress, attempt, result, error, started_at, completed_at,
			cause, cancelled_by, cancel_reason, stack, run_id, queue, created_at, owner)
		SELECT id, status, progress, attempt, result::json, error, started_at, completed_at,
			cause, cancelled_by, cancel_reason, stack, run_id, queue, created_at, owner FROM v
		ON CONFLICT (id) DO NOTHING
		RETURNING id, created_at
	), w AS (
		INSERT INTO {watchers} (task_id, created_at, user_id)
		SELECT t.id, t.created_at, x.user_id
		FROM unnest($17::text[], $18::text[]) WITH ORDINALITY AS x(task_id, user_id, n) JOIN t ON t.id = x.task_id
		ORDER BY x.n
		ON CONFLICT DO NOTHING
	), u AS (
		UPDATE {tasks} r SET status = n.status, progress = n.progress, attempt = n.attempt,
			result = n.result::json, error = n.error, started_at = n.started_at, completed_at = n.completed_at,
			cause = n.cause, cancelled_by = n.cancelled_by, cancel_reason = n.cancel_reason, stack = n.stack
		FROM unnest($19::text[], $20::text[], $21::text[], $22::text[], $23::bigint[], $24::bigint[],
			$25::text[], $26::text[], $27::timestamptz[], $28::timestamptz[], $29::text[], $30::text[],
			$31::text[], $32::text[])
			AS n(id, run_id, from_statuses, status, progress, attempt, result, error, started_at, completed_at,
				cause, cancelled_by, cancel_reason, stack)
		WHERE r.id = n.id AND r.run_id = n.run_id AND r.status = ANY(string_to_array(n.from_statuses, ','))
		RETURNING r.id
	)
	SELECT id FROM t UNION ALL SELECT id FROM u;
END
$$;
