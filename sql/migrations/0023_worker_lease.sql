-- jobsd schema, version 23: a daemon's liveness is its lease, apart from its jobs'
-- progress (docs/semantics.md, "When a daemon counts as dead").
--
-- Each daemon renews alive_until (now() + its lease) on the connection that holds its
-- lock, every few seconds. A daemon counts as dead only when its lock is free AND its
-- lease has run out: a live daemon that loses the lock's connection (a restart of a
-- middlebox, pg_terminate_backend) takes its lock again within its lease, and one that
-- cannot stops its handlers before the lease ends, so no rescue overlaps a run.
--
-- A running job's progress.updated_at is written by its handler's progress only: it
-- says how long the handler has been silent, not whether its daemon lives.
--
-- Rows written before this version get a lease that has already ended: a daemon of an
-- earlier version is then dead as soon as its lock is free, as it was, and counts as
-- unresponsive (its jobs rescued) JOBSD_STALE_AFTER later: restart every daemon after
-- this migration.
--
-- Never edit this file once shipped: add a new numbered migration instead.

ALTER TABLE jobsd.workers ADD COLUMN alive_until timestamptz NOT NULL DEFAULT now();

-- The longest silence among running jobs: the time since the handler's last progress
-- or, if later, this run's start (a re-run carries its previous run's progress).
CREATE OR REPLACE FUNCTION jobsd.running_health()
RETURNS TABLE (oldest_running_age_s float8, oldest_running_idle_s float8,
               recovery_required bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
  SELECT
    (SELECT extract(epoch FROM now() - min(j.started_at))::float8
     FROM jobsd.jobs AS j WHERE j.status = 'running'),
    (SELECT extract(epoch FROM now() - min(greatest(
               (j.progress ->> 'updated_at')::timestamptz, j.started_at)))::float8
     FROM jobsd.jobs AS j WHERE j.status = 'running'),
    (SELECT count(*) FROM jobsd.jobs AS j WHERE j.status = 'recovery_required')
$$;
