-- Named queries of the archive of ended jobs (migration 0027; docs/retention.md):
-- the daemons' move, the months created ahead, and what a prune drops.

-- name: archive_move
-- Move one batch of jobs that ended more than min_age_s ago (the database's clock),
-- with their history, into the archive; how many moved.
SELECT jobsd.archive_move(%(limit)s::int, %(min_age_s)s::float8) AS moved;

-- name: archive_ensure_ahead
-- The archive's months from this one to `months` months ahead exist (created if
-- missing); how many were created.
SELECT jobsd.archive_ensure(now(), now() + make_interval(months => %(months)s::int))
  AS created;

-- name: archive_months
-- The archive's months, oldest first, with the (queue, type) pairs each holds.
SELECT month, partition_name, events_partition_name, contents
FROM jobsd.archive_months();

-- name: archive_drop
-- Drop one month of the archive (jobs and history), waiting at most
-- lock_timeout_ms for its readers.
SELECT jobsd.archive_drop(%(month)s::timestamptz, %(lock_timeout_ms)s::int) AS dropped;

-- name: archive_forget_orphans
-- After months were dropped: the dependency edges (either end) and on_fail records
-- of jobs that exist nowhere any more, at most `limit` of each per call.
WITH edges AS (
  DELETE FROM jobsd.job_dependencies AS d
  WHERE d.ctid = ANY(ARRAY(
    SELECT x.ctid FROM jobsd.job_dependencies AS x
    WHERE NOT EXISTS (SELECT 1 FROM jobsd.all_jobs AS j WHERE j.id = x.job_id)
       OR NOT EXISTS (SELECT 1 FROM jobsd.all_jobs AS j WHERE j.id = x.depends_on)
    LIMIT %(limit)s))
  RETURNING 1),
hooks AS (
  DELETE FROM jobsd.fail_hooks AS h
  WHERE h.job_id = ANY(ARRAY(
    SELECT x.job_id FROM jobsd.fail_hooks AS x
    WHERE x.called_at < %(before)s::timestamptz
      AND NOT EXISTS (SELECT 1 FROM jobsd.all_jobs AS j WHERE j.id = x.job_id)
    LIMIT %(limit)s))
  RETURNING 1)
SELECT (SELECT count(*) FROM edges) AS edges, (SELECT count(*) FROM hooks) AS hooks;

-- name: archive_backlog
-- Jobs that ended and wait in the hot table for the move, and the oldest end among
-- them (null: none), every org's.
SELECT count(*) AS jobs, min(finished_at) AS oldest_finished_at
FROM jobsd.jobs WHERE finished_at IS NOT NULL;
