-- Named queries of the HTTP API: bearer tokens, and jobs as one org sees them.
-- Every read of a job is scoped by org_id in SQL: a job of another org is not
-- found, exactly like a missing one. In addition, each job query runs in an
-- implicit transaction that starts with api_set_org (jobsd.http.queries.run_for_org),
-- so row-level security hides the other orgs even from a forgotten WHERE.

-- name: api_set_org
-- Transaction-local: ends with the query's implicit transaction (or the caller's).
SELECT set_config('jobsd.org_id', %(org_id)s, true);

-- name: api_tokens_insert
-- admin: the token may also administer queues (/queues; migration 0008's column).
INSERT INTO jobsd.api_tokens (org_id, name, prefix, token_hash, admin)
VALUES (%(org_id)s, %(name)s, %(prefix)s, %(token_hash)s, %(admin)s)
RETURNING id, org_id, name, prefix, created_at, revoked_at, admin;

-- name: api_tokens_lookup
-- Before the org is known, through a SECURITY DEFINER function (migration 0012):
-- api_tokens has row-level security, and the API's role reads no token row itself.
SELECT id, org_id, admin FROM jobsd.api_token_lookup(%(token_hash)s::bytea);

-- name: api_tokens_revoke
-- By id or by the token's hash. Revoking twice keeps the first revocation time.
UPDATE jobsd.api_tokens SET revoked_at = coalesce(revoked_at, now())
WHERE id = %(id)s::uuid OR token_hash = %(token_hash)s::bytea
RETURNING id, org_id, name, prefix, created_at, revoked_at, admin;

-- name: api_tokens_list
SELECT id, org_id, name, prefix, created_at, revoked_at, admin FROM jobsd.api_tokens
WHERE %(org_id)s::text IS NULL OR org_id = %(org_id)s::text
ORDER BY org_id NULLS FIRST, created_at, id;

-- name: api_jobs_get
-- One job with its history and its retry, read in one statement (one snapshot), the
-- history as parallel arrays in event order; of one org (org_id set) or of any (null).
-- The job may be open (jobsd.jobs) or archived (jobsd.jobs_archive): all_jobs and
-- all_job_events read both.
SELECT j.*, h.*,
       (SELECT r.id FROM jobsd.all_jobs AS r WHERE r.retry_of = j.id LIMIT 1) AS retried_as
FROM jobsd.all_jobs AS j
CROSS JOIN LATERAL (
  SELECT array_agg(e.id ORDER BY e.id) AS h_id,
         array_agg(e.from_status ORDER BY e.id) AS h_from,
         array_agg(e.to_status ORDER BY e.id) AS h_to,
         array_agg(e.at ORDER BY e.id) AS h_at,
         array_agg(e.attempt ORDER BY e.id) AS h_attempt,
         array_agg(e.reason ORDER BY e.id) AS h_reason,
         array_agg(e.worker_id ORDER BY e.id) AS h_worker
  FROM jobsd.all_job_events AS e
  WHERE e.job_id = j.id) AS h
WHERE j.id = %(id)s AND (%(org_id)s::text IS NULL OR j.org_id = %(org_id)s::text);

-- name: api_jobs_status
-- The cheap re-read of a long-poll: is the job terminal yet? Of one org (org_id set)
-- or of any (null); open or archived.
SELECT status FROM jobsd.all_jobs
WHERE id = %(id)s AND (%(org_id)s::text IS NULL OR org_id = %(org_id)s::text);

-- name: api_jobs_list
-- One org's jobs, newest first, after a keyset cursor (created_at, id): the first
-- page passes ('infinity', 'ffffffff-...'); the filters of jobs_list; open and
-- archived jobs. Reads jobs_org_created_idx and each archive month's (org_id,
-- created_at, id) index backwards, merged.
SELECT * FROM jobsd.all_jobs
WHERE org_id = %(org_id)s
  AND (created_at, id) < (%(before_created_at)s::timestamptz, %(before_id)s::uuid)
  AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s::timestamptz)
  AND (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(type)s::text IS NULL OR type = %(type)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;

-- name: api_jobs_cancel
-- Cancel a job that has not started, in one org. The API cancels through
-- jobs_cancel; the row-level-security tests use this one as a write probe.
UPDATE jobsd.jobs
SET status = 'cancelled', reason = 'cancelled by API', finished_at = now(), dedup_key = NULL
WHERE id = %(id)s AND org_id = %(org_id)s AND status IN ('queued', 'scheduled', 'blocked')
RETURNING *;

-- name: api_jobs_depth
-- Queue depth by declared queue and state (queued, scheduled, running,
-- recovery_required), zeros included, for /metrics: every org's jobs, through the
-- SECURITY DEFINER function of migration 0030 (the API's role may see one org only).
SELECT queue, status, jobs FROM jobsd.queue_depth_v2();

-- name: api_queue_oldest_age
-- Per declared queue, how long its oldest due job not yet started has been due (0:
-- none), and whether the queue is paused, for /metrics: every org's jobs, among each
-- queue's next 1,000 in claim order (SECURITY DEFINER, migration 0030). "now" null:
-- the database's clock.
SELECT queue, paused, age_s FROM jobsd.queue_oldest_age(%(now)s::timestamptz);

-- name: api_health_report
-- What makes a queue table sick before it shows: pickup lag (the longest wait
-- among the next 1,000 jobs in claim order, every org's: a SECURITY DEFINER
-- function of migration 0007), dead tuples on jobs (statistics: no row-level
-- security), and the oldest
-- open transaction or prepared transaction in this database (they hold back
-- vacuum). Ages are null when there is nothing to measure; the caller clamps
-- them at 0 (a transaction may start after this statement). Other roles'
-- sessions are visible only with pg_read_all_stats.
SELECT
  jobsd.oldest_queued_age_s() AS oldest_queued_age_s,
  s.n_live_tup AS live_tuples,
  s.n_dead_tup AS dead_tuples,
  greatest(s.last_vacuum, s.last_autovacuum) AS last_vacuum_at,
  (SELECT extract(epoch FROM now() - min(a.xact_start))::float8
   FROM pg_stat_activity AS a
   WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
     AND a.backend_type = 'client backend'
     AND (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)) AS oldest_xact_age_s,
  (SELECT extract(epoch FROM now() - min(p.prepared))::float8
   FROM pg_prepared_xacts AS p
   WHERE p.database = current_database()) AS oldest_prepared_xact_age_s,
  -- share of the cluster's NOTIFY queue in use: a listener stuck in a transaction
  -- holds it; at 1.0 every enqueue that notifies fails
  pg_notification_queue_usage() AS notify_queue_usage,
  -- liveness per job (migration 0015): the oldest running job's age and time since
  -- its last progress, and the recovery_required backlog, every org's
  r.oldest_running_age_s, r.oldest_running_idle_s, r.recovery_required
FROM pg_stat_user_tables AS s
CROSS JOIN jobsd.running_health() AS r
WHERE s.relid = 'jobsd.jobs'::regclass;

-- name: api_ping
SELECT 1 AS ok;

-- name: api_notify_queue_usage
-- Share of the cluster's NOTIFY queue in use (0 to 1), for /metrics.
SELECT pg_notification_queue_usage() AS usage;

-- name: api_set_statement_timeout
-- Transaction-local: bounds the introspection queries of /metrics and /health.
SELECT set_config('statement_timeout', %(timeout_ms)s, true);

-- name: api_role_bypass
-- What lets the API's role past row-level security on jobs, if anything: superuser,
-- BYPASSRLS, the tables' owner (or a member of it), or an all-orgs policy (the
-- worker's). Empty text when nothing does.
SELECT current_user AS role,
       concat_ws(', ',
         CASE WHEN r.rolsuper THEN 'superuser' END,
         CASE WHEN r.rolbypassrls THEN 'BYPASSRLS' END,
         CASE WHEN pg_has_role(c.relowner, 'MEMBER') THEN 'owner of the tables' END,
         CASE WHEN EXISTS (
           SELECT 1 FROM pg_policy AS p
           WHERE p.polrelid = c.oid AND p.polpermissive
             AND pg_get_expr(p.polqual, p.polrelid) = 'true'
             AND EXISTS (SELECT 1 FROM unnest(p.polroles) AS pr(oid)
                         WHERE pr.oid <> 0 AND pg_has_role(pr.oid, 'USAGE')))
           THEN 'an all-orgs policy' END) AS bypass
FROM pg_roles AS r, pg_class AS c
WHERE r.rolname = current_user AND c.oid = 'jobsd.jobs'::regclass;

-- name: api_done_notify_key
-- The key that hashes job ids in 'jobsd_done' payloads (migration 0012).
SELECT jobsd.done_notify_key() AS key;
