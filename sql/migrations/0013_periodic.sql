-- Periodic jobs (issue 16): schedules and the ticks they fired.
--
-- * jobsd.schedules: one row per schedule id, written by every scheduler that
--   declares it (the latest definition wins), with its state: paused, the last
--   tick fired and its job, and counters (fired, refused, late, skipped).
-- * jobsd.schedule_ticks: one row per fired tick. Its primary key (schedule_id,
--   tick) is what makes a tick fire once whatever the number of schedulers: the
--   row is inserted in the same transaction as the job (or the refusal), and a
--   second scheduler's insert of the same tick finds the conflict and does nothing.

CREATE TABLE jobsd.schedules (
  id            text PRIMARY KEY CHECK (id <> '' AND length(id) <= 200),
  type          text NOT NULL,
  org_id        text NOT NULL,
  queue         text NOT NULL,
  -- exactly one of cron (a cron expression, 5 or 6 fields) and every_ms (an interval)
  cron          text,
  every_ms      bigint CHECK (every_ms >= 1000),
  timezone      text NOT NULL DEFAULT 'UTC',
  payload       jsonb NOT NULL DEFAULT '{}'::jsonb,
  -- enqueue options of each tick's job
  priority        integer NOT NULL DEFAULT 0,
  dedup_key       text,
  concurrency_key text,
  catch_up      text NOT NULL DEFAULT 'latest' CHECK (catch_up IN ('latest', 'all', 'none')),
  catch_up_max  integer CHECK (catch_up_max >= 1),
  paused        boolean NOT NULL DEFAULT false,
  paused_at     timestamptz,
  -- ticks at or before the latest of created_at, resumed_at, last_tick and
  -- skipped_until never fire
  resumed_at    timestamptz,
  created_at    timestamptz NOT NULL DEFAULT now(),
  updated_at    timestamptz NOT NULL DEFAULT now(),
  last_tick     timestamptz,
  last_job_id   uuid,
  fired         bigint NOT NULL DEFAULT 0,
  refused       bigint NOT NULL DEFAULT 0,
  late          bigint NOT NULL DEFAULT 0,
  skipped       bigint NOT NULL DEFAULT 0,
  -- missed ticks up to here were skipped by the catch-up policy (counted once)
  skipped_until timestamptz,
  CONSTRAINT schedules_one_kind CHECK ((cron IS NULL) <> (every_ms IS NULL))
);

CREATE TABLE jobsd.schedule_ticks (
  schedule_id  text NOT NULL REFERENCES jobsd.schedules (id) ON DELETE CASCADE,
  tick         timestamptz NOT NULL,
  -- enqueued: a new job; existing: the enqueue returned a job holding the dedup
  -- key; refused: the enqueue was refused (full or unknown queue, bad payload)
  outcome      text NOT NULL CHECK (outcome IN ('enqueued', 'existing', 'refused')),
  job_id       uuid,
  reason       text,
  late         boolean NOT NULL DEFAULT false,
  worker_id    text,
  fired_at     timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (schedule_id, tick)
);

-- Every schedule (or one), with its last tick's outcome and its job's state, for
-- `jobsd schedule list` and GET /schedules. SECURITY DEFINER: the API runs as the
-- enqueue role, whose row-level security would hide the jobs of other orgs.
CREATE FUNCTION jobsd.schedule_info(p_id text)
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
         s.priority, s.dedup_key, s.concurrency_key, s.catch_up, s.catch_up_max, s.paused, s.paused_at, s.resumed_at, s.created_at,
         s.updated_at, s.last_tick, s.last_job_id, t.outcome, t.reason, j.status,
         s.fired, s.refused, s.late, s.skipped, s.skipped_until
  FROM jobsd.schedules AS s
  LEFT JOIN jobsd.schedule_ticks AS t ON t.schedule_id = s.id AND t.tick = s.last_tick
  LEFT JOIN jobsd.jobs AS j ON j.id = s.last_job_id
  WHERE p_id IS NULL OR s.id = p_id
  ORDER BY s.id
$$;

REVOKE ALL ON FUNCTION jobsd.schedule_info(text) FROM PUBLIC;
