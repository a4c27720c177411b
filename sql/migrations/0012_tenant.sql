-- jobsd schema, version 12: the tenant boundary (docs/security.md, "Who can do what").
--
-- * jobsd.role_orgs: which org a database role acts for. A row with an org pins the
--   role (a tenant's own login role) to that org, whatever jobsd.org_id it sets. A
--   row without an org marks a trusted multi-tenant role (the API's, the
--   application's): it acts for the org it sets in jobsd.org_id, per transaction.
--   A role with no row sees no row at all (fail closed). Both the current and the
--   session user count: a pinned login role that runs SET ROLE stays pinned, and a
--   login role of no row that is a member of a trusted role gains nothing by SET
--   ROLE (the setting counts only when the session user is trusted too, or a
--   superuser).
--   `jobsd roles create` registers its own roles; `--tenant ROLE --org ORG` pins one.
-- * The org policies of jobs, job_events, concurrency_keys and job_dependencies
--   (migrations 0003 and 0008) read jobsd.current_org() instead of the setting.
-- * api_tokens: row-level security (a role reads its own org's tokens only); the
--   API looks a token up through jobsd.api_token_lookup(hash). Admin tokens belong
--   to no org: org_id may be null, and only for admin tokens.
-- * jobsd.admin_actions: every change of queues, api_tokens and role_orgs, with
--   the database role and the actor the caller claimed (jobsd.actor).
-- * Tenants write history only through the database's own triggers (SECURITY
--   DEFINER from now on); a job moves to running only with a new lease, or by a
--   role that may write leases (the worker); a dependency links jobs of one org.
-- * Fairness between orgs: per-org limits on a queue, for every org of it:
--   org_running_limit (claims skip an org at its limit) and org_open_limit
--   (an insert beyond it is refused, SQLSTATE JQ003, DETAIL a JSON object).
--
-- Never edit this file once shipped: add a new numbered migration instead.

-- -- Roles and orgs ---------------------------------------------------------------

CREATE TABLE jobsd.role_orgs (
  role_name  text PRIMARY KEY,
  org_id     text CHECK (org_id <> ''),
  created_at timestamptz NOT NULL DEFAULT now()
);

-- Every role may read its own row (the policies read it as the caller), nobody
-- another's: which tenant has which role is nobody else's business.
ALTER TABLE jobsd.role_orgs ENABLE ROW LEVEL SECURITY;
CREATE POLICY role_orgs_own_row ON jobsd.role_orgs AS PERMISSIVE FOR SELECT TO PUBLIC
  USING (role_name IN (current_user, session_user));
GRANT SELECT ON jobsd.role_orgs TO PUBLIC;

-- The org the caller acts for: the pinned org of the current or session user (null
-- when they are pinned to two different orgs), else, for a trusted role logged in
-- as itself (or by a trusted role, or a superuser), the setting jobsd.org_id; else
-- null, which matches no row.
CREATE FUNCTION jobsd.current_org() RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
  SELECT CASE
    WHEN EXISTS (SELECT 1 FROM jobsd.role_orgs AS r
                 WHERE r.role_name IN (current_user, session_user) AND r.org_id IS NOT NULL)
      THEN (SELECT min(r.org_id) FROM jobsd.role_orgs AS r
            WHERE r.role_name IN (current_user, session_user) AND r.org_id IS NOT NULL
            HAVING count(DISTINCT r.org_id) = 1)
    WHEN EXISTS (SELECT 1 FROM jobsd.role_orgs AS r
                 WHERE r.role_name = current_user AND r.org_id IS NULL)
         AND (session_user = current_user
              OR EXISTS (SELECT 1 FROM jobsd.role_orgs AS r
                         WHERE r.role_name = session_user AND r.org_id IS NULL)
              OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles AS p
                         WHERE p.rolname = session_user AND p.rolsuper))
      THEN nullif(current_setting('jobsd.org_id', true), '')
  END
$$;

-- `(SELECT ...)`: evaluated once per statement (an init plan), not once per row.
ALTER POLICY jobs_org_isolation ON jobsd.jobs
  USING (org_id = (SELECT jobsd.current_org()))
  WITH CHECK (org_id = (SELECT jobsd.current_org()));
ALTER POLICY job_events_org_isolation ON jobsd.job_events
  USING (org_id = (SELECT jobsd.current_org()))
  WITH CHECK (org_id = (SELECT jobsd.current_org()));
ALTER POLICY concurrency_keys_org_isolation ON jobsd.concurrency_keys
  USING (org_id = (SELECT jobsd.current_org()))
  WITH CHECK (org_id = (SELECT jobsd.current_org()));
ALTER POLICY job_dependencies_org_isolation ON jobsd.job_dependencies
  USING (org_id = (SELECT jobsd.current_org()))
  WITH CHECK (org_id = (SELECT jobsd.current_org()));

-- -- Tokens ----------------------------------------------------------------------

ALTER TABLE jobsd.api_tokens ALTER COLUMN org_id DROP NOT NULL;
ALTER TABLE jobsd.api_tokens
  ADD CONSTRAINT api_tokens_org_or_admin CHECK (org_id IS NOT NULL OR admin);

ALTER TABLE jobsd.api_tokens ENABLE ROW LEVEL SECURITY;
CREATE POLICY api_tokens_org_isolation ON jobsd.api_tokens AS PERMISSIVE FOR ALL TO PUBLIC
  USING (org_id = (SELECT jobsd.current_org()))
  WITH CHECK (org_id = (SELECT jobsd.current_org()));

-- The lookup before the org is known: by hash only, one row, no hash returned.
CREATE FUNCTION jobsd.api_token_lookup(p_token_hash bytea)
RETURNS TABLE (id uuid, org_id text, admin boolean)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
  SELECT t.id, t.org_id, t.admin FROM jobsd.api_tokens AS t
  WHERE t.token_hash = p_token_hash AND t.revoked_at IS NULL
$$;
REVOKE ALL ON FUNCTION jobsd.api_token_lookup(bytea) FROM PUBLIC;

-- -- The audit of administration -------------------------------------------------

CREATE TABLE jobsd.admin_actions (
  id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  at         timestamptz NOT NULL DEFAULT now(),
  db_role    text NOT NULL,
  actor      text NOT NULL,
  object     text NOT NULL,
  action     text NOT NULL,
  name       text,
  before     jsonb,
  after      jsonb
);

CREATE INDEX admin_actions_at_idx ON jobsd.admin_actions (at);
-- Row-level security and no policy: only the owner (and superusers) read it; the
-- read role's SELECT on every table shows nothing of it.
ALTER TABLE jobsd.admin_actions ENABLE ROW LEVEL SECURITY;

CREATE FUNCTION jobsd.record_admin_action() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
DECLARE
  old_row jsonb := CASE WHEN TG_OP <> 'INSERT' THEN to_jsonb(OLD) - 'token_hash' END;
  new_row jsonb := CASE WHEN TG_OP <> 'DELETE' THEN to_jsonb(NEW) - 'token_hash' END;
  key text := CASE TG_TABLE_NAME WHEN 'queues' THEN 'name' WHEN 'api_tokens' THEN 'id'
                                 ELSE 'role_name' END;
BEGIN
  INSERT INTO jobsd.admin_actions (db_role, actor, object, action, name, before, after)
  VALUES (session_user,
          coalesce(nullif(current_setting('jobsd.actor', true), ''), session_user),
          TG_TABLE_NAME, lower(TG_OP), coalesce(new_row, old_row) ->> key, old_row, new_row);
  RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION jobsd.record_admin_action() FROM PUBLIC;

-- Updates that change nothing (the admission's row lock on a queue) are not actions.
CREATE TRIGGER queues_audit_write AFTER INSERT OR DELETE ON jobsd.queues
  FOR EACH ROW EXECUTE FUNCTION jobsd.record_admin_action();
CREATE TRIGGER queues_audit_update AFTER UPDATE ON jobsd.queues
  FOR EACH ROW WHEN (OLD.* IS DISTINCT FROM NEW.*)
  EXECUTE FUNCTION jobsd.record_admin_action();
CREATE TRIGGER api_tokens_audit AFTER INSERT OR UPDATE OR DELETE ON jobsd.api_tokens
  FOR EACH ROW EXECUTE FUNCTION jobsd.record_admin_action();
CREATE TRIGGER role_orgs_audit AFTER INSERT OR UPDATE OR DELETE ON jobsd.role_orgs
  FOR EACH ROW EXECUTE FUNCTION jobsd.record_admin_action();

-- Dropping a queue is the owner's (`jobsd queue drop`): nobody else may run it,
-- whatever a later `roles create` of an older version granted.
REVOKE ALL ON FUNCTION jobsd.queue_drop(text) FROM PUBLIC;

-- -- History and running: only through the database's own paths ------------------

-- The history triggers write job_events as their owner: no role needs INSERT on
-- job_events to enqueue or cancel, so a tenant cannot forge history.
ALTER FUNCTION jobsd.record_inserted_jobs() SECURITY DEFINER;
ALTER FUNCTION jobsd.record_inserted_jobs() SET search_path = pg_catalog, jobsd, pg_temp;
ALTER FUNCTION jobsd.record_status_change() SECURITY DEFINER;
ALTER FUNCTION jobsd.record_status_change() SET search_path = pg_catalog, jobsd, pg_temp;
REVOKE ALL ON FUNCTION jobsd.record_inserted_jobs(), jobsd.record_status_change() FROM PUBLIC;

-- A claim always writes a new lease. A move into running that keeps the lease is
-- allowed only to a role that may write leases (the worker, the owner): the
-- enqueue role, which may update status to cancel, cannot start a job by hand
-- (such a job would have no owner and never be swept).
CREATE FUNCTION jobsd.refuse_manual_run() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
BEGIN
  IF NOT has_column_privilege('jobsd.jobs', 'lease_id', 'UPDATE') THEN
    RAISE EXCEPTION 'job % cannot be moved to running by hand', NEW.id
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  RETURN NEW;
END
$$;

CREATE TRIGGER jobs_refuse_manual_run BEFORE UPDATE OF status ON jobsd.jobs
  FOR EACH ROW
  WHEN (NEW.status = 'running' AND OLD.status IS DISTINCT FROM 'running'
        AND NEW.lease_id IS NOT DISTINCT FROM OLD.lease_id)
  EXECUTE FUNCTION jobsd.refuse_manual_run();

-- A dependency edge links two jobs of the edge's own org (the foreign keys alone
-- would let raw SQL link another org's job, and learn its state).
CREATE FUNCTION jobsd.check_dependency_org() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
BEGIN
  IF (SELECT count(*) FROM jobsd.jobs AS j
      WHERE j.id IN (NEW.job_id, NEW.depends_on) AND j.org_id = NEW.org_id) <> 2 THEN
    RAISE EXCEPTION 'unknown dependency %', NEW.depends_on
      USING ERRCODE = 'foreign_key_violation';
  END IF;
  RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION jobsd.check_dependency_org() FROM PUBLIC;

CREATE TRIGGER job_dependencies_same_org BEFORE INSERT OR UPDATE ON jobsd.job_dependencies
  FOR EACH ROW EXECUTE FUNCTION jobsd.check_dependency_org();

-- -- Fairness between orgs -------------------------------------------------------

ALTER TABLE jobsd.queues
  ADD COLUMN org_running_limit integer CHECK (org_running_limit > 0),
  ADD COLUMN org_open_limit integer CHECK (org_open_limit > 0);

-- The claim counts an org's running jobs in a queue with an org_running_limit, and
-- the admission its open jobs: both read this index, never the other orgs' rows.
CREATE INDEX jobs_open_by_queue_org_idx ON jobsd.jobs (queue, org_id, status)
  WHERE status NOT IN ('succeeded', 'failed', 'cancelled');

-- Admission of the org quota, once per insert statement: for each (queue, org)
-- among the new open jobs whose queue has an org_open_limit, take a transaction
-- lock on the pair (concurrent enqueues of one org into one queue take turns;
-- the count after the lock runs on a fresh snapshot under READ COMMITTED), count
-- the org's open jobs there, ours included, and refuse the whole statement beyond
-- the limit. Other orgs never wait on this lock.
CREATE FUNCTION jobsd.admit_org_quota() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
DECLARE
  g record;
  open_jobs bigint;
BEGIN
  IF NOT EXISTS (SELECT 1 FROM jobsd.queues AS q
                 WHERE q.org_open_limit IS NOT NULL
                   AND q.name IN (SELECT n.queue FROM new_jobs AS n)) THEN
    RETURN NULL;
  END IF;
  FOR g IN
    SELECT DISTINCT n.queue, n.org_id, q.org_open_limit AS quota
    FROM new_jobs AS n JOIN jobsd.queues AS q ON q.name = n.queue
    WHERE q.org_open_limit IS NOT NULL
      AND n.status NOT IN ('succeeded', 'failed', 'cancelled')
    ORDER BY n.queue, n.org_id
  LOOP
    PERFORM pg_advisory_xact_lock(
      hashtextextended('jobsd org quota ' || g.queue || ' ' || g.org_id, 0));
    SELECT count(*) INTO open_jobs FROM (
      SELECT 1 FROM jobsd.jobs AS j
      WHERE j.queue = g.queue AND j.org_id = g.org_id
        AND j.status NOT IN ('succeeded', 'failed', 'cancelled')
      LIMIT g.quota + 1) AS o;
    IF open_jobs > g.quota THEN
      RAISE EXCEPTION 'org quota of queue % reached: % open jobs at most', g.queue, g.quota
        USING ERRCODE = 'JQ003',
              DETAIL = json_build_object('queue', g.queue, 'org_open_limit', g.quota)::text;
    END IF;
  END LOOP;
  RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION jobsd.admit_org_quota() FROM PUBLIC;

CREATE TRIGGER jobs_admit_org_quota AFTER INSERT ON jobsd.jobs
  REFERENCING NEW TABLE AS new_jobs
  FOR EACH STATEMENT EXECUTE FUNCTION jobsd.admit_org_quota();

-- Set the per-org limits of a queue (each only when its p_set_* is true; null
-- removes it). Granted like queue_set_limits: the admin role, the API's role.
CREATE FUNCTION jobsd.queue_set_org_limits(p_name text,
                                           p_set_running boolean, p_running integer,
                                           p_set_open boolean, p_open integer)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
BEGIN
  UPDATE jobsd.queues AS q
  SET org_running_limit = CASE WHEN p_set_running THEN p_running ELSE q.org_running_limit END,
      org_open_limit = CASE WHEN p_set_open THEN p_open ELSE q.org_open_limit END
  WHERE q.name = p_name;
  RETURN FOUND;
END
$$;
REVOKE ALL ON FUNCTION jobsd.queue_set_org_limits(text, boolean, integer, boolean, integer)
  FROM PUBLIC;

-- -- Done-notifications reveal nothing across orgs ---------------------------------

-- Any role may LISTEN on any channel: the payload of 'jobsd_done' is no longer the
-- job id but md5(key || id), with a key of this database that only the owner and
-- the trusted roles (through jobsd.done_notify_key(), granted by `jobsd roles
-- create`) can read. The API's waiter hashes the ids it waits for; a tenant's role
-- learns no id. Row-level security without a policy hides the key from the read
-- role's SELECT on every table.
CREATE TABLE jobsd.done_key (
  one  boolean PRIMARY KEY DEFAULT true CHECK (one),
  key  text NOT NULL DEFAULT gen_random_uuid()::text
);
INSERT INTO jobsd.done_key DEFAULT VALUES;
ALTER TABLE jobsd.done_key ENABLE ROW LEVEL SECURITY;

CREATE FUNCTION jobsd.done_notify_key() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$ SELECT k.key FROM jobsd.done_key AS k $$;
REVOKE ALL ON FUNCTION jobsd.done_notify_key() FROM PUBLIC;

-- Redefined from migration 0002 (its latest definition): the payload is hashed.
CREATE OR REPLACE FUNCTION jobsd.notify_done() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
BEGIN
  PERFORM pg_notify('jobsd_done',
                    md5((SELECT k.key FROM jobsd.done_key AS k) || NEW.id::text));
  RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION jobsd.notify_done() FROM PUBLIC;
