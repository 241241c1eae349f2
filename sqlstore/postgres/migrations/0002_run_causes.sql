-- How each run ended, as a code beside the human message in error
-- (workers.Cause), who cancelled it and why, and a panicking callback's
-- stack. Records written before codes were kept get one derived from the
-- status and the message those versions wrote; every later record is
-- written with its code.
ALTER TABLE {tasks} ADD COLUMN cause text NOT NULL DEFAULT '';
ALTER TABLE {tasks} ADD COLUMN cancelled_by text NOT NULL DEFAULT '';
ALTER TABLE {tasks} ADD COLUMN cancel_reason text NOT NULL DEFAULT '';
ALTER TABLE {tasks} ADD COLUMN stack text NOT NULL DEFAULT '';

UPDATE {tasks} SET cause = CASE
	WHEN status = 'completed' THEN 'completed'
	WHEN status = 'cancelled' AND error = 'Superseded by a newer run' THEN 'superseded'
	WHEN status = 'cancelled' AND error = 'Cancelled by worker shutdown' THEN 'shutdown'
	WHEN status = 'cancelled' THEN 'cancelled'
	WHEN error LIKE 'Timed out after %' THEN 'timeout'
	WHEN error LIKE 'Abandoned%' THEN 'abandoned'
	WHEN error LIKE '%task panicked%' THEN 'panicked'
	ELSE 'failed'
END
WHERE status IN ('completed', 'failed', 'cancelled');
