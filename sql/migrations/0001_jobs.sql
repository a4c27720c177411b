-- jobsd schema, version 1: queues, jobs, the history of every status change,
-- and the NOTIFY that wakes idle daemons.
--
-- Never edit this file once shipped: add a new numbered migration instead.

CREATE SCHEMA IF NOT EXISTS jobsd;

-- UUIDv7 ids made by the database: Postgres 18 has uuidv7(); older servers get
-- the same layout built here: 48-bit Unix milliseconds, version 7, 12 bits of
-- sub-millisecond fraction, variant 10, 62 random bits (jobsd.ids.uuid7 in Python
-- makes the same). Ids made a microsecond or more apart sort by creation time,
-- whichever side made them.
DO $body$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = 'pg_catalog' AND p.proname = 'uuidv7' AND p.pronargs = 0) THEN
    EXECUTE $f$CREATE FUNCTION jobsd.uuidv7() RETURNS uuid
      LANGUAGE sql VOLATILE PARALLEL SAFE AS 'SELECT pg_catalog.uuidv7()'$f$;
  ELSE
    EXECUTE $f$CREATE FUNCTION jobsd.uuidv7() RETURNS uuid
      LANGUAGE sql VOLATILE PARALLEL SAFE AS $sql$
        SELECT encode(
          overlay(uuid_send(gen_random_uuid())
                  PLACING int8send(((t.us / 1000) << 16) | x'7000'::int
                                   | ((t.us % 1000) * 4096 / 1000))
                  FROM 1 FOR 8),
          'hex')::uuid
        FROM (SELECT floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us) AS t
      $sql$$f$;
  END IF;
END
$body$;

CREATE TABLE jobsd.queues (
  name        text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$'),
  created_at  timestamptz NOT NULL DEFAULT now()
);

INSERT INTO jobsd.queues (name) VALUES ('default');

CREATE TABLE jobsd.jobs (
  id           uuid PRIMARY KEY DEFAULT jobsd.uuidv7(),
  org_id       text NOT NULL,
  type         text NOT NULL,
  queue        text NOT NULL DEFAULT 'default' REFERENCES jobsd.queues (name),
  status       text NOT NULL DEFAULT 'queued'
               CHECK (status IN ('queued', 'scheduled', 'blocked', 'running',
                                 'succeeded', 'failed', 'cancelled', 'recovery_required')),
  attempts     integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
  dedup_key    text,
  payload      jsonb NOT NULL DEFAULT '{}',
  progress     jsonb,
  report       jsonb,
  error        text CHECK (octet_length(error) <= 2048),
  -- why the job is in its current status; copied into job_events by the trigger
  reason       text,
  run_after    timestamptz NOT NULL DEFAULT now(),
  lease_id     uuid,
  worker_id    text,
  created_at   timestamptz NOT NULL DEFAULT now(),
  started_at   timestamptz,
  finished_at  timestamptz,
  -- unique per org: a tenant can neither collide with nor detect another's keys
  CONSTRAINT jobs_org_dedup_key_key UNIQUE (org_id, dedup_key)
);

CREATE INDEX jobs_org_type_created_idx ON jobsd.jobs (org_id, type, created_at DESC);
CREATE INDEX jobs_active_idx ON jobsd.jobs (status, created_at)
  WHERE status IN ('queued', 'running');
-- the claim reads the oldest claimable jobs, and only those
CREATE INDEX jobs_claim_idx ON jobsd.jobs (created_at, id) WHERE status = 'queued';
-- scheduled jobs become queued when due
CREATE INDEX jobs_scheduled_idx ON jobsd.jobs (run_after) WHERE status = 'scheduled';

CREATE TABLE jobsd.job_events (
  id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  job_id       uuid NOT NULL REFERENCES jobsd.jobs (id) ON DELETE CASCADE,
  org_id       text NOT NULL,
  from_status  text,
  to_status    text NOT NULL,
  attempt      integer NOT NULL,
  worker_id    text,
  reason       text,
  at           timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX job_events_job_idx ON jobsd.job_events (job_id, id);

-- History: one row per status change, in the same transaction, whatever code path
-- made it. The actor is the worker in the transaction-local setting jobsd.actor
-- (a sweeper acting on another worker's job), else the job's worker. Inserts are
-- recorded once per statement (a bulk enqueue writes its events in one INSERT);
-- status updates once per changed row (other updates never fire it).
CREATE FUNCTION jobsd.record_inserted_jobs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO jobsd.job_events (job_id, org_id, from_status, to_status, attempt, worker_id, reason)
  SELECT n.id, n.org_id, NULL, n.status, n.attempts,
         coalesce(nullif(current_setting('jobsd.actor', true), ''), n.worker_id), n.reason
  FROM new_jobs AS n;
  RETURN NULL;
END
$$;

CREATE FUNCTION jobsd.record_status_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO jobsd.job_events (job_id, org_id, from_status, to_status, attempt, worker_id, reason)
  VALUES (NEW.id, NEW.org_id, OLD.status, NEW.status, NEW.attempts,
          coalesce(nullif(current_setting('jobsd.actor', true), ''), NEW.worker_id),
          NEW.reason);
  RETURN NULL;
END
$$;

CREATE TRIGGER jobs_history_insert AFTER INSERT ON jobsd.jobs
  REFERENCING NEW TABLE AS new_jobs
  FOR EACH STATEMENT EXECUTE FUNCTION jobsd.record_inserted_jobs();
CREATE TRIGGER jobs_history_update AFTER UPDATE OF status ON jobsd.jobs
  FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
  EXECUTE FUNCTION jobsd.record_status_change();

-- Wake-up: once per statement and queue, never once per row. Postgres folds
-- identical notifications within a transaction, so a bulk insert or a
-- transaction of many inserts sends one per queue. The payload is only the
-- queue name. A scheduled job notifies too: an idle daemon learns its due time
-- and sleeps until then. `jobsd notify off` disables these triggers (poll-only).
CREATE FUNCTION jobsd.notify_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('jobsd', q.queue)
  FROM (SELECT DISTINCT queue FROM new_jobs WHERE status IN ('queued', 'scheduled')) AS q;
  RETURN NULL;
END
$$;

CREATE TRIGGER jobs_notify_insert AFTER INSERT ON jobsd.jobs
  REFERENCING NEW TABLE AS new_jobs
  FOR EACH STATEMENT EXECUTE FUNCTION jobsd.notify_inserted();

-- Transitions back to queued (a rescued job, a due scheduled job) are rare and
-- never on the enqueue path: a row trigger with a WHEN clause costs nothing on
-- the other updates.
CREATE FUNCTION jobsd.notify_requeued() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('jobsd', NEW.queue);
  RETURN NULL;
END
$$;

CREATE TRIGGER jobs_notify_requeue AFTER UPDATE OF status ON jobsd.jobs
  FOR EACH ROW WHEN (NEW.status = 'queued' AND OLD.status IS DISTINCT FROM 'queued')
  EXECUTE FUNCTION jobsd.notify_requeued();
