-- jobsd schema, version 29: per-type figures of ended jobs, kept as they are archived.
--
-- * jobsd.type_stats: what ended, per UTC minute and per UTC hour (`period`), org,
--   queue, type and run-duration bucket: how many succeeded, failed and were
--   cancelled, and the sum of their run durations (finished_at - started_at of the
--   final run, in seconds). The dashboard's per-type pages (/ui/types) read it: a day
--   of figures is at most 24 hour rows and 60 minute rows per (org, queue, type,
--   bucket), whatever the number of jobs.
-- * jobsd.type_stats_all_orgs: the same counts summed over every org and queue, for
--   an operator's view of every org, which then costs what one org's does whatever
--   the number of orgs. Only the roles that see every org's jobs read it.
-- * The run-duration buckets are log-spaced, two per doubling: bucket 0 is under
--   1 ms, bucket k (1..62) is [2^((k-1)/2), 2^(k/2)) ms, bucket 63 is 2^31 ms
--   (24.9 days) and more, and -1 holds the jobs that never ran (cancelled while
--   queued). A percentile read from them is within its bucket's width (41 %).
-- * jobsd.archive_move fills it: the jobs a batch moves are counted in the same
--   statement that moves them. A job is counted once: in the rollup once archived,
--   read from jobsd.jobs (jobs_finished_idx) until then; one statement sees one or
--   the other. The function keeps its signature, its behaviour and its `SELECT *`
--   copy of the rows; its upserts now take their row locks in key order, so that two
--   daemons moving at once wait for each other instead of deadlocking.
-- * Its own retention: rows older than 2 days (the pages show a day) are deleted by
--   the move, and jobs that ended before then are not counted (a backlog moved after
--   an upgrade). Pruning or dropping archived jobs leaves their counts.
-- * Backfilled here from the archive's last 2 days. The archive is locked against
--   moves for the backfill; a move that was already running the old function when
--   this migration commits (at most one batch per daemon) is not counted.
-- * Row-level security as on jobs: an org reads its own rows of type_stats, and none
--   of type_stats_all_orgs. The roles that read jobsd.jobs read both, and the all-orgs
--   policies of jobsd.jobs hold on both, so an upgrade needs no `jobsd roles create`.
--   Only the move writes them.
-- * jobsd.schedule_info reads the state of a schedule's last job in the archive too
--   (it read jobsd.jobs only: an archived job had no state).
--
-- Never edit this file once shipped: add a new numbered migration instead.

LOCK TABLE jobsd.jobs_archive IN SHARE MODE;

CREATE TABLE jobsd.type_stats (
  period      text NOT NULL CHECK (period IN ('minute', 'hour')),
  start_at    timestamptz NOT NULL,
  org_id      text NOT NULL,
  queue       text NOT NULL,
  type        text NOT NULL,
  run_bucket  smallint NOT NULL CHECK (run_bucket BETWEEN -1 AND 63),
  succeeded   bigint NOT NULL,
  failed      bigint NOT NULL,
  cancelled   bigint NOT NULL,
  run_s       double precision NOT NULL,
  PRIMARY KEY (period, start_at, org_id, queue, type, run_bucket)
);
-- one org's types, and one org's type
CREATE INDEX type_stats_org_idx ON jobsd.type_stats (period, org_id, type, start_at);

CREATE TABLE jobsd.type_stats_all_orgs (
  period      text NOT NULL CHECK (period IN ('minute', 'hour')),
  start_at    timestamptz NOT NULL,
  type        text NOT NULL,
  run_bucket  smallint NOT NULL CHECK (run_bucket BETWEEN -1 AND 63),
  succeeded   bigint NOT NULL,
  failed      bigint NOT NULL,
  cancelled   bigint NOT NULL,
  run_s       double precision NOT NULL,
  PRIMARY KEY (period, start_at, type, run_bucket)
);

-- every org's counts: no policy but the all-orgs ones of jobs (copied below)
ALTER TABLE jobsd.type_stats_all_orgs ENABLE ROW LEVEL SECURITY;

ALTER TABLE jobsd.type_stats ENABLE ROW LEVEL SECURITY;
CREATE POLICY type_stats_org_isolation ON jobsd.type_stats
  USING (org_id = (SELECT jobsd.current_org()))
  WITH CHECK (org_id = (SELECT jobsd.current_org()));

-- The first instant of the UTC minute or hour (p_period) of p_at.
-- (No SET clause, every name qualified: the planner inlines it.)
CREATE FUNCTION jobsd.type_stats_start(p_period text, p_at timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT pg_catalog.timezone('UTC', pg_catalog.date_trunc(p_period, pg_catalog.timezone('UTC', p_at))) $$;

-- A run's duration in seconds (0 when the clock went back); null when it never ran.
CREATE FUNCTION jobsd.run_seconds(p_started timestamptz, p_finished timestamptz)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT GREATEST(pg_catalog.date_part('epoch', p_finished - p_started), 0) $$;

-- The run-duration bucket of a run (see above); -1 when it never ran.
CREATE FUNCTION jobsd.type_stats_bucket(p_started timestamptz, p_finished timestamptz)
RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
  SELECT (CASE
    WHEN p_started IS NULL OR p_finished IS NULL THEN -1
    WHEN jobsd.run_seconds(p_started, p_finished) < 0.001 THEN 0
    ELSE LEAST(pg_catalog.floor(2 * pg_catalog.ln(jobsd.run_seconds(p_started, p_finished) * 1000)
                                / pg_catalog.ln(2)) + 1, 63)
  END)::smallint
$$;

CREATE OR REPLACE FUNCTION jobsd.archive_move(p_limit integer, p_min_age_s double precision)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
-- a batch is a few milliseconds of work: compiling it would cost more
SET jit = off
AS $$
DECLARE
  v_before timestamptz := now() - make_interval(secs => p_min_age_s);
  -- how far back jobsd.type_stats counts
  v_since timestamptz := now() - interval '2 days';
  v_ids uuid[];
  v_first timestamptz;
  v_last timestamptz;
  v_moved integer;
BEGIN
  -- the batch, locked until the end of the transaction; then the months it needs
  SELECT array_agg(p.id), min(p.finished_at), max(p.finished_at)
  INTO v_ids, v_first, v_last
  FROM (SELECT j.id, j.finished_at FROM jobsd.jobs AS j
        WHERE j.finished_at < v_before
          AND j.status IN ('succeeded', 'failed', 'cancelled')
        ORDER BY j.finished_at
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED) AS p;
  IF v_ids IS NULL THEN
    RETURN 0;
  END IF;
  PERFORM jobsd.archive_ensure(v_first, v_last);
  WITH moved AS (
    DELETE FROM jobsd.jobs AS j
    WHERE j.id = ANY(v_ids)
    RETURNING j.*),
  jobs_in AS (
    INSERT INTO jobsd.jobs_archive SELECT * FROM moved
    RETURNING 1),
  events_in AS (
    INSERT INTO jobsd.job_events_archive
    SELECT e.*, m.finished_at FROM jobsd.job_events AS e JOIN moved AS m ON m.id = e.job_id
    RETURNING 1),
  contents AS (
    INSERT INTO jobsd.archive_contents AS c (month, queue, type, jobs)
    SELECT jobsd.archive_month(m.finished_at), m.queue, m.type, count(*)
    FROM moved AS m GROUP BY 1, 2, 3
    ORDER BY 1, 2, 3
    ON CONFLICT (month, queue, type) DO UPDATE SET jobs = c.jobs + excluded.jobs
    RETURNING 1),
  stats AS (
    INSERT INTO jobsd.type_stats AS s (period, start_at, org_id, queue, type, run_bucket,
                                       succeeded, failed, cancelled, run_s)
    SELECT p.period, jobsd.type_stats_start(p.period, m.finished_at), m.org_id, m.queue,
           m.type, jobsd.type_stats_bucket(m.started_at, m.finished_at),
           count(*) FILTER (WHERE m.status = 'succeeded'),
           count(*) FILTER (WHERE m.status = 'failed'),
           count(*) FILTER (WHERE m.status = 'cancelled'),
           coalesce(sum(jobsd.run_seconds(m.started_at, m.finished_at)), 0)
    FROM moved AS m CROSS JOIN (VALUES ('minute'), ('hour')) AS p(period)
    WHERE m.finished_at >= v_since
    GROUP BY 1, 2, 3, 4, 5, 6
    ORDER BY 1, 2, 3, 4, 5, 6
    ON CONFLICT (period, start_at, org_id, queue, type, run_bucket) DO UPDATE
    SET succeeded = s.succeeded + excluded.succeeded,
        failed = s.failed + excluded.failed,
        cancelled = s.cancelled + excluded.cancelled,
        run_s = s.run_s + excluded.run_s
    RETURNING 1),
  stats_all AS (
    INSERT INTO jobsd.type_stats_all_orgs AS s (period, start_at, type, run_bucket,
                                                succeeded, failed, cancelled, run_s)
    SELECT p.period, jobsd.type_stats_start(p.period, m.finished_at), m.type,
           jobsd.type_stats_bucket(m.started_at, m.finished_at),
           count(*) FILTER (WHERE m.status = 'succeeded'),
           count(*) FILTER (WHERE m.status = 'failed'),
           count(*) FILTER (WHERE m.status = 'cancelled'),
           coalesce(sum(jobsd.run_seconds(m.started_at, m.finished_at)), 0)
    FROM moved AS m CROSS JOIN (VALUES ('minute'), ('hour')) AS p(period)
    WHERE m.finished_at >= v_since
    GROUP BY 1, 2, 3, 4
    ORDER BY 1, 2, 3, 4
    ON CONFLICT (period, start_at, type, run_bucket) DO UPDATE
    SET succeeded = s.succeeded + excluded.succeeded,
        failed = s.failed + excluded.failed,
        cancelled = s.cancelled + excluded.cancelled,
        run_s = s.run_s + excluded.run_s
    RETURNING 1)
  -- (every part runs to completion, read or not; the hot history of the moved jobs
  -- goes with them through the trigger jobs_delete_events)
  SELECT count(*) INTO v_moved FROM jobs_in;
  -- the figures beyond the rollup's reach (an hour row that began before it, too)
  DELETE FROM jobsd.type_stats AS s
  WHERE s.period IN ('minute', 'hour') AND s.start_at < v_since - interval '1 hour';
  DELETE FROM jobsd.type_stats_all_orgs AS s
  WHERE s.period IN ('minute', 'hour') AND s.start_at < v_since - interval '1 hour';
  RETURN v_moved;
END
$$;

-- What the archive holds of the rollup's reach, counted as the move counts it.
INSERT INTO jobsd.type_stats (period, start_at, org_id, queue, type, run_bucket,
                              succeeded, failed, cancelled, run_s)
SELECT p.period, jobsd.type_stats_start(p.period, a.finished_at), a.org_id, a.queue, a.type,
       jobsd.type_stats_bucket(a.started_at, a.finished_at),
       count(*) FILTER (WHERE a.status = 'succeeded'),
       count(*) FILTER (WHERE a.status = 'failed'),
       count(*) FILTER (WHERE a.status = 'cancelled'),
       coalesce(sum(jobsd.run_seconds(a.started_at, a.finished_at)), 0)
FROM jobsd.jobs_archive AS a CROSS JOIN (VALUES ('minute'), ('hour')) AS p(period)
WHERE a.finished_at >= now() - interval '2 days'
  AND a.status IN ('succeeded', 'failed', 'cancelled')
GROUP BY 1, 2, 3, 4, 5, 6;

INSERT INTO jobsd.type_stats_all_orgs (period, start_at, type, run_bucket, succeeded, failed,
                                       cancelled, run_s)
SELECT period, start_at, type, run_bucket, sum(succeeded), sum(failed), sum(cancelled),
       sum(run_s)
FROM jobsd.type_stats
GROUP BY 1, 2, 3, 4;

CREATE OR REPLACE FUNCTION jobsd.schedule_info(p_id text)
RETURNS TABLE (id text, type text, org_id text, queue text, cron text, every_ms bigint,
               timezone text, payload jsonb, priority integer, dedup_key text,
               concurrency_key text, catch_up text, catch_up_max integer,
               paused boolean, paused_at timestamptz, resumed_at timestamptz,
               created_at timestamptz, updated_at timestamptz, last_tick timestamptz,
               last_job_id uuid, last_outcome text, last_reason text,
               last_job_status text, fired bigint, refused bigint, late bigint,
               skipped bigint, skipped_until timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
  SELECT s.id, s.type, s.org_id, s.queue, s.cron, s.every_ms, s.timezone, s.payload,
         s.priority, s.dedup_key, s.concurrency_key, s.catch_up, s.catch_up_max, s.paused,
         s.paused_at, s.resumed_at, s.created_at, s.updated_at, s.last_tick, s.last_job_id,
         t.outcome, t.reason, j.status,
         s.fired, s.refused, s.late, s.skipped, s.skipped_until
  FROM jobsd.schedules AS s
  LEFT JOIN jobsd.schedule_ticks AS t ON t.schedule_id = s.id AND t.tick = s.last_tick
  LEFT JOIN LATERAL (SELECT a.status FROM jobsd.all_jobs AS a
                     WHERE a.id = s.last_job_id LIMIT 1) AS j ON true
  WHERE p_id IS NULL OR s.id = p_id
  ORDER BY s.id
$$;

-- The move writes the rollups with its owner's rights (SECURITY DEFINER; CREATE OR
-- REPLACE kept its owner): when another role runs this migration (a superuser after
-- `jobsd roles create`), the tables go to the move's owner.
DO $$
DECLARE
  v_owner regrole := (SELECT p.proowner::regrole FROM pg_proc AS p
                      WHERE p.oid = 'jobsd.archive_move(integer, double precision)'::regprocedure);
BEGIN
  IF v_owner::oid <> (SELECT r.oid FROM pg_roles AS r WHERE r.rolname = current_user) THEN
    EXECUTE format('ALTER TABLE jobsd.type_stats OWNER TO %s', v_owner);
    EXECUTE format('ALTER TABLE jobsd.type_stats_all_orgs OWNER TO %s', v_owner);
  END IF;
END
$$;

-- The roles that read jobs read the rollups; the all-orgs policies of jobs hold on them
-- (on type_stats_all_orgs, only they: an org's role reads no row of it).
DO $$
DECLARE
  r record;
BEGIN
  FOR r IN
    SELECT a.rolname FROM pg_roles AS a
    WHERE has_table_privilege(a.oid, 'jobsd.jobs', 'SELECT')
      AND NOT a.rolsuper AND a.oid <> (SELECT c.relowner FROM pg_class AS c
                                       WHERE c.oid = 'jobsd.jobs'::regclass)
  LOOP
    EXECUTE format('GRANT SELECT ON jobsd.type_stats, jobsd.type_stats_all_orgs TO %I',
                   r.rolname);
  END LOOP;
  FOR r IN
    SELECT p.polname,
           array_to_string(ARRAY(SELECT quote_ident(g.rolname) FROM pg_roles AS g
                                 WHERE g.oid = ANY(p.polroles)), ', ') AS roles
    FROM pg_policy AS p
    WHERE p.polrelid = 'jobsd.jobs'::regclass
      AND p.polpermissive AND pg_get_expr(p.polqual, p.polrelid) = 'true'
      AND NOT (0 = ANY(p.polroles))
  LOOP
    EXECUTE format('CREATE POLICY %I ON jobsd.type_stats AS PERMISSIVE FOR ALL TO %s '
                   'USING (true) WITH CHECK (true)', r.polname, r.roles);
    EXECUTE format('CREATE POLICY %I ON jobsd.type_stats_all_orgs AS PERMISSIVE FOR ALL '
                   'TO %s USING (true) WITH CHECK (true)', r.polname, r.roles);
  END LOOP;
END
$$;
