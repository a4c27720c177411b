-- jobsd schema, version 33: a plain enqueue writes less.
--
-- * jobs_active_idx (status, created_at) for queued and running jobs is replaced by
--   jobs_running_idx (worker_id) for running jobs only. Every enqueue entered the
--   queued job in it, and nothing reads queued jobs through it any more: the claim,
--   the pickup lag and the oldest due job read jobs_claim_v2_idx, the counts by
--   queue jobs_claim_v2_idx and jobs_open_by_queue_org_idx. Running jobs are read by
--   worker (a daemon's own jobs, the jobs each daemon holds) or all together (the
--   sweeper's stale runs): a claim enters the running job here as it did there.
-- * jobsd.after_insert_jobs() learns in one query over the new rows whether the
--   statement needs anything more (an illegal start, a creation to store, a key, a
--   capacity, an org quota); a plain enqueue runs no other query.
-- * jobsd.queue_depth_v2() counts each state by itself, each through its own index.
--
-- Never edit this file once shipped: add a new numbered migration instead.

CREATE INDEX jobs_running_idx ON jobsd.jobs (worker_id) WHERE status = 'running';
DROP INDEX jobsd.jobs_active_idx;

CREATE OR REPLACE FUNCTION jobsd.queue_depth_v2()
RETURNS TABLE (queue text, status text, jobs bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
  -- Each state through a partial index: queued jobs_claim_v2_idx, running
  -- jobs_running_idx, scheduled jobs_scheduled_idx, recovery_required
  -- jobs_open_by_queue_org_idx.
  SELECT q.name, s.status, coalesce(d.jobs, 0)::bigint
  FROM jobsd.queues AS q
  CROSS JOIN unnest(ARRAY['queued', 'scheduled', 'running', 'recovery_required'])
    AS s(status)
  LEFT JOIN (
    SELECT j.queue, 'queued' AS status, count(*) AS jobs FROM jobsd.jobs AS j
    WHERE j.status = 'queued' GROUP BY j.queue
    UNION ALL
    SELECT j.queue, 'running', count(*) FROM jobsd.jobs AS j
    WHERE j.status = 'running' GROUP BY j.queue
    UNION ALL
    SELECT j.queue, 'scheduled', count(*) FROM jobsd.jobs AS j
    WHERE j.status = 'scheduled' GROUP BY j.queue
    UNION ALL
    SELECT j.queue, 'recovery_required', count(*) FROM jobsd.jobs AS j
    WHERE j.status = 'recovery_required' GROUP BY j.queue) AS d
    ON d.queue = q.name AND d.status = s.status
  ORDER BY q.name, s.status
$$;

CREATE OR REPLACE FUNCTION jobsd.after_insert_jobs() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
DECLARE
  bad record;
  q record;
  g record;
  cap bigint;  -- bigint: capacity + 1 must not overflow
  open_jobs bigint;
  illegal boolean;
  stored boolean;
  keyed boolean;
  capped boolean;
  quota boolean;
  actor text := nullif(current_setting('jobsd.actor', true), '');
BEGIN
  -- One pass over the new jobs says what the statement needs; a plain enqueue (queued,
  -- no key, into a queue without limits) needs nothing more.
  SELECT coalesce(bool_or(n.status NOT IN ('queued', 'scheduled', 'blocked')
                          OR n.start_event_id IS NOT NULL OR n.end_event_id IS NOT NULL),
                  false),
         coalesce(bool_or(n.status <> 'queued' OR n.worker_id IS NOT NULL
                          OR n.reason IS NOT NULL OR n.attempts <> 0
                          OR n.created_event_id IS NULL), false) OR actor IS NOT NULL,
         coalesce(bool_or(n.concurrency_key IS NOT NULL), false),
         coalesce(bool_or(qs.capacity IS NOT NULL), false),
         coalesce(bool_or(qs.org_open_limit IS NOT NULL), false)
  INTO illegal, stored, keyed, capped, quota
  FROM new_jobs AS n LEFT JOIN jobsd.queues AS qs ON qs.name = n.queue;

  -- a job starts queued, scheduled or blocked, with no run
  IF illegal THEN
    SELECT n.id, n.status INTO bad FROM new_jobs AS n
    WHERE n.status NOT IN ('queued', 'scheduled', 'blocked')
       OR n.start_event_id IS NOT NULL OR n.end_event_id IS NOT NULL
    LIMIT 1;
    RAISE EXCEPTION 'illegal transition of job %: a job starts queued, scheduled or blocked, not %',
      bad.id, CASE WHEN bad.status IN ('queued', 'scheduled', 'blocked') THEN 'running'
                   ELSE bad.status END
      USING ERRCODE = 'check_violation';
  END IF;

  -- a creation that is not plain is stored; a plain one is read from the job's row
  IF stored THEN
    INSERT INTO jobsd.job_events (id, job_id, org_id, from_status, to_status, attempt,
                                  worker_id, reason)
    OVERRIDING SYSTEM VALUE
    SELECT coalesce(n.created_event_id, nextval('jobsd.job_events_id_seq')), n.id, n.org_id,
           NULL, n.status, n.attempts, coalesce(actor, n.worker_id), n.reason
    FROM new_jobs AS n
    WHERE n.status <> 'queued' OR actor IS NOT NULL OR n.worker_id IS NOT NULL
       OR n.reason IS NOT NULL OR n.attempts <> 0 OR n.created_event_id IS NULL;
  END IF;
  IF NOT (keyed OR capped OR quota) THEN
    RETURN NULL;
  END IF;

  -- the org quota: for each (queue, org) among the new open jobs whose queue has an
  -- org_open_limit, a transaction lock on the pair (concurrent enqueues of one org
  -- into one queue take turns; the count after the lock runs on a fresh snapshot
  -- under READ COMMITTED), then the org's open jobs there, ours included; beyond the
  -- limit the whole statement is refused
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
