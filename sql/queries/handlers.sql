-- Statements of the handlers' guarantees: on_fail hooks, run health.

-- name: fail_hooks_claim
-- Take on the on_fail hooks of failed jobs of the given types that no daemon took
-- yet, oldest failure first, among those failed within `lookback_s`. The insert is
-- the claim: a concurrent daemon's insert of the same job waits, then does nothing,
-- so each hook is called at most once. Returns the claimed jobs.
WITH due AS (
  SELECT j.id FROM jobsd.all_jobs AS j
  WHERE j.status = 'failed' AND j.type = ANY(%(types)s::text[])
    AND j.finished_at > coalesce(%(now)s::timestamptz, now())
                        - make_interval(secs => %(lookback_s)s::float8)
    AND NOT EXISTS (SELECT 1 FROM jobsd.fail_hooks AS h WHERE h.job_id = j.id)
  ORDER BY j.finished_at
  LIMIT %(limit)s),
claimed AS (
  INSERT INTO jobsd.fail_hooks (job_id, worker_id)
  SELECT d.id, %(worker_id)s FROM due AS d
  ON CONFLICT (job_id) DO NOTHING
  RETURNING job_id)
SELECT j.* FROM jobsd.all_jobs AS j JOIN claimed AS c ON c.job_id = j.id
ORDER BY j.finished_at;

-- name: jobs_running_health
SELECT oldest_running_age_s, oldest_running_idle_s, recovery_required
FROM jobsd.running_health();
