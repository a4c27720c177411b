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
-- the rest of the candidate test still holds. Its job_events and job_dependencies
-- rows go by ON DELETE CASCADE (bench/README.md: as fast as deleting the events
-- first).
WITH locked AS (
  SELECT j.id FROM jobsd.jobs AS j
  WHERE j.id = ANY(%(ids)s::uuid[])
    AND j.status IN ('succeeded', 'failed', 'cancelled')
  FOR UPDATE SKIP LOCKED),
gone AS (
  DELETE FROM jobsd.jobs AS j
  USING locked AS l
  WHERE j.id = l.id
  RETURNING j.queue)
SELECT g.queue, count(*)::bigint AS deleted
FROM gone AS g
GROUP BY g.queue
ORDER BY g.queue;
