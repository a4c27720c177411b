-- jobsd schema, version 32: each transition of a job is written once.
--
-- A job's history is every status change, in order (docs/states.md). Until now each
-- change was also a row of jobsd.job_events, written by triggers: on a drained job,
-- three rows (created, started, ended) and their index entries, the row's own update
-- carrying the same facts. Three of them can be read from the job's own row, written
-- by the statements that make them, so they are no longer stored twice:
--
-- * the creation (null -> queued): created_at; its id `created_event_id`, taken from
--   the history's sequence by the column's default at the insert;
-- * the current run's start (queued -> running): started_at, attempts, worker_id; its
--   id `start_event_id`, taken by the claim (jobs_claim_batch, jobs_start_reserved);
-- * that run's end when it ends the job (running -> succeeded, failed, cancelled):
--   finished_at, status, reason; its id `end_event_id`, taken by jobs_finish_batch.
--
-- Every other transition is stored in jobsd.job_events as before, and so is each of
-- the three when a statement makes it without taking its id: the row trigger
-- jobs_history_row fires for every status change that is not one of the two stamped
-- ones (its WHEN clause), so no code path can skip the history. When a run ends
-- without ending the job (a retry, a rescue), its start is stored then, under the id
-- its claim took, before the next claim stamps a new one. The creation is stored when
-- it is not a plain one (a job created scheduled or blocked, with a reason, or under
-- an actor), so a derived creation is always `null -> queued` by nobody.
--
-- jobsd.all_job_events (the history every read goes through, hot and archived) is
-- the stored rows and the derived ones of each job, with the same columns; ids come
-- from one sequence, so `ORDER BY id` is the order in which things happened, as
-- before. A derived event whose id is stored too (written by the trigger) is the
-- stored one. jobsd.job_events itself holds only the stored rows now.
--
-- The transition check (jobsd.transition_allowed) runs in the row trigger, for every
-- change but the two stamped ones, which are always allowed.
--
-- Never edit this file once shipped: add a new numbered migration instead.

-- The ids, last columns of jobs and of jobs_archive alike (archive_move copies a row
-- column by column). No default is added to existing rows: their history is stored.
ALTER TABLE jobsd.jobs
  ADD COLUMN created_event_id bigint,
  ADD COLUMN start_event_id bigint,
  ADD COLUMN end_event_id bigint;
ALTER TABLE jobsd.jobs_archive
  ADD COLUMN created_event_id bigint,
  ADD COLUMN start_event_id bigint,
  ADD COLUMN end_event_id bigint;
ALTER TABLE jobsd.jobs
  ALTER COLUMN created_event_id SET DEFAULT nextval('jobsd.job_events_id_seq');

-- the hot table and the archive as one, with the new columns (as 0028 made it)
CREATE OR REPLACE VIEW jobsd.all_jobs WITH (security_invoker = true) AS
  SELECT * FROM jobsd.jobs
  UNION ALL
  SELECT * FROM jobsd.jobs_archive;

-- Inserts: the creation is stored only when it is not a plain one; a new job carries
-- no run (a start or an end id at the insert is refused: it would be history no
-- statement wrote). Latest definition: 0020_lean_writes. Changed: the two points above.
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
  actor text := nullif(current_setting('jobsd.actor', true), '');
BEGIN
  -- a job starts queued, scheduled or blocked, with no run
  SELECT n.id, n.status INTO bad FROM new_jobs AS n
  WHERE n.status NOT IN ('queued', 'scheduled', 'blocked')
     OR n.start_event_id IS NOT NULL OR n.end_event_id IS NOT NULL
  LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'illegal transition of job %: a job starts queued, scheduled or blocked, not %',
      bad.id, CASE WHEN bad.status IN ('queued', 'scheduled', 'blocked') THEN 'running'
                   ELSE bad.status END
      USING ERRCODE = 'check_violation';
  END IF;

  INSERT INTO jobsd.job_events (id, job_id, org_id, from_status, to_status, attempt,
                                worker_id, reason)
  OVERRIDING SYSTEM VALUE
  SELECT coalesce(n.created_event_id, nextval('jobsd.job_events_id_seq')), n.id, n.org_id,
         NULL, n.status, n.attempts, coalesce(actor, n.worker_id), n.reason
  FROM new_jobs AS n
  WHERE n.status <> 'queued' OR actor IS NOT NULL OR n.worker_id IS NOT NULL
     OR n.reason IS NOT NULL OR n.attempts <> 0 OR n.created_event_id IS NULL;

  SELECT coalesce(bool_or(n.concurrency_key IS NOT NULL), false),
         coalesce(bool_or(qs.capacity IS NOT NULL), false),
         coalesce(bool_or(qs.org_open_limit IS NOT NULL), false)
  INTO keyed, capped, quota
  FROM new_jobs AS n LEFT JOIN jobsd.queues AS qs ON qs.name = n.queue;
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

-- Status changes that are not stamped on the row: checked, and stored. A run that
-- ends here had its start derived until now: that start is stored first, under the
-- id its claim took (unless it is stored already). A stamped change made under an
-- actor is stored under its stamp, so that the actor is its author.
CREATE FUNCTION jobsd.record_status_change_row() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
DECLARE
  actor text := nullif(current_setting('jobsd.actor', true), '');
  stamp bigint;
BEGIN
  IF NOT jobsd.transition_allowed(OLD.status, NEW.status) THEN
    RAISE EXCEPTION 'illegal transition of job %: % -> %', NEW.id, OLD.status, NEW.status
      USING ERRCODE = 'check_violation';
  END IF;
  IF OLD.status = 'running' AND OLD.start_event_id IS NOT NULL
     AND NOT EXISTS (SELECT 1 FROM jobsd.job_events AS e
                     WHERE e.job_id = OLD.id AND e.id = OLD.start_event_id) THEN
    INSERT INTO jobsd.job_events (id, job_id, org_id, from_status, to_status, attempt,
                                  worker_id, reason, at)
    OVERRIDING SYSTEM VALUE
    VALUES (OLD.start_event_id, OLD.id, OLD.org_id, 'queued', 'running', OLD.attempts,
            OLD.worker_id, NULL, OLD.started_at);
  END IF;
  stamp := CASE
    WHEN NEW.status = 'running' AND NEW.start_event_id IS DISTINCT FROM OLD.start_event_id
      THEN NEW.start_event_id
    WHEN OLD.status = 'running' AND NEW.end_event_id IS DISTINCT FROM OLD.end_event_id
      THEN NEW.end_event_id
  END;
  INSERT INTO jobsd.job_events (id, job_id, org_id, from_status, to_status, attempt,
                                worker_id, reason)
  OVERRIDING SYSTEM VALUE
  VALUES (coalesce(stamp, nextval('jobsd.job_events_id_seq')), NEW.id, NEW.org_id,
          OLD.status, NEW.status, NEW.attempts, coalesce(actor, NEW.worker_id), NEW.reason);
  RETURN NULL;
END
$$;

DROP TRIGGER jobs_history_update_stmt ON jobsd.jobs;
CREATE TRIGGER jobs_history_row
  AFTER UPDATE OF status ON jobsd.jobs
  FOR EACH ROW
  WHEN (OLD.status IS DISTINCT FROM NEW.status
        AND (NOT ((OLD.status = 'queued' AND NEW.status = 'running'
                   AND NEW.start_event_id IS DISTINCT FROM OLD.start_event_id)
                  OR (OLD.status = 'running'
                      AND NEW.status IN ('succeeded', 'failed', 'cancelled')
                      AND NEW.end_event_id IS DISTINCT FROM OLD.end_event_id))
             OR coalesce(current_setting('jobsd.actor', true), '') <> ''))
  EXECUTE FUNCTION jobsd.record_status_change_row();

-- The whole history: the stored rows, and the events each job's row stands for that
-- are not stored, hot and archived alike. Same columns as before (a replaced view
-- keeps its grants; its options are given again).
CREATE OR REPLACE VIEW jobsd.all_job_events WITH (security_invoker = true) AS
  SELECT e.id, e.job_id, e.org_id, e.from_status, e.to_status, e.attempt, e.worker_id,
         e.reason, e.at
  FROM jobsd.job_events AS e
  UNION ALL
  SELECT a.id, a.job_id, a.org_id, a.from_status, a.to_status, a.attempt, a.worker_id,
         a.reason, a.at
  FROM jobsd.job_events_archive AS a
  UNION ALL
  SELECT d.id, j.id, j.org_id, d.from_status, d.to_status, d.attempt, d.worker_id,
         d.reason, d.at
  FROM jobsd.all_jobs AS j
  CROSS JOIN LATERAL (VALUES
    (j.created_event_id, NULL::text, 'queued'::text, 0, NULL::text, NULL::text,
     j.created_at),
    (j.start_event_id, 'queued', 'running', j.attempts, j.worker_id, NULL, j.started_at),
    (j.end_event_id, 'running', j.status, j.attempts, j.worker_id, j.reason,
     j.finished_at))
    AS d(id, from_status, to_status, attempt, worker_id, reason, at)
  WHERE d.id IS NOT NULL
    -- (a job's stored events are hot or archived as the job is)
    AND NOT EXISTS (SELECT 1 FROM jobsd.job_events AS s
                    WHERE s.job_id = j.id AND s.id = d.id)
    AND NOT EXISTS (SELECT 1 FROM jobsd.job_events_archive AS s
                    WHERE s.job_id = j.id AND s.id = d.id);

-- The statements that stamp (the claim, the finish) take ids from the history's
-- sequence, and so does every insert (the column's default): the roles that insert
-- or update jobs may use it.
DO $$
DECLARE
  r record;
BEGIN
  FOR r IN
    SELECT a.rolname FROM pg_roles AS a
    WHERE (has_table_privilege(a.oid, 'jobsd.jobs', 'INSERT')
           OR has_table_privilege(a.oid, 'jobsd.jobs', 'UPDATE'))
      AND NOT a.rolsuper AND a.oid <> (SELECT c.relowner FROM pg_class AS c
                                       WHERE c.oid = 'jobsd.jobs'::regclass)
  LOOP
    EXECUTE format('GRANT USAGE ON SEQUENCE jobsd.job_events_id_seq TO %I', r.rolname);
  END LOOP;
END
$$;
