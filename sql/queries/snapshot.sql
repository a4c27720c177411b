-- Named queries of `jobsd export` (docs/snapshot.md). They run in one read-only
-- REPEATABLE READ transaction: every one of them sees the same moment.

-- name: snapshot_meta
-- now() is the start of the transaction: the moment the snapshot shows.
SELECT now() AS generated_at,
       current_database() AS database_name,
       current_setting('server_version') AS server_version,
       to_regclass('jobsd.schema_migrations') IS NOT NULL AS migrated;

-- name: snapshot_schema
-- The schema version, and whether the current role sees every org's jobs for reads:
-- row-level security does not apply to it (superuser, owner, BYPASSRLS), or a
-- permissive read policy with a true condition applies to it. A role limited to one
-- org would export a snapshot that silently misses the other orgs.
SELECT (SELECT max(m.version) FROM jobsd.schema_migrations AS m) AS schema_version,
       NOT row_security_active('jobsd.jobs')
       OR (SELECT bool_or(p.polcmd IN ('*', 'r'))
           FROM pg_policy AS p
           WHERE p.polrelid = 'jobsd.jobs'::regclass AND p.polpermissive
             AND pg_get_expr(p.polqual, p.polrelid) = 'true'
             AND EXISTS (SELECT 1 FROM unnest(p.polroles) AS r(oid)
                         WHERE r.oid = 0 OR pg_has_role(r.oid, 'USAGE'))) IS TRUE
       AS sees_all_orgs;

-- name: snapshot_queues
-- Every queue with its controls and the number of open jobs in each open state.
-- The predicate is the one of the partial index jobs_open_by_queue_org_idx.
WITH open_jobs AS (
  SELECT j.queue, j.status, count(*) AS n
  FROM jobsd.jobs AS j
  WHERE j.status NOT IN ('succeeded', 'failed', 'cancelled')
  GROUP BY j.queue, j.status)
SELECT q.name, q.capacity, q.concurrency_limit, q.retention_days, q.paused_at,
       q.created_at,
       coalesce(sum(o.n) FILTER (WHERE o.status = 'queued'), 0)::bigint AS queued,
       coalesce(sum(o.n) FILTER (WHERE o.status = 'scheduled'), 0)::bigint AS scheduled,
       coalesce(sum(o.n) FILTER (WHERE o.status = 'blocked'), 0)::bigint AS blocked,
       coalesce(sum(o.n) FILTER (WHERE o.status = 'running'), 0)::bigint AS running,
       coalesce(sum(o.n) FILTER (WHERE o.status = 'recovery_required'), 0)::bigint
         AS recovery_required
FROM jobsd.queues AS q
LEFT JOIN open_jobs AS o ON o.queue = q.name
GROUP BY q.name
ORDER BY q.name;

-- name: snapshot_jobs
-- Every open job, by queue then in claim order. payload and progress come as JSON
-- text, written out as stored (a parse and re-dump could round big numbers).
-- depends_on lists the job's dependencies, whatever their state.
SELECT j.id, j.org_id, j.queue, j.type, j.status, j.priority, j.concurrency_key,
       j.dedup_key, j.attempts, j.run_after, j.created_at, j.started_at, j.worker_id,
       j.cancel_requested_at, j.reason,
       coalesce((SELECT array_agg(d.depends_on ORDER BY d.depends_on)
                 FROM jobsd.job_dependencies AS d
                 WHERE d.job_id = j.id), '{}') AS depends_on,
       j.progress::text AS progress,
       j.payload::text AS payload
FROM jobsd.jobs AS j
WHERE j.status NOT IN ('succeeded', 'failed', 'cancelled')
ORDER BY j.queue, j.priority, j.created_at, j.id;
