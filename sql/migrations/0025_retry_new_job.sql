-- jobsd schema, version 25: a retry creates a new job; a terminal state never changes.
--
-- * jobsd.jobs.retry_of: the job a job retries (NULL for every other job). At most one
--   retry per job (jobs_retry_of_key): a repeated retry returns the retry it made.
--   The retried job's link to its retry (retried_as) is read from this index; the
--   retried job's row is never written again.
-- * jobsd.job_retry() inserts the new job, of the same org, type, queue, payload,
--   priority, concurrency key and trace context, queued now, attempts from 0. The
--   insert is admitted like any enqueue: the queue's capacity and the org's quota of
--   open jobs are checked by jobsd.after_insert_jobs() (JQ001, JQ003: nothing is
--   written), the insert notifies the daemons. The new job's first event names the
--   actor and 'retry of <id>'; the retried job's history gets a note (same status at
--   both ends) 'retried as <id>'.
-- * a cancel request on a running job is recorded in its history (an event from
--   running to running, 'cancel requested', naming the actor) by the trigger that
--   notifies it (0024), whoever asked: the API's role may not write job_events
--   itself.
-- * the state machine loses the retry edge: failed or cancelled -> queued is refused
--   like every other move out of a terminal state. Jobs retried in place before this
--   version keep their one row and its history.
--
-- Never edit this file once shipped: add a new numbered migration instead.

ALTER TABLE jobsd.jobs ADD COLUMN retry_of uuid;
CREATE UNIQUE INDEX jobs_retry_of_key ON jobsd.jobs (retry_of) WHERE retry_of IS NOT NULL;

-- Latest definition: 0020_lean_writes. Changed: no retry edge.
CREATE OR REPLACE FUNCTION jobsd.record_status_changes() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
DECLARE
  bad record;
BEGIN
  WITH changed AS MATERIALIZED (
    SELECT n.id, n.org_id, o.status AS from_status, n.status AS to_status, n.attempts,
           n.worker_id, n.reason
    FROM new_jobs AS n
    JOIN old_jobs AS o ON o.id = n.id
    WHERE o.status IS DISTINCT FROM n.status),
  recorded AS (
    INSERT INTO jobsd.job_events (job_id, org_id, from_status, to_status, attempt, worker_id,
                                  reason)
    SELECT c.id, c.org_id, c.from_status, c.to_status, c.attempts,
           coalesce(nullif(current_setting('jobsd.actor', true), ''), c.worker_id), c.reason
    FROM changed AS c)
  SELECT c.id, c.from_status, c.to_status INTO bad
  FROM changed AS c
  WHERE NOT jobsd.transition_allowed(c.from_status, c.to_status)
  LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'illegal transition of job %: % -> %', bad.id, bad.from_status,
      bad.to_status
      USING ERRCODE = 'check_violation';
  END IF;
  RETURN NULL;
END
$$;

DROP FUNCTION jobsd.job_retry(uuid, text, boolean, text);

-- Retry a failed or cancelled job as a new job: one place for every caller. Returns
-- what happened and the job it concerns: 'retried' (the new job, p_new_id),
-- 'already_retried' (the retry made before), 'not_found' (no such job, or of another
-- org), 'not_ended' (the job is not failed or cancelled), 'at_most_once' (its type is
-- at_most_once and p_force is false), 'dependency' (a job it depends on has not
-- succeeded: it would fail again at once). The org is p_org_id, else the caller's
-- jobsd.org_id (the API sets it), else any org. SECURITY DEFINER: the API's role
-- needs no column grants; the org check is here. A full queue or org quota raises
-- (JQ001, JQ003) and nothing is written.
CREATE FUNCTION jobsd.job_retry(p_job_id uuid, p_new_id uuid, p_actor text, p_force boolean,
                                p_org_id text DEFAULT NULL)
RETURNS TABLE (outcome text, job_id uuid)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
DECLARE
  v_org text := coalesce(p_org_id, nullif(current_setting('jobsd.org_id', true), ''));
  v_job jobsd.jobs%ROWTYPE;
  v_retry uuid;
BEGIN
  -- the lock makes concurrent retries of one job take turns: the second finds the
  -- first's retry
  SELECT j.* INTO v_job FROM jobsd.jobs AS j
  WHERE j.id = p_job_id AND (v_org IS NULL OR j.org_id = v_org)
  FOR UPDATE;
  IF NOT FOUND THEN
    RETURN QUERY SELECT 'not_found'::text, NULL::uuid;
    RETURN;
  END IF;
  SELECT r.id INTO v_retry FROM jobsd.jobs AS r WHERE r.retry_of = p_job_id;
  IF FOUND THEN
    RETURN QUERY SELECT 'already_retried'::text, v_retry;
    RETURN;
  END IF;
  IF v_job.status NOT IN ('failed', 'cancelled') THEN
    RETURN QUERY SELECT 'not_ended'::text, NULL::uuid;
    RETURN;
  END IF;
  IF NOT coalesce(p_force, false) AND EXISTS (
      SELECT 1 FROM jobsd.job_types AS t
      WHERE t.type = v_job.type AND t.delivery = 'at_most_once') THEN
    RETURN QUERY SELECT 'at_most_once'::text, NULL::uuid;
    RETURN;
  END IF;
  IF EXISTS (SELECT 1 FROM jobsd.job_dependencies AS d
             JOIN jobsd.jobs AS p ON p.id = d.depends_on
             WHERE d.job_id = p_job_id AND p.status <> 'succeeded') THEN
    RETURN QUERY SELECT 'dependency'::text, NULL::uuid;
    RETURN;
  END IF;
  PERFORM set_config('jobsd.actor', coalesce(p_actor, ''), true);
  INSERT INTO jobsd.jobs (id, org_id, type, queue, status, payload, priority,
                          concurrency_key, trace_context, reason, retry_of)
  VALUES (p_new_id, v_job.org_id, v_job.type, v_job.queue, 'queued', v_job.payload,
          v_job.priority, v_job.concurrency_key, v_job.trace_context,
          CASE WHEN coalesce(p_force, false) THEN 'retry (forced) of ' ELSE 'retry of ' END
            || p_job_id::text,
          p_job_id);
  INSERT INTO jobsd.job_events (job_id, org_id, from_status, to_status, attempt, worker_id,
                                reason)
  VALUES (p_job_id, v_job.org_id, v_job.status, v_job.status, v_job.attempts,
          nullif(p_actor, ''), 'retried as ' || p_new_id::text);
  PERFORM set_config('jobsd.actor', '', true);
  RETURN QUERY SELECT 'retried'::text, p_new_id;
END
$$;

REVOKE ALL ON FUNCTION jobsd.job_retry(uuid, uuid, text, boolean, text) FROM PUBLIC;

-- Latest definition: 0024_cancel_notify. Changed: the request is recorded in the
-- job's history; SECURITY DEFINER, as the other history writers.
CREATE OR REPLACE FUNCTION jobsd.notify_cancel() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
BEGIN
  INSERT INTO jobsd.job_events (job_id, org_id, from_status, to_status, attempt, worker_id,
                                reason)
  VALUES (NEW.id, NEW.org_id, NEW.status, NEW.status, NEW.attempts,
          coalesce(nullif(current_setting('jobsd.actor', true), ''), 'unknown'),
          'cancel requested');
  PERFORM pg_notify('jobsd_cancel', NEW.id::text);
  RETURN NULL;
END
$$;

REVOKE ALL ON FUNCTION jobsd.notify_cancel() FROM PUBLIC;
