-- jobsd schema, version 9: queue administration (docs/queues.md).
--
-- The functions behind `jobsd queue ...`, jobsd.queues and the HTTP API's /queues.
-- They are SECURITY DEFINER so that the enqueue role (the API's) can administer
-- queues without any right on jobsd.queues beyond SELECT, and so that the depth of a
-- queue counts every org's jobs (the caller may see one org only). Each runs as its
-- owner (the owner role once `jobsd roles create` has adopted it), fixes
-- search_path (pg_temp last: a caller's temporary table cannot stand in for a jobsd
-- one) and names every object with its schema. EXECUTE is revoked from PUBLIC;
-- `jobsd roles create` grants it to the roles that need it (sql/roles/roles.sql).
--
-- * queue_info(name): one queue, or every queue when name is null, with its
--   limits and the number of its open jobs in each open state (every org's).
-- * queue_create, queue_set_limits, queue_pause, queue_resume: true when done,
--   false when the queue exists already (create) or does not exist (the others).
--   Pause keeps the first pause time; resume also sends pg_notify('jobsd', name)
--   so idle daemons claim from the queue at once (sent at commit).
-- * queue_drop(name): locks the queue row first, then counts its open jobs. With
--   any, nothing is deleted and the count comes back. Without, the queue's
--   finished jobs (and with them their history) and the queue are deleted. An
--   enqueue into the queue that started first holds a key-share lock on the row:
--   the drop waits for it, then counts its job and refuses. One that starts later
--   waits on the drop's lock, then fails on the foreign key: unknown queue.
--   The queue 'default' (the default of jobs.queue) is never dropped.
--
-- Never edit this file once shipped: add a new numbered migration instead.

CREATE FUNCTION jobsd.queue_info(p_name text DEFAULT NULL)
RETURNS TABLE (name text, created_at timestamptz, paused_at timestamptz,
               capacity integer, concurrency_limit integer, retention_days integer,
               queued bigint, scheduled bigint, blocked bigint, running bigint,
               recovery_required bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
  -- Open jobs only: the partial index jobs_open_by_queue_idx, never a table scan.
  SELECT q.name, q.created_at, q.paused_at, q.capacity, q.concurrency_limit,
         q.retention_days,
         coalesce(d.queued, 0), coalesce(d.scheduled, 0), coalesce(d.blocked, 0),
         coalesce(d.running, 0), coalesce(d.recovery_required, 0)
  FROM jobsd.queues AS q
  LEFT JOIN (
    SELECT j.queue,
           count(*) FILTER (WHERE j.status = 'queued') AS queued,
           count(*) FILTER (WHERE j.status = 'scheduled') AS scheduled,
           count(*) FILTER (WHERE j.status = 'blocked') AS blocked,
           count(*) FILTER (WHERE j.status = 'running') AS running,
           count(*) FILTER (WHERE j.status = 'recovery_required') AS recovery_required
    FROM jobsd.jobs AS j
    WHERE j.status NOT IN ('succeeded', 'failed', 'cancelled')
      AND (p_name IS NULL OR j.queue = p_name)
    GROUP BY j.queue) AS d ON d.queue = q.name
  WHERE p_name IS NULL OR q.name = p_name
  ORDER BY q.name
$$;

CREATE FUNCTION jobsd.queue_create(p_name text, p_capacity integer,
                                   p_concurrency_limit integer, p_retention_days integer)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
BEGIN
  INSERT INTO jobsd.queues AS q (name, capacity, concurrency_limit, retention_days)
  VALUES (p_name, p_capacity, p_concurrency_limit, p_retention_days)
  ON CONFLICT (name) DO NOTHING;
  RETURN FOUND;
END
$$;

-- Each limit changes only when its p_set_* is true (null then removes the limit).
CREATE FUNCTION jobsd.queue_set_limits(p_name text,
                                       p_set_capacity boolean, p_capacity integer,
                                       p_set_concurrency_limit boolean,
                                       p_concurrency_limit integer,
                                       p_set_retention_days boolean, p_retention_days integer)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
BEGIN
  UPDATE jobsd.queues AS q
  SET capacity = CASE WHEN p_set_capacity THEN p_capacity ELSE q.capacity END,
      concurrency_limit = CASE WHEN p_set_concurrency_limit THEN p_concurrency_limit
                               ELSE q.concurrency_limit END,
      retention_days = CASE WHEN p_set_retention_days THEN p_retention_days
                            ELSE q.retention_days END
  WHERE q.name = p_name;
  RETURN FOUND;
END
$$;

CREATE FUNCTION jobsd.queue_pause(p_name text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
BEGIN
  UPDATE jobsd.queues AS q SET paused_at = coalesce(q.paused_at, now())
  WHERE q.name = p_name;
  RETURN FOUND;
END
$$;

CREATE FUNCTION jobsd.queue_resume(p_name text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
BEGIN
  UPDATE jobsd.queues AS q SET paused_at = NULL WHERE q.name = p_name;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  PERFORM pg_catalog.pg_notify('jobsd', p_name);
  RETURN true;
END
$$;

-- A volatile function under READ COMMITTED: each statement below takes a fresh
-- snapshot, so the count after the lock sees every enqueue that committed first.
CREATE FUNCTION jobsd.queue_drop(p_name text, OUT queue_found boolean,
                                 OUT open_jobs bigint, OUT deleted_jobs bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
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
  DELETE FROM jobsd.queues AS q WHERE q.name = p_name;
END
$$;

REVOKE ALL ON FUNCTION jobsd.queue_info(text), jobsd.queue_create(text, integer, integer, integer),
  jobsd.queue_set_limits(text, boolean, integer, boolean, integer, boolean, integer),
  jobsd.queue_pause(text), jobsd.queue_resume(text), jobsd.queue_drop(text) FROM PUBLIC;
