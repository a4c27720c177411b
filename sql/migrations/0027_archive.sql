-- jobsd schema, version 27: a hot table of open jobs and a partitioned archive.
--
-- * jobsd.jobs stays the table every daemon works on; from now on it holds the open
--   jobs and the ones that ended a few seconds ago. The daemons move ended jobs, with
--   their history, into jobsd.jobs_archive and jobsd.job_events_archive in batches
--   (jobsd.archive_move: one statement per batch, SKIP LOCKED, several daemons may
--   move at once). An upgraded database moves its backlog the same way, batch by
--   batch, while the daemons run: this migration itself only creates empty objects.
-- * Both archive tables are partitioned by month of the job's finished_at (UTC):
--   jobs_archive_pYYYY_MM and job_events_archive_pYYYY_MM. Dropping a month drops
--   the two partitions: constant time, no dead tuples. jobsd.archive_ensure creates
--   the months a batch needs, and the daemons create the coming ones ahead.
-- * jobsd.archive_contents says which (queue, type) pairs each month holds, kept by
--   the move itself, so that a prune knows whether a whole month is due without
--   reading it.
-- * jobsd.all_jobs and jobsd.all_job_events are the reads' view of a job wherever it
--   lives (security_invoker: row-level security of the tables applies to the
--   caller).
-- * job_dependencies and fail_hooks keep their rows when their job moves: their
--   foreign keys to jobsd.jobs go (they cascaded deletes), and what they checked is
--   checked by jobsd.check_dependency_org and the enqueue against both tables.
-- * Functions that read a job by id now read it in both tables: job_retry (a
--   retried job may be archived; its note goes to the archive's history),
--   check_dependency_org, queue_drop (an archived job of a dropped queue goes too).
-- * The roles that read jobsd.jobs read the archive too, with the same policies,
--   so an upgrade needs no `jobsd roles create`.
--
-- Never edit this file once shipped: add a new numbered migration instead.

ALTER TABLE jobsd.job_dependencies DROP CONSTRAINT IF EXISTS job_dependencies_job_id_fkey;
ALTER TABLE jobsd.job_dependencies DROP CONSTRAINT IF EXISTS job_dependencies_depends_on_fkey;
ALTER TABLE jobsd.fail_hooks DROP CONSTRAINT IF EXISTS fail_hooks_job_id_fkey;

CREATE TABLE jobsd.jobs_archive (LIKE jobsd.jobs) PARTITION BY RANGE (finished_at);
ALTER TABLE jobsd.jobs_archive ALTER COLUMN finished_at SET NOT NULL;
ALTER TABLE jobsd.jobs_archive ADD CONSTRAINT jobs_archive_pkey PRIMARY KEY (id, finished_at);
-- this org's jobs of this type, newest first
CREATE INDEX jobs_archive_org_type_created_idx
  ON jobsd.jobs_archive (org_id, type, created_at DESC);
-- one org's list, newest first (keyset on created_at, id)
CREATE INDEX jobs_archive_org_created_idx ON jobsd.jobs_archive (org_id, created_at, id);
-- every org's list (an operator's)
CREATE INDEX jobs_archive_created_idx ON jobsd.jobs_archive (created_at, id);
-- the failures of the last hour
CREATE INDEX jobs_archive_failed_idx ON jobsd.jobs_archive (finished_at)
  WHERE status = 'failed';
-- what ended per minute (the dashboard's throughput)
CREATE INDEX jobs_archive_finished_idx ON jobsd.jobs_archive (finished_at);
-- the retry of a job
CREATE INDEX jobs_archive_retry_of_idx ON jobsd.jobs_archive (retry_of)
  WHERE retry_of IS NOT NULL;

CREATE TABLE jobsd.job_events_archive (
  LIKE jobsd.job_events,
  job_finished_at timestamptz NOT NULL
) PARTITION BY RANGE (job_finished_at);
ALTER TABLE jobsd.job_events_archive
  ADD CONSTRAINT job_events_archive_pkey PRIMARY KEY (job_id, id, job_finished_at);

CREATE TABLE jobsd.archive_contents (
  month  timestamptz NOT NULL,
  queue  text NOT NULL,
  type   text NOT NULL,
  jobs   bigint NOT NULL,
  PRIMARY KEY (month, queue, type)
);

ALTER TABLE jobsd.jobs_archive ENABLE ROW LEVEL SECURITY;
CREATE POLICY jobs_archive_org_isolation ON jobsd.jobs_archive
  USING (org_id = (SELECT jobsd.current_org()))
  WITH CHECK (org_id = (SELECT jobsd.current_org()));
ALTER TABLE jobsd.job_events_archive ENABLE ROW LEVEL SECURITY;
CREATE POLICY job_events_archive_org_isolation ON jobsd.job_events_archive
  USING (org_id = (SELECT jobsd.current_org()))
  WITH CHECK (org_id = (SELECT jobsd.current_org()));
ALTER TABLE jobsd.archive_contents ENABLE ROW LEVEL SECURITY;

CREATE VIEW jobsd.all_jobs WITH (security_invoker = true) AS
  SELECT * FROM jobsd.jobs
  UNION ALL
  SELECT * FROM jobsd.jobs_archive;

CREATE VIEW jobsd.all_job_events WITH (security_invoker = true) AS
  SELECT e.id, e.job_id, e.org_id, e.from_status, e.to_status, e.attempt, e.worker_id,
         e.reason, e.at
  FROM jobsd.job_events AS e
  UNION ALL
  SELECT a.id, a.job_id, a.org_id, a.from_status, a.to_status, a.attempt, a.worker_id,
         a.reason, a.at
  FROM jobsd.job_events_archive AS a;

-- The first instant of the UTC month of p_at.
-- (No SET clause, every name qualified: the planner inlines it into the move.)
CREATE FUNCTION jobsd.archive_month(p_at timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT pg_catalog.timezone('UTC', pg_catalog.date_trunc('month', pg_catalog.timezone('UTC', p_at))) $$;

-- Create the archive's monthly partitions (jobs and history) from the month of
-- p_from to the month of p_to, those that are missing; return how many months were
-- created. Serialized by a transaction-level advisory lock: concurrent callers
-- take turns, the second finds the partitions made.
CREATE FUNCTION jobsd.archive_ensure(p_from timestamptz, p_to timestamptz) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
DECLARE
  v_month timestamptz := jobsd.archive_month(p_from);
  v_last timestamptz := jobsd.archive_month(p_to);
  v_next timestamptz;
  v_suffix text;
  v_created integer := 0;
BEGIN
  IF v_month IS NULL OR v_last IS NULL OR v_last < v_month THEN
    RETURN 0;
  END IF;
  IF v_last > v_month + interval '10 years' THEN
    RAISE EXCEPTION 'archive months from % to %: more than ten years at once', p_from, p_to
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  WHILE v_month <= v_last LOOP
    v_suffix := to_char(v_month AT TIME ZONE 'UTC', '"p"YYYY_MM');
    IF to_regclass('jobsd.jobs_archive_' || v_suffix) IS NULL
       OR to_regclass('jobsd.job_events_archive_' || v_suffix) IS NULL THEN
      PERFORM pg_advisory_xact_lock(hashtext('jobsd.archive_ensure'));
      v_next := (v_month AT TIME ZONE 'UTC' + interval '1 month') AT TIME ZONE 'UTC';
      IF to_regclass('jobsd.jobs_archive_' || v_suffix) IS NULL THEN
        EXECUTE format(
          'CREATE TABLE jobsd.%I PARTITION OF jobsd.jobs_archive FOR VALUES FROM (%L) TO (%L)',
          'jobs_archive_' || v_suffix, v_month, v_next);
        -- read through the parent only: a partition read directly would skip its policies
        EXECUTE format('ALTER TABLE jobsd.%I ENABLE ROW LEVEL SECURITY',
                       'jobs_archive_' || v_suffix);
        v_created := v_created + 1;
      END IF;
      IF to_regclass('jobsd.job_events_archive_' || v_suffix) IS NULL THEN
        EXECUTE format(
          'CREATE TABLE jobsd.%I PARTITION OF jobsd.job_events_archive '
          'FOR VALUES FROM (%L) TO (%L)',
          'job_events_archive_' || v_suffix, v_month, v_next);
        EXECUTE format('ALTER TABLE jobsd.%I ENABLE ROW LEVEL SECURITY',
                       'job_events_archive_' || v_suffix);
      END IF;
    END IF;
    v_month := (v_month AT TIME ZONE 'UTC' + interval '1 month') AT TIME ZONE 'UTC';
  END LOOP;
  RETURN v_created;
END
$$;

-- Move up to p_limit jobs that ended more than p_min_age_s seconds ago (by the
-- database's clock), oldest end first, with their history, from the hot tables into
-- the archive; return how many moved. Rows another session holds are skipped (SKIP
-- LOCKED) and moved by a later batch. All or nothing: a month the archive cannot
-- hold (a partition that cannot be made) fails the batch and every job stays where
-- it was.
CREATE FUNCTION jobsd.archive_move(p_limit integer, p_min_age_s double precision)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
-- a batch is a few milliseconds of work: compiling it would cost more
SET jit = off
AS $$
DECLARE
  v_before timestamptz := now() - make_interval(secs => p_min_age_s);
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
    ON CONFLICT (month, queue, type) DO UPDATE SET jobs = c.jobs + excluded.jobs
    RETURNING 1)
  -- (every part runs to completion, read or not; the hot history of the moved jobs
  -- goes with them through the trigger jobs_delete_events)
  SELECT count(*) INTO v_moved FROM jobs_in;
  RETURN v_moved;
END
$$;

-- The archive's months: bounds, whether the move created it ahead, and the jobs it
-- holds by queue and type (as the move counted them; a row prune lowers no count).
CREATE FUNCTION jobsd.archive_months()
RETURNS TABLE(month timestamptz, partition_name text, events_partition_name text,
              contents jsonb)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
  SELECT m.month, 'jobs_archive_' || m.suffix, 'job_events_archive_' || m.suffix,
         coalesce((SELECT jsonb_agg(jsonb_build_object('queue', c.queue, 'type', c.type,
                                                       'jobs', c.jobs)
                                    ORDER BY c.queue, c.type)
                   FROM jobsd.archive_contents AS c WHERE c.month = m.month), '[]')
  FROM (SELECT (regexp_match(c.relname, '^jobs_archive_p(\d{4})_(\d{2})$')) AS ym
        FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'jobsd.jobs_archive'::regclass) AS p
  CROSS JOIN LATERAL (
    SELECT make_timestamptz(p.ym[1]::int, p.ym[2]::int, 1, 0, 0, 0, 'UTC') AS month,
           'p' || p.ym[1] || '_' || p.ym[2] AS suffix) AS m
  WHERE p.ym IS NOT NULL
  ORDER BY m.month
$$;

-- Drop one month of the archive (jobs and history) at once; false when it has no
-- partition. Waits at most p_lock_timeout_ms for the readers of the archive.
CREATE FUNCTION jobsd.archive_drop(p_month timestamptz, p_lock_timeout_ms integer)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
DECLARE
  v_month timestamptz := jobsd.archive_month(p_month);
  v_suffix text := to_char(jobsd.archive_month(p_month) AT TIME ZONE 'UTC', '"p"YYYY_MM');
  v_found boolean := false;
BEGIN
  PERFORM set_config('lock_timeout', p_lock_timeout_ms::text, true);
  IF to_regclass('jobsd.jobs_archive_' || v_suffix) IS NOT NULL THEN
    EXECUTE format('DROP TABLE jobsd.%I', 'jobs_archive_' || v_suffix);
    v_found := true;
  END IF;
  IF to_regclass('jobsd.job_events_archive_' || v_suffix) IS NOT NULL THEN
    EXECUTE format('DROP TABLE jobsd.%I', 'job_events_archive_' || v_suffix);
    v_found := true;
  END IF;
  DELETE FROM jobsd.archive_contents AS c WHERE c.month = v_month;
  RETURN v_found;
END
$$;

-- The org of the archived job with this id (null: none). For an enqueue that gives
-- an id: whether it is taken, by which org, without reading the job under another
-- org's row-level security.
CREATE FUNCTION jobsd.archived_job_org(p_id uuid) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$ SELECT a.org_id FROM jobsd.jobs_archive AS a WHERE a.id = p_id LIMIT 1 $$;

-- A dependency edge names two jobs of its org, wherever they live.
CREATE OR REPLACE FUNCTION jobsd.check_dependency_org() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
BEGIN
  IF (SELECT count(*) FROM jobsd.all_jobs AS j
      WHERE j.id IN (NEW.job_id, NEW.depends_on) AND j.org_id = NEW.org_id) <> 2 THEN
    RAISE EXCEPTION 'unknown dependency %', NEW.depends_on
      USING ERRCODE = 'foreign_key_violation';
  END IF;
  RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION jobsd.job_retry(p_job_id uuid, p_new_id uuid, p_actor text,
                                           p_force boolean, p_org_id text DEFAULT NULL)
RETURNS TABLE(outcome text, job_id uuid)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
DECLARE
  v_org text := coalesce(p_org_id, nullif(current_setting('jobsd.org_id', true), ''));
  v_job jobsd.jobs%ROWTYPE;
  v_archived boolean := false;
  v_retry uuid;
BEGIN
  -- the lock makes concurrent retries of one job take turns: the second finds the
  -- first's retry
  SELECT j.* INTO v_job FROM jobsd.jobs AS j
  WHERE j.id = p_job_id AND (v_org IS NULL OR j.org_id = v_org)
  FOR UPDATE;
  IF NOT FOUND THEN
    -- ended long enough ago to be archived (a statement of its own: a move that
    -- committed while the lock above waited is seen)
    SELECT a.* INTO v_job FROM jobsd.jobs_archive AS a
    WHERE a.id = p_job_id AND (v_org IS NULL OR a.org_id = v_org)
    FOR UPDATE;
    IF NOT FOUND THEN
      RETURN QUERY SELECT 'not_found'::text, NULL::uuid;
      RETURN;
    END IF;
    v_archived := true;
  END IF;
  SELECT r.id INTO v_retry FROM jobsd.all_jobs AS r WHERE r.retry_of = p_job_id LIMIT 1;
  IF FOUND THEN
    RETURN QUERY SELECT 'already_retried'::text, v_retry;
    RETURN;
  END IF;
  IF v_job.status NOT IN ('failed', 'cancelled') THEN
    RETURN QUERY SELECT 'not_ended'::text, NULL::uuid;
    RETURN;
  END IF;
  IF NOT coalesce(p_force, false) AND EXISTS (
      SELECT 1 FROM jobsd.job_types AS t
      WHERE t.type = v_job.type AND t.delivery = 'at_most_once') THEN
    RETURN QUERY SELECT 'at_most_once'::text, NULL::uuid;
    RETURN;
  END IF;
  IF EXISTS (SELECT 1 FROM jobsd.job_dependencies AS d
             JOIN jobsd.all_jobs AS p ON p.id = d.depends_on
             WHERE d.job_id = p_job_id AND p.status <> 'succeeded') THEN
    RETURN QUERY SELECT 'dependency'::text, NULL::uuid;
    RETURN;
  END IF;
  PERFORM set_config('jobsd.actor', coalesce(p_actor, ''), true);
  INSERT INTO jobsd.jobs (id, org_id, type, queue, status, payload, priority,
                          concurrency_key, trace_context, reason, retry_of)
  VALUES (p_new_id, v_job.org_id, v_job.type, v_job.queue, 'queued', v_job.payload,
          v_job.priority, v_job.concurrency_key, v_job.trace_context,
          CASE WHEN coalesce(p_force, false) THEN 'retry (forced) of ' ELSE 'retry of ' END
            || p_job_id::text,
          p_job_id);
  IF v_archived THEN
    INSERT INTO jobsd.job_events_archive (id, job_id, org_id, from_status, to_status, attempt,
                                          worker_id, reason, at, job_finished_at)
    VALUES (nextval('jobsd.job_events_id_seq'), p_job_id, v_job.org_id, v_job.status,
            v_job.status, v_job.attempts, nullif(p_actor, ''),
            'retried as ' || p_new_id::text, clock_timestamp(), v_job.finished_at);
  ELSE
    INSERT INTO jobsd.job_events (job_id, org_id, from_status, to_status, attempt,
                                  worker_id, reason)
    VALUES (p_job_id, v_job.org_id, v_job.status, v_job.status, v_job.attempts,
            nullif(p_actor, ''), 'retried as ' || p_new_id::text);
  END IF;
  PERFORM set_config('jobsd.actor', '', true);
  RETURN QUERY SELECT 'retried'::text, p_new_id;
END
$$;

CREATE OR REPLACE FUNCTION jobsd.queue_drop(p_name text, OUT queue_found boolean,
                                            OUT open_jobs bigint, OUT deleted_jobs bigint)
RETURNS record
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
DECLARE
  v_archived bigint;
BEGIN
  open_jobs := 0;
  deleted_jobs := 0;
  IF p_name = 'default' THEN
    RAISE EXCEPTION 'the queue ''default'' cannot be dropped'
      USING ERRCODE = 'JQ002', HINT = 'pause it instead';
  END IF;
  PERFORM 1 FROM jobsd.queues AS q WHERE q.name = p_name FOR UPDATE;
  queue_found := FOUND;
  IF NOT queue_found THEN
    RETURN;
  END IF;
  SELECT count(*) INTO open_jobs FROM jobsd.jobs AS j
  WHERE j.queue = p_name AND j.status NOT IN ('succeeded', 'failed', 'cancelled');
  IF open_jobs > 0 THEN
    RETURN;
  END IF;
  DELETE FROM jobsd.jobs AS j
  WHERE j.queue = p_name AND j.status IN ('succeeded', 'failed', 'cancelled');
  GET DIAGNOSTICS deleted_jobs = ROW_COUNT;
  IF EXISTS (SELECT 1 FROM jobsd.archive_contents AS c WHERE c.queue = p_name) THEN
    WITH gone AS (
      DELETE FROM jobsd.jobs_archive AS a WHERE a.queue = p_name
      RETURNING a.id, a.finished_at),
    gone_events AS (
      DELETE FROM jobsd.job_events_archive AS e USING gone AS g
      WHERE e.job_id = g.id AND e.job_finished_at = g.finished_at
      RETURNING 1)
    SELECT count(*) INTO v_archived FROM gone;
    deleted_jobs := deleted_jobs + v_archived;
    DELETE FROM jobsd.archive_contents AS c WHERE c.queue = p_name;
  END IF;
  DELETE FROM jobsd.queues AS q WHERE q.name = p_name;
END
$$;

REVOKE ALL ON FUNCTION jobsd.archive_ensure(timestamptz, timestamptz),
                       jobsd.archive_move(integer, double precision),
                       jobsd.archive_months(),
                       jobsd.archive_drop(timestamptz, integer),
                       jobsd.archived_job_org(uuid)
  FROM PUBLIC;

-- The months around today exist from the start.
SELECT jobsd.archive_ensure(now() - interval '1 month', now() + interval '2 months');

-- The roles that read jobs read the archive and its views; the daemons' role (it may
-- update jobs) moves ended jobs and creates months; the all-orgs policies of jobs
-- and job_events hold on their archives.
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
    EXECUTE format('GRANT SELECT ON jobsd.jobs_archive, jobsd.all_jobs TO %I', r.rolname);
    IF has_table_privilege(r.rolname, 'jobsd.jobs', 'INSERT') THEN
      EXECUTE format('GRANT EXECUTE ON FUNCTION jobsd.archived_job_org(uuid) TO %I',
                     r.rolname);
    END IF;
    IF has_table_privilege(r.rolname, 'jobsd.job_events', 'SELECT') THEN
      EXECUTE format('GRANT SELECT ON jobsd.job_events_archive, jobsd.all_job_events TO %I',
                     r.rolname);
    END IF;
    IF has_table_privilege(r.rolname, 'jobsd.jobs', 'UPDATE')
       AND has_table_privilege(r.rolname, 'jobsd.workers', 'INSERT') THEN
      EXECUTE format('GRANT EXECUTE ON FUNCTION jobsd.archive_ensure(timestamptz, timestamptz), '
                     'jobsd.archive_move(integer, double precision) TO %I', r.rolname);
    END IF;
  END LOOP;
  FOR r IN
    SELECT p.polname, p.polrelid::regclass::text AS tab,
           array_to_string(ARRAY(SELECT quote_ident(g.rolname) FROM pg_roles AS g
                                 WHERE g.oid = ANY(p.polroles)), ', ') AS roles
    FROM pg_policy AS p
    WHERE p.polrelid IN ('jobsd.jobs'::regclass, 'jobsd.job_events'::regclass)
      AND p.polpermissive AND pg_get_expr(p.polqual, p.polrelid) = 'true'
      AND NOT (0 = ANY(p.polroles))
  LOOP
    EXECUTE format('CREATE POLICY %I ON %s AS PERMISSIVE FOR ALL TO %s USING (true) '
                   'WITH CHECK (true)', r.polname,
                   CASE r.tab WHEN 'jobsd.jobs' THEN 'jobsd.jobs_archive'
                              ELSE 'jobsd.job_events_archive' END,
                   r.roles);
  END LOOP;
END
$$;
