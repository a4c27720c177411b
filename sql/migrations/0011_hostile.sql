-- jobsd schema, version 11: hostile load and input (issue 12, docs/security.md
-- "Limits on input", docs/decisions.md "Poison is not an outage").
--
-- * Dependency failures cascade set-based: when a job with dependents fails or is
--   cancelled, every blocked job that depends on it, directly or not, fails in one
--   UPDATE (the closure is one recursive query). The trigger used to fail the direct
--   dependents only, which fired it again for theirs, one nesting level per link: a
--   chain a few thousand long exceeded Postgres's stack depth (54001) and the
--   cancel or the outcome that started it could never be written. The cascaded rows
--   fire the trigger too; it returns at once for them (the transaction-local setting
--   jobsd.cascading), since the closure covered their dependents already.
-- * Size caps in the database, whatever code path inserts (raw SQL included), with
--   the limits of the API and the settings' defaults: payload, report and progress
--   at most 1 MiB (1048576 bytes) of JSON as Postgres writes it (jsonb::text), type
--   at most 200 characters, dedup_key at most 512 characters, org_id at most 255
--   bytes (so an (org_id, dedup_key) entry always fits the unique btree index).
--   Added NOT VALID, then validated.
-- * Capacity arithmetic in bigint: a queue of capacity 2147483647 (the largest
--   integer) made the admission trigger compute cap + 1 in integer, which
--   overflowed and failed every enqueue into it. The trigger's `cap integer` becomes
--   `cap bigint`; nothing else of it changes. It is rewritten from its current
--   definition (pg_get_functiondef), so a later admission function that keeps the
--   variable (after_insert_jobs, when a migration before this one has it) gets the
--   same fix.
--
-- Never edit this file once shipped: add a new numbered migration instead.

-- Latest definition: migration 0008. Changed: the failure branch (set-based closure)
-- and the early return for rows the closure already failed; jit off.
CREATE OR REPLACE FUNCTION jobsd.settle_dependents() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
SET jit = off  -- a fresh chain's stale statistics made the cascade look huge: 1.5 s of JIT
AS $$
DECLARE
  why text;
  released record;
  doomed uuid[];
BEGIN
  IF NEW.status <> 'succeeded'
     AND current_setting('jobsd.cascading', true) = 'on' THEN
    -- failed by a cascade: its own dependents were in that cascade's closure
    RETURN NULL;
  END IF;

  IF NEW.status = 'succeeded' THEN
    PERFORM 1 FROM jobsd.jobs AS j
    WHERE j.id IN (SELECT d.job_id FROM jobsd.job_dependencies AS d WHERE d.depends_on = NEW.id)
      AND j.status = 'blocked'
    ORDER BY j.id
    FOR UPDATE OF j;
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
    RETURN NULL;
  END IF;

  -- Failed or cancelled: every blocked job downstream, in one statement. UNION (not
  -- UNION ALL) visits each job once, however many paths lead to it.
  -- The recursive step is a LATERAL lookup per job found (index scans on
  -- job_dependencies_depends_on_idx and the primary key): with the statistics of a
  -- freshly written chain the planner would otherwise hash-join whole tables once
  -- per link.
  WITH RECURSIVE closure (id) AS (
    SELECT d.job_id FROM jobsd.job_dependencies AS d
    WHERE d.depends_on = NEW.id
      AND (SELECT j.status FROM jobsd.jobs AS j WHERE j.id = d.job_id) = 'blocked'
    UNION
    SELECT n.job_id FROM closure AS c
    CROSS JOIN LATERAL (
      SELECT d.job_id FROM jobsd.job_dependencies AS d
      WHERE d.depends_on = c.id
        AND (SELECT j.status FROM jobsd.jobs AS j WHERE j.id = d.job_id) = 'blocked') AS n)
  SELECT array_agg(c.id ORDER BY c.id) INTO doomed FROM closure AS c;
  IF doomed IS NULL THEN
    RETURN NULL;
  END IF;

  -- locked in id order, as before, so two ending dependencies take turns
  PERFORM 1 FROM jobsd.jobs AS j WHERE j.id = ANY (doomed) ORDER BY j.id FOR UPDATE OF j;

  PERFORM set_config('jobsd.cascading', 'on', true);
  -- the reason names a dependency of the job that ended: the one that started the
  -- cascade (with its status), else one the cascade failed
  UPDATE jobsd.jobs AS j
  SET status = 'failed', reason = w.why, error = w.why, finished_at = now(),
      dedup_key = NULL
  FROM (
    SELECT DISTINCT ON (d.job_id) d.job_id AS id,
           CASE WHEN d.depends_on = NEW.id THEN format('dependency %s %s', NEW.id, NEW.status)
                ELSE format('dependency %s failed', d.depends_on) END AS why
    FROM unnest(doomed) AS x (id)
    JOIN jobsd.job_dependencies AS d ON d.job_id = x.id
    JOIN (SELECT u.id FROM unnest(doomed) AS u (id) UNION ALL SELECT NEW.id) AS up (id)
      ON up.id = d.depends_on
    ORDER BY d.job_id, d.depends_on = NEW.id DESC, d.depends_on) AS w
  WHERE j.id = w.id AND j.status = 'blocked';
  PERFORM set_config('jobsd.cascading', '', true);
  RETURN NULL;
END
$$;

-- Capacity in bigint: see the header. Rewrites each admission function that declares
-- `cap integer;` (admit_inserted_jobs from 0008; after_insert_jobs if present).
DO $do$
DECLARE
  f regprocedure;
  body text;
BEGIN
  FOR f IN
    SELECT p.oid::regprocedure FROM pg_proc AS p
    JOIN pg_namespace AS n ON n.oid = p.pronamespace
    WHERE n.nspname = 'jobsd' AND p.proname IN ('admit_inserted_jobs', 'after_insert_jobs')
  LOOP
    body := pg_get_functiondef(f);
    CONTINUE WHEN position('cap integer;' IN body) = 0;
    EXECUTE replace(body, 'cap integer;', 'cap bigint;');
  END LOOP;
END
$do$;

-- Size caps: see the header. jsonb::text is what Postgres writes back (", " and ": "
-- between items, numbers in full), a measure every path shares.
ALTER TABLE jobsd.jobs
  ADD CONSTRAINT jobs_payload_size CHECK (octet_length(payload::text) <= 1048576) NOT VALID,
  ADD CONSTRAINT jobs_report_size CHECK (octet_length(report::text) <= 1048576) NOT VALID,
  ADD CONSTRAINT jobs_progress_size CHECK (octet_length(progress::text) <= 1048576) NOT VALID,
  ADD CONSTRAINT jobs_type_size CHECK (char_length(type) <= 200) NOT VALID,
  ADD CONSTRAINT jobs_dedup_key_size CHECK (char_length(dedup_key) <= 512) NOT VALID,
  ADD CONSTRAINT jobs_org_id_size CHECK (octet_length(org_id) <= 255) NOT VALID;

ALTER TABLE jobsd.jobs VALIDATE CONSTRAINT jobs_payload_size;
ALTER TABLE jobsd.jobs VALIDATE CONSTRAINT jobs_report_size;
ALTER TABLE jobsd.jobs VALIDATE CONSTRAINT jobs_progress_size;
ALTER TABLE jobsd.jobs VALIDATE CONSTRAINT jobs_type_size;
ALTER TABLE jobsd.jobs VALIDATE CONSTRAINT jobs_dedup_key_size;
ALTER TABLE jobsd.jobs VALIDATE CONSTRAINT jobs_org_id_size;
