-- Group commit's function waits at most 100 ms for a row lock that
-- another transaction holds: one row of a batch that waits longer (an
-- administrator's open transaction, a replica that stopped mid-write)
-- would otherwise hold back every other row of the batch for as long.
-- The batch then fails with lock_not_available, having written nothing,
-- and each of its writes is made alone, so that only the held row waits.
-- The function is the same: the release before this one calls it too,
-- and makes its writes alone, one after the other, on that error.
ALTER FUNCTION {schema}"{prefix}write_many"(
	text[], text[], bigint[], bigint[], text[], text[], timestamptz[], timestamptz[],
	text[], text[], text[], text[], text[], text[], timestamptz[], text[],
	text[], text[],
	text[], text[], text[], text[], bigint[], bigint[], text[], text[],
	timestamptz[], timestamptz[], text[], text[], text[], text[])
SET lock_timeout = '100ms';
