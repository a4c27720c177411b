-- jobsd schema, version 8: flow control (docs/queues.md).
--
-- * Queue controls: capacity (open jobs at most), concurrency_limit (running jobs
--   of one concurrency key at most; 1 when unset), retention_days (how long
--   `jobsd prune` keeps terminal jobs; forever when unset), paused_at (no claims
--   while set).
-- * Job columns: priority (lower runs first, then FIFO), concurrency_key, and
--   has_dependents (set when a job is named in another's depends_on, so the
--   dependency trigger fires only for jobs that have dependents).
-- * jobsd.concurrency_keys: one row per (org, key) with the number of jobs of that
--   key running now. Claims lock the row and read the count there, so two daemons
--   claiming at once can never run more than the limit.
-- * jobsd.job_dependencies: the edges of depends_on.
-- * The claim index is (queue, priority, created_at, id) over queued jobs: a claim
--   reads each unpaused queue from its head, whatever the other queues hold.
-- * Admin tokens: api_tokens.admin allows the queue endpoints of the HTTP API.
--
-- Never edit this file once shipped: add a new numbered migration instead.

ALTER TABLE jobsd.queues
  ADD COLUMN capacity integer CHECK (capacity > 0),
  ADD COLUMN concurrency_limit integer CHECK (concurrency_limit > 0),
  ADD COLUMN retention_days integer CHECK (retention_days >= 0),
  ADD COLUMN paused_at timestamptz;

ALTER TABLE jobsd.jobs
  ADD COLUMN priority integer NOT NULL DEFAULT 0,
  ADD COLUMN concurrency_key text
    CHECK (concurrency_key <> '' AND octet_length(concurrency_key) <= 255),
  ADD COLUMN has_dependents boolean NOT NULL DEFAULT false;

ALTER TABLE jobsd.api_tokens ADD COLUMN admin boolean NOT NULL DEFAULT false;

-- The claim reads each queue in claim order; the old (created_at, id) index knows
-- neither queue nor priority, and every index costs every enqueue.
CREATE INDEX jobs_claim_v2_idx ON jobsd.jobs (queue, priority, created_at, id)
  WHERE status = 'queued';
DROP INDEX jobsd.jobs_claim_idx;

-- Open (non-terminal) jobs by queue: the capacity check, `queue list`, `queue drop`.
CREATE INDEX jobs_open_by_queue_idx ON jobsd.jobs (queue, status)
  WHERE status NOT IN ('succeeded', 'failed', 'cancelled');

CREATE TABLE jobsd.concurrency_keys (
  org_id           text NOT NULL,
  concurrency_key  text NOT NULL,
  running          integer NOT NULL DEFAULT 0,
  PRIMARY KEY (org_id, concurrency_key)
);

CREATE TABLE jobsd.job_dependencies (
  job_id      uuid NOT NULL REFERENCES jobsd.jobs (id) ON DELETE CASCADE,
  depends_on  uuid NOT NULL REFERENCES jobsd.jobs (id) ON DELETE CASCADE,
  org_id      text NOT NULL,
  PRIMARY KEY (job_id, depends_on),
  CHECK (job_id <> depends_on)
);

CREATE INDEX job_dependencies_depends_on_idx ON jobsd.job_dependencies (depends_on);

-- Tenants: the same isolation as jobs (migration 0003); `jobsd roles create` adds
-- the worker's all-orgs policy.
ALTER TABLE jobsd.concurrency_keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE jobsd.job_dependencies ENABLE ROW LEVEL SECURITY;

CREATE POLICY concurrency_keys_org_isolation ON jobsd.concurrency_keys
  AS PERMISSIVE FOR ALL TO PUBLIC
  USING (org_id = nullif(current_setting('jobsd.org_id', true), ''))
  WITH CHECK (org_id = nullif(current_setting('jobsd.org_id', true), ''));

CREATE POLICY job_dependencies_org_isolation ON jobsd.job_dependencies
  AS PERMISSIVE FOR ALL TO PUBLIC
  USING (org_id = nullif(current_setting('jobsd.org_id', true), ''))
  WITH CHECK (org_id = nullif(current_setting('jobsd.org_id', true), ''));

-- A blocked job whose dependencies succeeded waits for its run_after like any other.
CREATE OR REPLACE FUNCTION jobsd.transition_allowed(from_status text, to_status text)
  RETURNS boolean
  LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT CASE from_status
    WHEN 'queued'            THEN to_status IN ('running', 'cancelled')
    WHEN 'scheduled'         THEN to_status IN ('queued', 'cancelled')
    WHEN 'blocked'           THEN to_status IN ('queued', 'scheduled', 'failed', 'cancelled')
    WHEN 'running'           THEN to_status IN ('succeeded', 'failed', 'cancelled', 'queued',
                                                'scheduled', 'recovery_required')
    WHEN 'recovery_required' THEN to_status IN ('succeeded', 'failed', 'queued', 'cancelled')
    ELSE false  -- succeeded, failed, cancelled: terminal
  END
$$;

-- Admission, once per insert statement, whatever code path inserted:
-- 1. capacity: for each queue with a capacity among the new jobs, take the queue
--    row (an UPDATE: under READ COMMITTED concurrent enqueues into the queue wait
--    here for each other; under REPEATABLE READ the second one fails with a
--    serialization error instead of counting a stale snapshot), then count the
--    open jobs, ours included, and refuse the whole statement beyond capacity
--    (SQLSTATE JQ001, DETAIL a JSON object with queue, capacity and open).
-- 2. concurrency keys: make sure each key has its counter row, so that claims can
--    lock it.
-- SECURITY DEFINER: capacity counts every org's jobs, and the enqueue role needs
-- no right on queues or concurrency_keys.
CREATE FUNCTION jobsd.admit_inserted_jobs() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
DECLARE
  q record;
  cap integer;
  open_jobs bigint;
BEGIN
  -- the common case, a job without a key into a queue without a capacity: one query
  IF NOT EXISTS (
    SELECT 1 FROM new_jobs AS n
    WHERE n.concurrency_key IS NOT NULL
       OR EXISTS (SELECT 1 FROM jobsd.queues AS qs
                  WHERE qs.name = n.queue AND qs.capacity IS NOT NULL)) THEN
    RETURN NULL;
  END IF;

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

  INSERT INTO jobsd.concurrency_keys (org_id, concurrency_key)
  SELECT DISTINCT n.org_id, n.concurrency_key FROM new_jobs AS n
  WHERE n.concurrency_key IS NOT NULL
  ORDER BY 1, 2
  ON CONFLICT DO NOTHING;
  RETURN NULL;
END
$$;

CREATE TRIGGER jobs_admit_insert AFTER INSERT ON jobsd.jobs
  REFERENCING NEW TABLE AS new_jobs
  FOR EACH STATEMENT EXECUTE FUNCTION jobsd.admit_inserted_jobs();

-- The running count of a concurrency key follows its jobs into and out of running.
-- The WHEN clause keeps jobs without a key free of any call.
CREATE FUNCTION jobsd.count_key_runs() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
BEGIN
  IF NEW.status = 'running' THEN
    INSERT INTO jobsd.concurrency_keys AS k (org_id, concurrency_key, running)
    VALUES (NEW.org_id, NEW.concurrency_key, 1)
    ON CONFLICT (org_id, concurrency_key) DO UPDATE SET running = k.running + 1;
  ELSE
    UPDATE jobsd.concurrency_keys AS k SET running = greatest(k.running - 1, 0)
    WHERE k.org_id = NEW.org_id AND k.concurrency_key = NEW.concurrency_key;
  END IF;
  RETURN NULL;
END
$$;

CREATE TRIGGER jobs_count_key_runs AFTER UPDATE OF status ON jobsd.jobs
  FOR EACH ROW
  WHEN (NEW.concurrency_key IS NOT NULL
        AND (OLD.status = 'running') IS DISTINCT FROM (NEW.status = 'running'))
  EXECUTE FUNCTION jobsd.count_key_runs();

-- When a job with dependents ends: each blocked dependent is locked (in id order,
-- so two ending dependencies take turns), then decided on a fresh snapshot, so
-- the last of several dependencies to succeed always sees the others succeeded.
-- Succeeded: dependents whose every dependency succeeded become queued (scheduled
-- when their run_after is still ahead). Failed or cancelled: blocked dependents
-- fail with 'dependency <id> <state>', which fires this trigger for their own
-- dependents, down the chain.
CREATE FUNCTION jobsd.settle_dependents() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
DECLARE
  why text;
  released record;
BEGIN
  PERFORM 1 FROM jobsd.jobs AS j
  WHERE j.id IN (SELECT d.job_id FROM jobsd.job_dependencies AS d WHERE d.depends_on = NEW.id)
    AND j.status = 'blocked'
  ORDER BY j.id
  FOR UPDATE OF j;

  IF NEW.status = 'succeeded' THEN
    -- queued ones notify through jobs_notify_requeue; a scheduled one notifies here,
    -- so an idle daemon learns its due time now rather than at its next poll
    FOR released IN
      UPDATE jobsd.jobs AS j
      SET status = CASE WHEN j.run_after > now() THEN 'scheduled' ELSE 'queued' END,
          reason = 'dependencies succeeded'
      WHERE j.id IN (SELECT d.job_id FROM jobsd.job_dependencies AS d
                     WHERE d.depends_on = NEW.id)
        AND j.status = 'blocked'
        AND NOT EXISTS (SELECT 1 FROM jobsd.job_dependencies AS d
                        JOIN jobsd.jobs AS p ON p.id = d.depends_on
                        WHERE d.job_id = j.id AND p.status <> 'succeeded')
      RETURNING j.queue, j.status
    LOOP
      IF released.status = 'scheduled' THEN
        PERFORM pg_notify('jobsd', released.queue);
      END IF;
    END LOOP;
  ELSE
    why := format('dependency %s %s', NEW.id, NEW.status);
    UPDATE jobsd.jobs AS j
    SET status = 'failed', reason = why, error = why, finished_at = now(),
        dedup_key = NULL
    WHERE j.id IN (SELECT d.job_id FROM jobsd.job_dependencies AS d
                   WHERE d.depends_on = NEW.id)
      AND j.status = 'blocked';
  END IF;
  RETURN NULL;
END
$$;

CREATE TRIGGER jobs_settle_dependents AFTER UPDATE OF status ON jobsd.jobs
  FOR EACH ROW
  WHEN (NEW.has_dependents AND NEW.status IN ('succeeded', 'failed', 'cancelled')
        AND OLD.status IS DISTINCT FROM NEW.status)
  EXECUTE FUNCTION jobsd.settle_dependents();

-- Pickup lag in claim order, paused queues left out (their jobs wait on purpose).
CREATE OR REPLACE FUNCTION jobsd.oldest_queued_age_s()
RETURNS float8
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
  SELECT extract(epoch FROM now() - min(greatest(w.created_at, w.run_after)))::float8
  FROM jobsd.queues AS q
  CROSS JOIN LATERAL (
    SELECT j.created_at, j.run_after FROM jobsd.jobs AS j
    WHERE j.status = 'queued' AND j.queue = q.name
    ORDER BY j.priority, j.created_at, j.id LIMIT 1000) AS w
  WHERE q.paused_at IS NULL
$$;

REVOKE ALL ON FUNCTION jobsd.admit_inserted_jobs(), jobsd.count_key_runs(),
  jobsd.settle_dependents() FROM PUBLIC;
