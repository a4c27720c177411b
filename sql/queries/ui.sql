-- Named queries of the dashboard (/ui) and `jobsd top`: reads for people, off the
-- hot path. An org's reads run with jobsd.org_id set (store.api.run_for_org) and
-- filter by org in SQL too; an admin's read every org (no org set: the API must then
-- run as a role that sees every org, docs/ui.md). "now" is a parameter (null: the
-- database's clock) so tests can pin it.

-- name: ui_no_jit
-- Transaction-local, before each dashboard read: these are small indexed reads, and a
-- plan whose estimate crosses jit_above_cost (a subquery per queue over a never-
-- analyzed jobsd.queues does) would spend 50+ ms compiling for a 1 ms execution.
SELECT set_config('jit', 'off', true);

-- name: ui_open_counts_org
-- One org's open jobs by queue and state (an admin reads jobsd.queue_info instead):
-- jobs_open_by_queue_org_idx holds only open jobs.
SELECT queue, status, count(*) AS jobs
FROM jobsd.jobs
WHERE org_id = %(org_id)s
  AND status IN ('queued', 'scheduled', 'blocked', 'running', 'recovery_required')
GROUP BY queue, status;

-- name: ui_throughput
-- Jobs finished per queue and minute over the last `minutes` (0 = the current
-- minute), succeeded and failed apart: jobs_finished_idx reads only the window.
SELECT queue,
       floor(extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - finished_at) / 60)::int
         AS minutes_ago,
       count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE status = 'failed') AS failed,
       count(*) FILTER (WHERE status = 'cancelled') AS cancelled
FROM jobsd.all_jobs
WHERE finished_at IS NOT NULL
  AND finished_at > coalesce(%(now)s::timestamptz, now()) - make_interval(mins => %(minutes)s)
  AND (%(org_id)s::text IS NULL OR org_id = %(org_id)s::text)
GROUP BY 1, 2;

-- name: ui_pickup_lag
-- Per queue, how long the longest-waiting of its next 100 queued jobs (claim
-- order, jobs_claim_v2_idx) has been due: what /health reports, queue by queue.
SELECT q.name AS queue,
       (SELECT extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - min(n.run_after))::float8
        FROM (SELECT j.run_after FROM jobsd.jobs AS j
              WHERE j.queue = q.name AND j.status = 'queued'
                AND (%(org_id)s::text IS NULL OR j.org_id = %(org_id)s::text)
              ORDER BY j.priority, j.created_at, j.id
              LIMIT 100) AS n) AS lag_s
FROM jobsd.queues AS q
ORDER BY q.name;

-- name: ui_workers
-- The registered daemons with the number of jobs each holds (running jobs are in
-- jobs_running_idx).
SELECT w.worker_id, w.hostname, w.pid, w.started_at, w.last_seen_at,
       coalesce(h.jobs, 0) AS jobs_held
FROM jobsd.workers AS w
LEFT JOIN (SELECT worker_id, count(*) AS jobs FROM jobsd.jobs
           WHERE status = 'running' GROUP BY worker_id) AS h ON h.worker_id = w.worker_id
ORDER BY w.started_at, w.worker_id;

-- name: ui_recent_failures
-- The latest failed jobs (newest first), through jobs_failed_idx and the archive's
-- jobs_archive_failed_idx.
SELECT id, org_id, type, queue, attempts, error, reason, finished_at
FROM jobsd.all_jobs
WHERE finished_at IS NOT NULL AND status = 'failed'
  AND (%(org_id)s::text IS NULL OR org_id = %(org_id)s::text)
ORDER BY finished_at DESC
LIMIT %(limit)s;

-- name: ui_stats_setup
-- Transaction-local, before each read of the per-type figures: no JIT (as
-- ui_no_jit), and a plan for the filters given (an org, a type, or neither) rather
-- than one generic plan for all: that plan could not pick the index of the filter.
SELECT set_config('jit', 'off', true), set_config('plan_cache_mode', 'force_custom_plan', true);

-- name: ui_type_figures
-- What ended per type over the last hour (`span` 'hour': this UTC minute and the 59
-- before it, each apart: `minutes_ago`, 0 the current one) and the last day ('day':
-- this minute and the 1,439 before it), by run-duration bucket, from the rollup (minute
-- rows for the hour and for the day's first, partial hour, hour rows for the rest of
-- the day) and the ended jobs not archived yet (jobs_finished_idx). A job is in one or
-- the other, never both: one statement sees the move that takes it from jobs to the
-- rollup, or not. One org's (`org_id`) from jobsd.type_stats, every org's (null) from
-- jobsd.type_stats_all_orgs: a plan made for the parameters reads only the one it
-- needs (ui_stats_setup). `type`: null for any.
WITH w AS (
  SELECT n.m, n.m + interval '1 minute' AS end_at,
         n.m - interval '59 minutes' AS hour_from,
         n.m - interval '1439 minutes' AS day_from,
         jobsd.type_stats_start('hour', n.m - interval '1439 minutes') + interval '1 hour'
           AS hours_from
  FROM (SELECT jobsd.type_stats_start('minute', coalesce(%(now)s::timestamptz, now())) AS m) AS n
), rolled AS (
  SELECT s.period, s.start_at, s.type, s.run_bucket, s.succeeded, s.failed, s.cancelled,
         s.run_s
  FROM w JOIN jobsd.type_stats AS s
    ON (s.period = 'minute' AND s.start_at >= w.hour_from AND s.start_at < w.end_at)
    OR (s.period = 'minute' AND s.start_at >= w.day_from AND s.start_at < w.hours_from)
    OR (s.period = 'hour' AND s.start_at >= w.hours_from AND s.start_at < w.end_at)
  WHERE %(org_id)s::text IS NOT NULL AND s.org_id = %(org_id)s::text
    AND (%(type)s::text IS NULL OR s.type = %(type)s::text)
  UNION ALL
  SELECT a.period, a.start_at, a.type, a.run_bucket, a.succeeded, a.failed, a.cancelled,
         a.run_s
  FROM w JOIN jobsd.type_stats_all_orgs AS a
    ON (a.period = 'minute' AND a.start_at >= w.hour_from AND a.start_at < w.end_at)
    OR (a.period = 'minute' AND a.start_at >= w.day_from AND a.start_at < w.hours_from)
    OR (a.period = 'hour' AND a.start_at >= w.hours_from AND a.start_at < w.end_at)
  WHERE %(org_id)s::text IS NULL
    AND (%(type)s::text IS NULL OR a.type = %(type)s::text)
), parts AS (
  SELECT 'hour' AS span, r.start_at AS minute, r.type, r.run_bucket, r.succeeded, r.failed,
         r.cancelled, r.run_s
  FROM w JOIN rolled AS r ON r.period = 'minute' AND r.start_at >= w.hour_from
  UNION ALL
  SELECT 'day', NULL, r.type, r.run_bucket, r.succeeded, r.failed, r.cancelled, r.run_s
  FROM w JOIN rolled AS r ON r.period = 'hour' OR r.start_at < w.hours_from
  UNION ALL
  SELECT x.span, CASE WHEN x.span = 'hour' THEN jobsd.type_stats_start('minute', j.finished_at) END,
         j.type, jobsd.type_stats_bucket(j.started_at, j.finished_at),
         (j.status = 'succeeded')::int, (j.status = 'failed')::int,
         (j.status = 'cancelled')::int,
         coalesce(jobsd.run_seconds(j.started_at, j.finished_at), 0)
  FROM w JOIN jobsd.jobs AS j
    ON j.finished_at IS NOT NULL AND j.finished_at >= w.day_from AND j.finished_at < w.end_at
  CROSS JOIN (VALUES ('hour'), ('day')) AS x(span)
  WHERE j.status IN ('succeeded', 'failed', 'cancelled')
    AND (x.span = 'day' OR j.finished_at >= w.hour_from)
    AND (%(org_id)s::text IS NULL OR j.org_id = %(org_id)s::text)
    AND (%(type)s::text IS NULL OR j.type = %(type)s::text)
)
SELECT p.span, (pg_catalog.date_part('epoch', w.m - p.minute) / 60)::int AS minutes_ago,
       p.type, p.run_bucket, sum(p.succeeded)::bigint AS succeeded,
       sum(p.failed)::bigint AS failed, sum(p.cancelled)::bigint AS cancelled,
       sum(p.run_s)::float8 AS run_s
FROM parts AS p CROSS JOIN w
GROUP BY p.span, p.minute, p.type, p.run_bucket, w.m;
