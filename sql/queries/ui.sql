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
-- jobs_active_idx).
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
