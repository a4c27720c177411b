-- jobsd schema, version 28: the errors of each attempt (docs/semantics.md "Errors of
-- each attempt").
--
-- * jobs.errors (jsonb, null until an attempt ends in an error): the records of the
--   last attempts that ended in an error, most recent first, one object each:
--   {"attempt", "at", "type", "message", "traceback", "cause"}. The statement that
--   writes an attempt's outcome (jobs_finish_batch, jobs_rescue_apply) adds its record
--   in the same UPDATE; `error`, `report` and `reason` keep the last attempt's, as before.
--   The daemon caps each record's text and says how many records are kept
--   (jobsd/jsonsafe.py); jobs_errors_size bounds the column for every code path, raw
--   SQL included (like the caps of 0011_hostile): an array of at most 2 MiB of
--   jsonb::text, above the most the daemon writes (10 records of at most 20 KB of
--   text each, six times that if every character needed a \u escape).
-- * The column is the last of jobsd.jobs and of jobsd.jobs_archive alike:
--   jobsd.archive_move copies a row with INSERT ... SELECT *, column by column.
--   jobsd.all_jobs is made again with it (a replaced view may gain columns at its end
--   and keeps its grants; its options are given again, or they would be reset).
-- * jobsd.error_records_push(errors, record, keep): the record first, then the older
--   ones, at most `keep` of them.
-- * jobsd.outcome_rows_v2(jsonb): outcome_rows (0020) with each outcome's
--   error_record (null for an outcome without an error). outcome_rows stays for the
--   daemons of the previous version until they are gone.
--
-- Never edit this file once shipped: add a new numbered migration instead.

ALTER TABLE jobsd.jobs ADD COLUMN errors jsonb;
ALTER TABLE jobsd.jobs_archive ADD COLUMN errors jsonb;

-- NOT VALID: every row holds null yet, so validating would only read the whole table
-- under this migration's lock; new and updated rows are checked all the same. (The
-- archive has none of the size caps: its rows come from jobsd.jobs, checked there.)
ALTER TABLE jobsd.jobs
  ADD CONSTRAINT jobs_errors_size
  CHECK (jsonb_typeof(errors) = 'array' AND octet_length(errors::text) <= 2097152) NOT VALID;

CREATE OR REPLACE VIEW jobsd.all_jobs WITH (security_invoker = true) AS
  SELECT * FROM jobsd.jobs
  UNION ALL
  SELECT * FROM jobsd.jobs_archive;

-- Return p_record followed by the records of p_errors, at most p_keep in all (the
-- oldest are dropped). Called only for an outcome that carries a record.
CREATE FUNCTION jobsd.error_records_push(p_errors jsonb, p_record jsonb, p_keep integer)
RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT coalesce(jsonb_agg(e.value ORDER BY e.n), '[]'::jsonb)
  FROM jsonb_array_elements(
         jsonb_build_array(p_record)
         || CASE WHEN jsonb_typeof(p_errors) = 'array' THEN p_errors ELSE '[]'::jsonb END)
       WITH ORDINALITY AS e(value, n)
  WHERE e.n <= greatest(p_keep, 1)
$$;

-- Latest definition of outcome_rows: 0020_lean_writes. Added: error_record.
CREATE FUNCTION jobsd.outcome_rows_v2(p_results jsonb)
RETURNS TABLE (id uuid, lease_id uuid, status text, report jsonb, error text, reason text,
               progress jsonb, run_after timestamptz, delay_s float8, error_record jsonb)
LANGUAGE plpgsql STABLE PARALLEL SAFE ROWS 10
AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  SELECT r.id, r.lease_id, r.status, r.report, r.error, r.reason, r.progress, r.run_after,
         r.delay_s, r.error_record
  FROM pg_catalog.jsonb_to_recordset(p_results)
       AS r(id uuid, lease_id uuid, status text, report jsonb, error text, reason text,
            progress jsonb, run_after timestamptz, delay_s float8, error_record jsonb);
END
$$;
