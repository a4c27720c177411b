-- jobsd schema, version 10: a cheaper hot path, the same guarantees (issue 10,
-- docs/benchmarks.md, docs/decisions.md "The hot path").
--
-- * History of status updates once per statement: jobs_history_update (a row
--   trigger, one INSERT per changed row) becomes a statement trigger with
--   transition tables that writes every changed row's event in one INSERT. Still
--   written by the database whatever the code path; a transition-table trigger
--   cannot name a column (UPDATE OF status), so it fires on every UPDATE and keeps
--   only the rows whose status changed.
-- * One trigger on insert: history, admission (capacity, concurrency keys) and the
--   start-state check (was jobs_check_insert, a BEFORE ROW trigger) run in one
--   statement trigger, jobs_after_insert. jobs_notify_insert stays on its own:
--   `jobsd notify off` disables it by name.
-- * No foreign key from job_events to jobs: its check locked the job row (FOR KEY
--   SHARE) for every event written. Events are written only by the triggers (and the
--   fencing note, which reads the job FOR SHARE), always for an existing job; a
--   statement trigger on DELETE removes a deleted job's events, as the cascade did
--   (prune, queue drop).
-- * jobs_org_type_created_idx is dropped: every enqueue and every transition paid
--   for it; the API's list by org (filtered by type or not) reads
--   jobs_org_created_idx.
--
-- Never edit this file once shipped: add a new numbered migration instead.

-- History of inserts, admission and the start-state check, once per statement.
-- SECURITY DEFINER for admission (capacity counts every org's jobs; the enqueue role
-- needs no right on queues or concurrency_keys); the events it writes carry each
-- new job's own org_id, which row-level security already accepted for the job.
CREATE FUNCTION jobsd.after_insert_jobs() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
DECLARE
  bad record;
  q record;
  cap integer;
  open_jobs bigint;
BEGIN
  -- a job starts queued, scheduled or blocked (was jobs_check_insert)
  SELECT n.id, n.status INTO bad FROM new_jobs AS n
  WHERE n.status NOT IN ('queued', 'scheduled', 'blocked') LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'illegal transition of job %: a job starts queued, scheduled or blocked, not %',
      bad.id, bad.status
      USING ERRCODE = 'check_violation';
  END IF;

  INSERT INTO jobsd.job_events (job_id, org_id, from_status, to_status, attempt, worker_id, reason)
  SELECT n.id, n.org_id, NULL, n.status, n.attempts,
         coalesce(nullif(current_setting('jobsd.actor', true), ''), n.worker_id), n.reason
  FROM new_jobs AS n;

  -- admission, as jobsd.admit_inserted_jobs (migration 0008) did: the common case, a
  -- job without a key into a queue without a capacity, is this one query
  IF NOT EXISTS (
    SELECT 1 FROM new_jobs AS n
    WHERE n.concurrency_key IS NOT NULL
       OR EXISTS (SELECT 1 FROM jobsd.queues AS qs
                  WHERE qs.name = n.queue AND qs.capacity IS NOT NULL)) THEN
    RETURN NULL;
  END IF;

  FOR q IN
    SELECT qs.name FROM jobsd.queues AS qs
    WHERE qs.capacity IS NOT NULL
      AND qs.name IN (SELECT DISTINCT n.queue FROM new_jobs AS n)
    ORDER BY qs.name
  LOOP
    UPDATE jobsd.queues AS qs SET capacity = qs.capacity
    WHERE qs.name = q.name
    RETURNING qs.capacity INTO cap;
    CONTINUE WHEN cap IS NULL;
    SELECT count(*) INTO open_jobs FROM (
      SELECT 1 FROM jobsd.jobs AS j
      WHERE j.queue = q.name AND j.status NOT IN ('succeeded', 'failed', 'cancelled')
      LIMIT cap + 1) AS o;
    IF open_jobs > cap THEN
      RAISE EXCEPTION 'queue % is full: capacity %', q.name, cap
        USING ERRCODE = 'JQ001',
              DETAIL = json_build_object('queue', q.name, 'capacity', cap,
                                         'open', open_jobs)::text;
    END IF;
  END LOOP;

  INSERT INTO jobsd.concurrency_keys (org_id, concurrency_key)
  SELECT DISTINCT n.org_id, n.concurrency_key FROM new_jobs AS n
  WHERE n.concurrency_key IS NOT NULL
  ORDER BY 1, 2
  ON CONFLICT DO NOTHING;
  RETURN NULL;
END
$$;

-- History of status changes, once per statement: every row whose status changed
-- gets its event, in one INSERT. Runs as the invoker, like the row trigger it
-- replaces (the events carry the job's org_id).
CREATE FUNCTION jobsd.record_status_changes() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO jobsd.job_events (job_id, org_id, from_status, to_status, attempt, worker_id, reason)
  SELECT n.id, n.org_id, o.status, n.status, n.attempts,
         coalesce(nullif(current_setting('jobsd.actor', true), ''), n.worker_id), n.reason
  FROM new_jobs AS n
  JOIN old_jobs AS o ON o.id = n.id
  WHERE o.status IS DISTINCT FROM n.status;
  RETURN NULL;
END
$$;

-- What the foreign key's ON DELETE CASCADE did. SECURITY DEFINER: a role that may
-- delete jobs (prune) needs no right on job_events.
CREATE FUNCTION jobsd.delete_events_of_deleted_jobs() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
BEGIN
  DELETE FROM jobsd.job_events AS e WHERE e.job_id IN (SELECT g.id FROM gone_jobs AS g);
  RETURN NULL;
END
$$;

REVOKE ALL ON FUNCTION jobsd.after_insert_jobs(), jobsd.delete_events_of_deleted_jobs()
  FROM PUBLIC;

DROP TRIGGER jobs_history_insert ON jobsd.jobs;
DROP TRIGGER jobs_admit_insert ON jobsd.jobs;
DROP TRIGGER jobs_check_insert ON jobsd.jobs;
DROP TRIGGER jobs_history_update ON jobsd.jobs;

CREATE TRIGGER jobs_after_insert AFTER INSERT ON jobsd.jobs
  REFERENCING NEW TABLE AS new_jobs
  FOR EACH STATEMENT EXECUTE FUNCTION jobsd.after_insert_jobs();

CREATE TRIGGER jobs_history_update_stmt AFTER UPDATE ON jobsd.jobs
  REFERENCING OLD TABLE AS old_jobs NEW TABLE AS new_jobs
  FOR EACH STATEMENT EXECUTE FUNCTION jobsd.record_status_changes();

ALTER TABLE jobsd.job_events DROP CONSTRAINT job_events_job_id_fkey;

CREATE TRIGGER jobs_delete_events AFTER DELETE ON jobsd.jobs
  REFERENCING OLD TABLE AS gone_jobs
  FOR EACH STATEMENT EXECUTE FUNCTION jobsd.delete_events_of_deleted_jobs();

DROP INDEX jobsd.jobs_org_type_created_idx;
