-- jobsd schema, version 20: fewer index entries and trigger calls per job (issue 10,
-- docs/decisions.md "Fewer indexes per transition"). The same guarantees.
--
-- No status change is a HOT update (status is in the predicate of partial indexes),
-- so every transition of a job writes a new entry into each index whose predicate the
-- new row meets, and every history row into each index of job_events. Per job
-- (enqueue, claim, outcome) this removes eight index entries of about 28:
-- * the dedup key's unique constraint becomes a unique index on the rows that have a
--   key (same name, same uniqueness: NULLs never conflicted): jobs without a dedup
--   key, and every job once it ends (the key is cleared then), are not in it. The
--   enqueue's ON CONFLICT DO NOTHING names no target and covers it as before;
-- * jobs_open_by_queue_idx (queue, status) goes: jobs_open_by_queue_org_idx (queue,
--   org_id, status) has the same predicate and answers every count by queue;
-- * job_events: the primary key becomes (job_id, id), the order in which every reader
--   reads a job's history, and job_events_job_idx (job_id, id) goes: one index per
--   event instead of two.
-- And fewer trigger calls:
-- * the org quota (jobs_admit_org_quota, 0012) is checked by jobsd.after_insert_jobs(),
--   which learns in one query whether any admission work is due (a job with a
--   concurrency key, a queue with a capacity or an org quota); the common case stops
--   there. The quota is still checked before the capacity, as when it was a trigger of
--   its own (triggers fire in name order);
-- * the state machine's check (jobs_check_transition, a BEFORE ROW trigger: a PL/pgSQL
--   call per changed row) runs once per statement in jobsd.record_status_changes(),
--   over the same transition tables as the history it writes: an illegal change still
--   fails its statement with check_violation and the same message, and nothing of the
--   statement stays (its row triggers' work included).
-- * the outcomes of jobs_finish_batch are read by jobsd.outcome_rows(jsonb), which
--   tells the planner a batch is small (ROWS 10): with jsonb_to_recordset's default
--   estimate of 100 rows the planner matched them by a bitmap scan of every running
--   job's entry in jobs_active_idx, dead ones included, instead of one primary-key
--   lookup per outcome.
--
-- Never edit this file once shipped: add a new numbered migration instead.

CREATE OR REPLACE FUNCTION jobsd.after_insert_jobs() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
DECLARE
  bad record;
  q record;
  g record;
  cap bigint;  -- bigint: capacity + 1 must not overflow (0011_hostile)
  open_jobs bigint;
  keyed boolean;
  capped boolean;
  quota boolean;
BEGIN
  -- a job starts queued, scheduled or blocked
  SELECT n.id, n.status INTO bad FROM new_jobs AS n
  WHERE n.status NOT IN ('queued', 'scheduled', 'blocked') LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'illegal transition of job %: a job starts queued, scheduled or blocked, not %',
      bad.id, bad.status
      USING ERRCODE = 'check_violation';
  END IF;

  INSERT INTO jobsd.job_events (job_id, org_id, from_status, to_status, attempt, worker_id, reason)
  SELECT n.id, n.org_id, NULL, n.status, n.attempts,
         coalesce(nullif(current_setting('jobsd.actor', true), ''), n.worker_id), n.reason
  FROM new_jobs AS n;

  SELECT coalesce(bool_or(n.concurrency_key IS NOT NULL), false),
         coalesce(bool_or(qs.capacity IS NOT NULL), false),
         coalesce(bool_or(qs.org_open_limit IS NOT NULL), false)
  INTO keyed, capped, quota
  FROM new_jobs AS n LEFT JOIN jobsd.queues AS qs ON qs.name = n.queue;
  IF NOT (keyed OR capped OR quota) THEN
    RETURN NULL;
  END IF;

  -- the org quota (was jobsd.admit_org_quota): for each (queue, org) among the new
  -- open jobs whose queue has an org_open_limit, a transaction lock on the pair
  -- (concurrent enqueues of one org into one queue take turns; the count after the
  -- lock runs on a fresh snapshot under READ COMMITTED), then the org's open jobs
  -- there, ours included; beyond the limit the whole statement is refused
  IF quota THEN
    FOR g IN
      SELECT DISTINCT n.queue, n.org_id, qs.org_open_limit AS quota
      FROM new_jobs AS n JOIN jobsd.queues AS qs ON qs.name = n.queue
      WHERE qs.org_open_limit IS NOT NULL
        AND n.status NOT IN ('succeeded', 'failed', 'cancelled')
      ORDER BY n.queue, n.org_id
    LOOP
      PERFORM pg_advisory_xact_lock(
        hashtextextended('jobsd org quota ' || g.queue || ' ' || g.org_id, 0));
      SELECT count(*) INTO open_jobs FROM (
        SELECT 1 FROM jobsd.jobs AS j
        WHERE j.queue = g.queue AND j.org_id = g.org_id
          AND j.status NOT IN ('succeeded', 'failed', 'cancelled')
        LIMIT g.quota::bigint + 1) AS o;
      IF open_jobs > g.quota THEN
        RAISE EXCEPTION 'org quota of queue % reached: % open jobs at most', g.queue, g.quota
          USING ERRCODE = 'JQ003',
                DETAIL = json_build_object('queue', g.queue, 'org_open_limit', g.quota)::text;
      END IF;
    END LOOP;
  END IF;

  -- capacity: take the queue row (concurrent enqueues into the queue wait here for
  -- each other), count its open jobs, ours included, refuse beyond the capacity
  IF capped THEN
    FOR q IN
      SELECT qs.name FROM jobsd.queues AS qs
      WHERE qs.capacity IS NOT NULL
        AND qs.name IN (SELECT DISTINCT n.queue FROM new_jobs AS n)
      ORDER BY qs.name
    LOOP
      UPDATE jobsd.queues AS qs SET capacity = qs.capacity
      WHERE qs.name = q.name
      RETURNING qs.capacity INTO cap;
      CONTINUE WHEN cap IS NULL;
      SELECT count(*) INTO open_jobs FROM (
        SELECT 1 FROM jobsd.jobs AS j
        WHERE j.queue = q.name AND j.status NOT IN ('succeeded', 'failed', 'cancelled')
        LIMIT cap + 1) AS o;
      IF open_jobs > cap THEN
        RAISE EXCEPTION 'queue % is full: capacity %', q.name, cap
          USING ERRCODE = 'JQ001',
                DETAIL = json_build_object('queue', q.name, 'capacity', cap,
                                           'open', open_jobs)::text;
      END IF;
    END LOOP;
  END IF;

  -- concurrency keys: each key has its counter row, so that claims can lock it
  IF keyed THEN
    INSERT INTO jobsd.concurrency_keys (org_id, concurrency_key)
    SELECT DISTINCT n.org_id, n.concurrency_key FROM new_jobs AS n
    WHERE n.concurrency_key IS NOT NULL
    ORDER BY 1, 2
    ON CONFLICT DO NOTHING;
  END IF;
  RETURN NULL;
END
$$;

DROP TRIGGER jobs_admit_org_quota ON jobsd.jobs;
DROP FUNCTION jobsd.admit_org_quota();

ALTER TABLE jobsd.jobs DROP CONSTRAINT jobs_org_dedup_key_key;
CREATE UNIQUE INDEX jobs_org_dedup_key_key ON jobsd.jobs (org_id, dedup_key)
  WHERE dedup_key IS NOT NULL;

DROP INDEX jobsd.jobs_open_by_queue_idx;

ALTER TABLE jobsd.job_events DROP CONSTRAINT job_events_pkey,
  ADD CONSTRAINT job_events_pkey PRIMARY KEY (job_id, id);
DROP INDEX jobsd.job_events_job_idx;

-- Latest definition: 0010_hotpath (0018 made it SECURITY DEFINER). Changed: the check
-- of jobsd.check_transition() (0014), once per statement.
CREATE OR REPLACE FUNCTION jobsd.record_status_changes() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
DECLARE
  bad record;
BEGIN
  WITH changed AS MATERIALIZED (
    SELECT n.id, n.org_id, o.status AS from_status, n.status AS to_status, n.attempts,
           n.worker_id, n.reason
    FROM new_jobs AS n
    JOIN old_jobs AS o ON o.id = n.id
    WHERE o.status IS DISTINCT FROM n.status),
  recorded AS (
    INSERT INTO jobsd.job_events (job_id, org_id, from_status, to_status, attempt, worker_id,
                                  reason)
    SELECT c.id, c.org_id, c.from_status, c.to_status, c.attempts,
           coalesce(nullif(current_setting('jobsd.actor', true), ''), c.worker_id), c.reason
    FROM changed AS c)
  SELECT c.id, c.from_status, c.to_status INTO bad
  FROM changed AS c
  WHERE NOT jobsd.transition_allowed(c.from_status, c.to_status)
    -- the retry edge passes while jobsd.job_retry() is moving that very job
    AND NOT (c.from_status IN ('failed', 'cancelled') AND c.to_status = 'queued'
             AND coalesce(current_setting('jobsd.retrying', true), '') = c.id::text)
  LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'illegal transition of job %: % -> %', bad.id, bad.from_status,
      bad.to_status
      USING ERRCODE = 'check_violation';
  END IF;
  RETURN NULL;
END
$$;

DROP TRIGGER jobs_check_transition ON jobsd.jobs;
DROP FUNCTION jobsd.check_transition();

-- PL/pgSQL, not SQL: a SQL function that is not inlined is parsed and planned again
-- by every statement that calls it; PL/pgSQL keeps its plan for the session.
CREATE FUNCTION jobsd.outcome_rows(p_results jsonb)
RETURNS TABLE (id uuid, lease_id uuid, status text, report jsonb, error text, reason text,
               progress jsonb, run_after timestamptz, delay_s float8)
LANGUAGE plpgsql STABLE PARALLEL SAFE ROWS 10
AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  SELECT r.id, r.lease_id, r.status, r.report, r.error, r.reason, r.progress, r.run_after,
         r.delay_s
  FROM pg_catalog.jsonb_to_recordset(p_results)
       AS r(id uuid, lease_id uuid, status text, report jsonb, error text, reason text,
            progress jsonb, run_after timestamptz, delay_s float8);
END
$$;
