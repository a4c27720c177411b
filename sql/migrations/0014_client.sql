-- jobsd schema, version 14: the same operations everywhere (issue 14).
--
-- * jobsd.job_types: the job types daemons have registered, with their delivery and
--   max_attempts, kept after the daemon stops: a retry of an at_most_once type is
--   refused unless forced, whoever asks (CLI, API, client, dashboard).
-- * jobsd.workers.types: the types each live daemon handles (NULL: a daemon that
--   takes every type, JOBSD_UNKNOWN_TYPES=fail), so queued jobs nobody can run are
--   counted (`/health`, `jobsd queue list`).
-- * jobsd.jobs.trace_context: the W3C trace context of the enqueue (traceparent,
--   tracestate), NULL without OpenTelemetry.
-- * jobsd.job_retry(): a failed or cancelled job gets a new attempt of the same job:
--   back to queued, attempts keep counting, the move recorded in job_events with the
--   actor. check_transition allows that one edge out of a terminal state, and only
--   inside job_retry.
--
-- Never edit this file once shipped: add a new numbered migration instead.

CREATE TABLE jobsd.job_types (
  type          text PRIMARY KEY,
  delivery      text NOT NULL CHECK (delivery IN ('at_least_once', 'at_most_once')),
  max_attempts  integer NOT NULL CHECK (max_attempts >= 1),
  seen_at       timestamptz NOT NULL DEFAULT now()
);

ALTER TABLE jobsd.workers ADD COLUMN types text[];

ALTER TABLE jobsd.jobs ADD COLUMN trace_context jsonb;

-- Latest definition: 0005_transitions.sql. Changed: the retry edge (failed or
-- cancelled -> queued) passes while jobsd.job_retry() is moving that very job.
CREATE OR REPLACE FUNCTION jobsd.check_transition() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    IF NEW.status NOT IN ('queued', 'scheduled', 'blocked') THEN
      RAISE EXCEPTION 'illegal transition of job %: a job starts queued, scheduled or blocked, not %',
        NEW.id, NEW.status
        USING ERRCODE = 'check_violation';
    END IF;
  ELSIF NOT jobsd.transition_allowed(OLD.status, NEW.status)
        AND NOT (OLD.status IN ('failed', 'cancelled') AND NEW.status = 'queued'
                 AND coalesce(current_setting('jobsd.retrying', true), '') = NEW.id::text) THEN
    RAISE EXCEPTION 'illegal transition of job %: % -> %', NEW.id, OLD.status, NEW.status
      USING ERRCODE = 'check_violation';
  END IF;
  RETURN NEW;
END
$$;

-- Retry a failed or cancelled job: one place for every caller. Returns what
-- happened: 'retried', 'not_found' (no such job, or of another org), 'not_ended'
-- (the job is not failed or cancelled), 'at_most_once' (its type is at_most_once
-- and p_force is false), 'dependency' (a job it depends on has not succeeded: it
-- would fail again at once). The org is p_org_id, else the caller's jobsd.org_id
-- (the API sets it), else any org. SECURITY DEFINER: the API's role needs no
-- column grants; the org check is here.
CREATE FUNCTION jobsd.job_retry(p_job_id uuid, p_actor text, p_force boolean,
                                p_org_id text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
DECLARE
  v_org text := coalesce(p_org_id, nullif(current_setting('jobsd.org_id', true), ''));
  v_job record;
BEGIN
  SELECT j.status, j.type INTO v_job FROM jobsd.jobs AS j
  WHERE j.id = p_job_id AND (v_org IS NULL OR j.org_id = v_org)
  FOR UPDATE;
  IF NOT FOUND THEN
    RETURN 'not_found';
  END IF;
  IF v_job.status NOT IN ('failed', 'cancelled') THEN
    RETURN 'not_ended';
  END IF;
  IF NOT coalesce(p_force, false) AND EXISTS (
      SELECT 1 FROM jobsd.job_types AS t
      WHERE t.type = v_job.type AND t.delivery = 'at_most_once') THEN
    RETURN 'at_most_once';
  END IF;
  IF EXISTS (SELECT 1 FROM jobsd.job_dependencies AS d
             JOIN jobsd.jobs AS p ON p.id = d.depends_on
             WHERE d.job_id = p_job_id AND p.status <> 'succeeded') THEN
    RETURN 'dependency';
  END IF;
  PERFORM set_config('jobsd.actor', coalesce(p_actor, ''), true);
  PERFORM set_config('jobsd.retrying', p_job_id::text, true);
  UPDATE jobsd.jobs
  SET status = 'queued',
      reason = CASE WHEN coalesce(p_force, false) THEN 'retry (forced)' ELSE 'retry' END,
      finished_at = NULL, started_at = NULL, lease_id = NULL,
      cancel_requested_at = NULL, run_after = now()
  WHERE id = p_job_id;
  PERFORM set_config('jobsd.retrying', '', true);
  PERFORM set_config('jobsd.actor', '', true);
  RETURN 'retried';
END
$$;

REVOKE ALL ON FUNCTION jobsd.job_retry(uuid, text, boolean, text) FROM PUBLIC;

-- Queued jobs that no live daemon would claim: their type is in no registered
-- worker's types (a worker with NULL types takes every type). By queue and type,
-- for /health and `jobsd queue list`: every org's jobs (SECURITY DEFINER, like
-- queue_depth). Reads the queued jobs once (the claim index).
CREATE FUNCTION jobsd.unhandled_jobs()
RETURNS TABLE (queue text, type text, jobs bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
  WITH handled AS (
    SELECT bool_or(w.types IS NULL) AS any_type,
           coalesce(array_agg(DISTINCT t.type) FILTER (WHERE t.type IS NOT NULL), '{}')
             AS types
    FROM jobsd.workers AS w
    LEFT JOIN LATERAL unnest(w.types) AS t(type) ON true)
  SELECT j.queue, j.type, count(*)::bigint
  FROM jobsd.jobs AS j, handled AS h
  WHERE j.status = 'queued' AND NOT coalesce(h.any_type, false)
    AND j.type <> ALL (h.types)
  GROUP BY j.queue, j.type
  ORDER BY j.queue, j.type
$$;

REVOKE ALL ON FUNCTION jobsd.unhandled_jobs() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION jobsd.unhandled_jobs() TO PUBLIC;
