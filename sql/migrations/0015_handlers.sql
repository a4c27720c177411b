-- jobsd schema, version 15: handlers that cannot break the guarantees (issue 11).
--
-- * jobsd.fail_hooks: one row per failed job whose on_fail hook a daemon took on
--   (at most once per failure, whatever moved the job to failed: its handler, a
--   sweep, a dependency cascade, `jobsd resolve --failed`, a timeout). A daemon
--   claims a failed job by inserting its row (ON CONFLICT DO NOTHING: two daemons
--   never both call it), then calls the hook, best effort. Rows go with their job.
--   Failed jobs already there at upgrade count as done: their hooks ran before.
-- * jobs_failed_idx: the failed jobs by end time, for that claim.
-- * jobsd.running_health(): the oldest running job's age and idle time (since its
--   last progress or start) and the recovery_required backlog, every org's, for
--   /health (SECURITY DEFINER like queue_depth: the API's role may see one org).
--
-- Never edit this file once shipped: add a new numbered migration instead.

CREATE TABLE jobsd.fail_hooks (
  job_id uuid PRIMARY KEY REFERENCES jobsd.jobs (id) ON DELETE CASCADE,
  worker_id text,
  called_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX jobs_failed_idx ON jobsd.jobs (finished_at) WHERE status = 'failed';

INSERT INTO jobsd.fail_hooks (job_id, worker_id)
SELECT j.id, 'migration 0015' FROM jobsd.jobs AS j WHERE j.status = 'failed';

CREATE FUNCTION jobsd.running_health()
RETURNS TABLE (oldest_running_age_s float8, oldest_running_idle_s float8,
               recovery_required bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
  SELECT
    (SELECT extract(epoch FROM now() - min(j.started_at))::float8
     FROM jobsd.jobs AS j WHERE j.status = 'running'),
    (SELECT extract(epoch FROM now() - min(coalesce(
               (j.progress ->> 'updated_at')::timestamptz, j.started_at)))::float8
     FROM jobsd.jobs AS j WHERE j.status = 'running'),
    (SELECT count(*) FROM jobsd.jobs AS j WHERE j.status = 'recovery_required')
$$;

REVOKE ALL ON FUNCTION jobsd.running_health() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION jobsd.running_health() TO PUBLIC;
