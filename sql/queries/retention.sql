-- Named queries of `jobsd prune` (jobsd/retention.py, docs/retention.md).

-- name: queues_retention
-- The clock of the whole prune, each queue's policy, and whether this role may prune:
-- under row-level security it would see (and count) one org's jobs only.
SELECT n.now, q.name, q.retention_days,
       row_security_active('jobsd.jobs') AS rls_active,
       has_table_privilege('jobsd.jobs', 'DELETE') AS may_delete,
       current_user::text AS role
FROM (SELECT coalesce(%(now)s::timestamptz, now()) AS now) AS n
LEFT JOIN jobsd.queues AS q ON true
ORDER BY q.name;

-- name: jobs_prune_scan
-- Read the next `limit` jobs in id order within [from_id, through_id] and return the
-- due ones among them: terminal, not of a spared type, finished before their cutoff
-- (the type's, else the queue's; no cutoff keeps the job). An ordered range scan of
-- the primary key that starts where the last batch stopped: a prune reads each range
-- once, however many batches it takes, and no statement reads more than `limit` rows.
-- The cutoffs come as parallel arrays (name -> timestamptz): an array lookup per row,
-- no join, so the plan stays an index scan that stops at `limit`.
WITH scanned AS (
  SELECT j.id, j.queue,
         j.status IN ('succeeded', 'failed', 'cancelled')
         AND j.finished_at < CASE
               WHEN j.type = ANY(%(spare_types)s::text[]) THEN NULL
               ELSE coalesce(
                 (%(type_cutoffs)s::timestamptz[])[array_position(%(types)s::text[], j.type)],
                 (%(queue_cutoffs)s::timestamptz[])[array_position(%(queues)s::text[], j.queue)])
             END AS due
  FROM jobsd.jobs AS j
  WHERE j.id >= %(from_id)s::uuid AND j.id <= %(through_id)s::uuid
  ORDER BY j.id
  LIMIT %(limit)s)
SELECT count(*)::integer AS scanned,
       (SELECT s.id FROM scanned AS s ORDER BY s.id DESC LIMIT 1) AS last_id,
       coalesce(array_agg(s.id ORDER BY s.id) FILTER (WHERE s.due), '{}') AS ids,
       coalesce(array_agg(s.queue ORDER BY s.id) FILTER (WHERE s.due), '{}') AS queues
FROM scanned AS s;

-- name: jobs_prune_delete
-- Delete one batch of candidates, in one short transaction (autocommit). SKIP LOCKED:
-- a row another session holds (a concurrent prune, a foreign-key check of an insert
-- naming the job) is left for the next run instead of waited for. The status is
-- checked again; a terminal job never changes status, type, queue or finished_at, so
-- the rest of the candidate test still holds. Its job_events rows go by the trigger
-- jobs_delete_events, its dependency edges (both ways) and on_fail record here.
WITH locked AS (
  SELECT j.id FROM jobsd.jobs AS j
  WHERE j.id = ANY(%(ids)s::uuid[])
    AND j.status IN ('succeeded', 'failed', 'cancelled')
  FOR UPDATE SKIP LOCKED),
gone AS (
  DELETE FROM jobsd.jobs AS j
  USING locked AS l
  WHERE j.id = l.id
  RETURNING j.id, j.queue),
gone_edges_out AS (
  DELETE FROM jobsd.job_dependencies AS d USING gone AS g WHERE d.job_id = g.id),
gone_edges_in AS (
  DELETE FROM jobsd.job_dependencies AS d USING gone AS g WHERE d.depends_on = g.id),
gone_hooks AS (
  DELETE FROM jobsd.fail_hooks AS h USING gone AS g WHERE h.job_id = g.id)
SELECT g.queue, count(*)::bigint AS deleted
FROM gone AS g
GROUP BY g.queue
ORDER BY g.queue;

-- name: archive_prune_scan
-- The archive's part of a prune, one month at a time: read the next `limit` jobs of
-- the month that ended in [from_at, until_at), in (finished_at, id) order after the
-- keyset (after_at, after_id), and return the due ones among them (the test of
-- jobs_prune_scan). until_at is at most the newest cutoff: no later job can be due.
WITH scanned AS (
  SELECT a.id, a.finished_at, a.queue,
         a.finished_at < CASE
               WHEN a.type = ANY(%(spare_types)s::text[]) THEN NULL
               ELSE coalesce(
                 (%(type_cutoffs)s::timestamptz[])[array_position(%(types)s::text[], a.type)],
                 (%(queue_cutoffs)s::timestamptz[])[array_position(%(queues)s::text[], a.queue)])
             END AS due
  FROM jobsd.jobs_archive AS a
  WHERE a.finished_at >= %(from_at)s::timestamptz AND a.finished_at < %(until_at)s::timestamptz
    AND (a.finished_at, a.id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
  ORDER BY a.finished_at, a.id
  LIMIT %(limit)s)
SELECT count(*)::integer AS scanned,
       (SELECT s.finished_at FROM scanned AS s ORDER BY s.finished_at DESC, s.id DESC LIMIT 1)
         AS last_at,
       (SELECT s.id FROM scanned AS s ORDER BY s.finished_at DESC, s.id DESC LIMIT 1)
         AS last_id,
       coalesce(array_agg(s.id ORDER BY s.finished_at, s.id) FILTER (WHERE s.due), '{}') AS ids,
       coalesce(array_agg(s.finished_at ORDER BY s.finished_at, s.id) FILTER (WHERE s.due),
                '{}') AS finished,
       coalesce(array_agg(s.queue ORDER BY s.finished_at, s.id) FILTER (WHERE s.due), '{}')
         AS queues
FROM scanned AS s;

-- name: archive_prune_delete
-- Delete one batch of due archived jobs (id and finished_at, so that each is looked
-- for in its month only), with their history, dependency edges and on_fail record.
-- An archived job never changes: no status check is needed. SKIP LOCKED as in
-- jobs_prune_delete (a retry holding the job).
WITH wanted AS (
  SELECT w.id, w.finished_at
  FROM unnest(%(ids)s::uuid[], %(finished)s::timestamptz[]) AS w(id, finished_at)),
locked AS (
  SELECT a.id, a.finished_at FROM jobsd.jobs_archive AS a
  JOIN wanted AS w ON a.id = w.id AND a.finished_at = w.finished_at
  FOR UPDATE OF a SKIP LOCKED),
gone AS (
  DELETE FROM jobsd.jobs_archive AS a USING locked AS l
  WHERE a.id = l.id AND a.finished_at = l.finished_at
  RETURNING a.id, a.finished_at, a.queue),
gone_events AS (
  DELETE FROM jobsd.job_events_archive AS e USING gone AS g
  WHERE e.job_id = g.id AND e.job_finished_at = g.finished_at),
gone_edges_out AS (
  DELETE FROM jobsd.job_dependencies AS d USING gone AS g WHERE d.job_id = g.id),
gone_edges_in AS (
  DELETE FROM jobsd.job_dependencies AS d USING gone AS g WHERE d.depends_on = g.id),
gone_hooks AS (
  DELETE FROM jobsd.fail_hooks AS h USING gone AS g WHERE h.job_id = g.id)
SELECT g.queue, count(*)::bigint AS deleted
FROM gone AS g
GROUP BY g.queue
ORDER BY g.queue;
