-- The least-privilege roles of `jobsd roles create`. Roles are cluster-wide and
-- grants are per database, so this is not a migration: the command runs these
-- blocks in one transaction, on the database named by its URL, after `jobsd
-- migrate`, and again after every upgrade (it is idempotent).
--
-- {owner}, {enqueue}, {worker}, {read}, {admin}, {api}, {role}, {database}, {password}
-- and {policy}
-- are filled in by jobsd.roles as quoted identifiers or literals.
-- Blocks without placeholders take bind parameters instead.

-- name: roles_lock
SELECT pg_advisory_xact_lock(hashtextextended('jobsd roles create', 0));

-- name: roles_runner
SELECT r.rolsuper, r.rolcreaterole, current_database() AS database
FROM pg_roles AS r WHERE r.rolname = current_user;

-- name: roles_schema_state
SELECT to_regclass('jobsd.jobs') IS NOT NULL AS migrated,
       coalesce((SELECT c.relrowsecurity FROM pg_class AS c
                 WHERE c.oid = to_regclass('jobsd.jobs')), false) AS rls,
       to_regclass('jobsd.api_tokens') IS NOT NULL AS has_api_tokens,
       to_regclass('jobsd.role_orgs') IS NOT NULL AS has_role_orgs;

-- name: roles_existing
SELECT rolname, rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls,
       rolcanlogin
FROM pg_roles WHERE rolname = ANY(%(names)s::text[]);

-- name: roles_create
-- The defaults: NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS INHERIT.
CREATE ROLE {role} LOGIN;

-- name: roles_login
ALTER ROLE {role} LOGIN;

-- name: roles_set_password
ALTER ROLE {role} PASSWORD {password};

-- name: roles_grant_database
GRANT CONNECT ON DATABASE {database} TO {owner}, {enqueue}, {worker}, {read}, {admin}, {api};
-- the migrations' bookkeeping runs CREATE SCHEMA IF NOT EXISTS
GRANT CREATE ON DATABASE {database} TO {owner};

-- name: roles_foreign_objects
-- What the owner role must own to run migrations: the schema and every table,
-- view, free-standing sequence, function and procedure in it (indexes, identity sequences
-- and row types follow their table; a partition does not follow its parent, and a
-- partitioned table's dependency on itself, through its partition key, is no owner).
-- `target` is the object's name as Postgres quotes it, ready for ALTER ... OWNER.
SELECT o.kind, o.target FROM (
  SELECT 'SCHEMA' AS kind, quote_ident(n.nspname) AS target
  FROM pg_namespace AS n
  WHERE n.nspname = 'jobsd' AND n.nspowner <> %(owner)s::regrole
  UNION ALL
  SELECT CASE c.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW'
                        WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE 'TABLE' END,
         c.oid::regclass::text
  FROM pg_class AS c
  WHERE c.relnamespace = 'jobsd'::regnamespace
    AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
    AND c.relowner <> %(owner)s::regrole
    AND (c.relispartition
         OR NOT EXISTS (SELECT 1 FROM pg_depend AS d
                        WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                          AND d.deptype IN ('a', 'i') AND d.refobjid <> c.oid))
  UNION ALL
  SELECT 'ROUTINE', p.oid::regprocedure::text
  FROM pg_proc AS p
  WHERE p.pronamespace = 'jobsd'::regnamespace AND p.prokind IN ('f', 'p')
    AND p.proowner <> %(owner)s::regrole
) AS o
ORDER BY o.kind = 'SCHEMA' DESC, o.kind, o.target;

-- name: roles_grant_tables
-- Start from nothing on every table and sequence, then grant exactly what each
-- role needs: re-running converges on this list, whatever was granted before.
REVOKE ALL ON ALL TABLES IN SCHEMA jobsd FROM {enqueue}, {worker}, {read}, {admin}, {api};
REVOKE ALL ON ALL SEQUENCES IN SCHEMA jobsd FROM {enqueue}, {worker}, {read}, {admin}, {api};
GRANT USAGE ON SCHEMA jobsd TO {enqueue}, {worker}, {read}, {admin}, {api};
-- read: every table, read-only; row-level security limits jobs and job_events to
-- the org set in jobsd.org_id
GRANT SELECT ON ALL TABLES IN SCHEMA jobsd TO {read};
-- enqueue (the application) and api (the HTTP API): insert jobs and read them back
-- (jobs_insert ... RETURNING, dedup re-reads, history), cancel them before they
-- start. The history triggers write job_events as their owner (migration 0012):
-- no INSERT on job_events, so a tenant cannot forge history. All of it limited
-- to the org in jobsd.org_id by row-level security.
GRANT SELECT ON jobsd.queues, jobsd.schema_migrations TO {enqueue}, {api};
GRANT SELECT, INSERT ON jobsd.jobs TO {enqueue}, {api};
GRANT UPDATE (status, reason, finished_at, dedup_key, cancel_requested_at)
  ON jobsd.jobs TO {enqueue}, {api};
-- api: an org settles its own recovery_required jobs (the dashboard, POST
-- /jobs/{id}/resolve)
GRANT UPDATE (report) ON jobsd.jobs TO {api};
GRANT SELECT ON jobsd.job_events TO {enqueue}, {api};
-- a new job takes the id of its creation in the history from the history's sequence
-- (the column's default, migration 0032), a claim and a finish the ids of the run's
-- start and end
GRANT USAGE ON SEQUENCE jobsd.job_events_id_seq TO {enqueue}, {api}, {worker};
-- depends_on: mark each dependency (the row lock orders the enqueue with the
-- dependency's own end), record the edges, fail at once a job whose dependency
-- failed already (its error says which)
GRANT UPDATE (has_dependents, error) ON jobsd.jobs TO {enqueue}, {api};
GRANT SELECT, INSERT ON jobsd.job_dependencies TO {enqueue}, {api};
-- admin: read the queues it administers (the functions do the writes)
GRANT SELECT ON jobsd.queues, jobsd.schema_migrations TO {admin};
-- worker: claim, heartbeat, finish, sweep (UPDATE ... RETURNING needs SELECT);
-- notes in job_events (a discarded result); schema_migrations for the start check.
-- Advisory locks and LISTEN need no grant.
GRANT SELECT ON jobsd.queues, jobsd.schema_migrations TO {worker};
GRANT SELECT, UPDATE ON jobsd.jobs TO {worker};
GRANT INSERT ON jobsd.job_events TO {worker};
-- each daemon registers itself, and sweepers delete the rows of dead workers
GRANT SELECT, INSERT, UPDATE, DELETE ON jobsd.workers TO {worker};
-- and records the rules of the types it handles (a retry reads their delivery)
GRANT SELECT, INSERT, UPDATE ON jobsd.job_types TO {worker};
-- a claim locks the running count of each concurrency key it may start (FOR UPDATE
-- needs UPDATE); the counts themselves are kept by SECURITY DEFINER triggers
GRANT SELECT, UPDATE ON jobsd.concurrency_keys TO {worker};
-- periodic jobs (migration 0013): the scheduler declares its schedules, takes each
-- tick and enqueues its job through the normal plan (INSERT on jobs), and forgets
-- ticks older than a week
GRANT INSERT ON jobsd.jobs TO {worker};
GRANT SELECT, INSERT, UPDATE ON jobsd.schedules TO {worker};
GRANT SELECT, INSERT, UPDATE, DELETE ON jobsd.schedule_ticks TO {worker};
-- a daemon claims the on_fail hook of a failed job by inserting its row
GRANT SELECT, INSERT ON jobsd.fail_hooks TO {worker};
-- the archive of ended jobs (migration 0027) is read like jobs and job_events, with
-- the same row-level security; the daemons move jobs into it and create its months
-- through SECURITY DEFINER functions (granted below)
DO $$
BEGIN
  IF to_regclass('jobsd.jobs_archive') IS NOT NULL THEN
    GRANT SELECT ON jobsd.jobs_archive, jobsd.all_jobs, jobsd.job_events_archive,
      jobsd.all_job_events TO {enqueue}, {api}, {worker};
  END IF;
END
$$;
-- the per-type figures (migration 0029) are read like jobs, with the same row-level
-- security (every org's sums only by the roles that see every org); only the move
-- into the archive (SECURITY DEFINER) writes them
DO $$
BEGIN
  IF to_regclass('jobsd.type_stats') IS NOT NULL THEN
    GRANT SELECT ON jobsd.type_stats, jobsd.type_stats_all_orgs
      TO {enqueue}, {api}, {worker};
  END IF;
END
$$;

-- name: roles_grant_functions
-- Start from nothing on every function, then grant what each role needs; EXECUTE
-- that PUBLIC holds (jobsd.uuidv7(), the /metrics and /health counts by queue,
-- jobsd.current_org()) is left as it is. Queue administration (migrations 0009
-- and 0012, SECURITY DEFINER: it runs as the owner and counts every org's jobs)
-- is the admin role's; the API's role is a member of it, for operator tokens
-- (admin tokens of no org). Dropping a queue is the owner's only. The enqueue
-- role administers nothing. The read role may list queues.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA jobsd FROM {enqueue}, {worker}, {read}, {admin}, {api};
GRANT EXECUTE ON FUNCTION jobsd.queue_info(text),
  jobsd.queue_create(text, integer, integer, integer),
  jobsd.queue_set_limits(text, boolean, integer, boolean, integer, boolean, integer),
  jobsd.queue_set_org_limits(text, boolean, integer, boolean, integer),
  jobsd.queue_pause(text), jobsd.queue_resume(text)
  TO {admin};
GRANT {admin} TO {api};
-- retry a failed or cancelled job (POST /jobs/{id}/retry; SECURITY DEFINER, org-scoped
-- inside): as a new job since migration 0025, in place on an older schema
DO $$
BEGIN
  IF to_regprocedure('jobsd.job_retry(uuid, uuid, text, boolean, text)') IS NOT NULL THEN
    GRANT EXECUTE ON FUNCTION jobsd.job_retry(uuid, uuid, text, boolean, text)
      TO {enqueue}, {api};
  ELSE
    GRANT EXECUTE ON FUNCTION jobsd.job_retry(uuid, text, boolean, text) TO {enqueue}, {api};
  END IF;
END
$$;
-- the bulk actions (migration 0031; SECURITY DEFINER, org-scoped inside): who may
-- retry, cancel or resolve one job may do it to every job of a filter
DO $$
BEGIN
  IF to_regprocedure('jobsd.bulk_retry(text, text, jsonb, integer, boolean, boolean)')
     IS NOT NULL THEN
    GRANT EXECUTE ON FUNCTION
      jobsd.bulk_retry(text, text, jsonb, integer, boolean, boolean),
      jobsd.bulk_cancel(text, text, jsonb, integer, text, boolean),
      jobsd.bulk_resolve(text, text, jsonb, integer, text, text, text, boolean)
      TO {enqueue}, {api};
  END IF;
END
$$;
GRANT EXECUTE ON FUNCTION jobsd.queue_info(text) TO {read};
-- the schedules with their last tick's job, every org's (GET /schedules, /metrics)
GRANT EXECUTE ON FUNCTION jobsd.schedule_info(text) TO {admin}, {read};
-- every org's queued jobs of types no live daemon handles, by queue and type (/health,
-- `jobsd queue list`); PUBLIC's EXECUTE went in migration 0019: no tenant role runs it
GRANT EXECUTE ON FUNCTION jobsd.unhandled_jobs() TO {admin}, {read}, {api};
-- the archive (migration 0027): the daemons move ended jobs and create the months
-- ahead; an enqueue that gives an id asks whether an archived job holds it
DO $$
BEGIN
  IF to_regclass('jobsd.jobs_archive') IS NOT NULL THEN
    GRANT EXECUTE ON FUNCTION jobsd.archive_move(integer, double precision),
      jobsd.archive_ensure(timestamptz, timestamptz) TO {worker};
    GRANT EXECUTE ON FUNCTION jobsd.archived_job_org(uuid) TO {enqueue}, {api}, {worker};
  END IF;
END
$$;

-- name: roles_grant_api_tokens
-- The HTTP API looks bearer tokens up by hash, through a function (migration 0012:
-- api_tokens has row-level security); the enqueue role keeps it for applications
-- that embed the API router, and the read role for a read-only API.
GRANT EXECUTE ON FUNCTION jobsd.api_token_lookup(bytea) TO {api}, {enqueue}, {read};
-- and hashes the ids of the jobs it waits for, as the done-notifications do
GRANT EXECUTE ON FUNCTION jobsd.done_notify_key() TO {api}, {enqueue}, {read};

-- The dashboard's sessions (migration 0026): log in, check the session at every
-- request, log out, through SECURITY DEFINER functions (jobsd.ui_sessions has
-- row-level security and no policy: no role reads or writes it directly), for the
-- same roles as the token lookup, since any of them may serve the dashboard. A
-- schema older than 0026 has no sessions: nothing to grant there.
DO $$
BEGIN
  IF to_regprocedure('jobsd.ui_session_start(bytea, double precision)') IS NOT NULL THEN
    GRANT EXECUTE ON FUNCTION jobsd.ui_session_start(bytea, double precision),
      jobsd.ui_session_lookup(uuid, bytea), jobsd.ui_session_end(uuid, bytea)
      TO {api}, {enqueue}, {read};
  END IF;
END
$$;

-- name: roles_trusted
-- The multi-tenant roles act for the org they set in jobsd.org_id (migration 0012's
-- jobsd.role_orgs, org null); any other role under row-level security sees its
-- pinned org, or nothing.
INSERT INTO jobsd.role_orgs (role_name, org_id)
SELECT r.name, NULL FROM unnest(%(names)s::text[]) AS r(name)
ON CONFLICT (role_name) DO UPDATE SET org_id = NULL
WHERE jobsd.role_orgs.org_id IS NOT NULL;

-- name: roles_tenant_pin
-- A tenant's own role: pinned to one org, whatever it sets.
INSERT INTO jobsd.role_orgs (role_name, org_id) VALUES (%(role)s, %(org_id)s)
ON CONFLICT (role_name) DO UPDATE SET org_id = excluded.org_id
WHERE jobsd.role_orgs.org_id IS DISTINCT FROM excluded.org_id;

-- name: roles_tenant_grants
-- What a tenant's role may do: read its org's jobs, history, dependencies and the
-- queues (a reporting account); row-level security does the rest. No membership
-- in a trusted role (SET ROLE would not help it anyway: the session user stays
-- pinned).
GRANT CONNECT ON DATABASE {database} TO {role};
GRANT USAGE ON SCHEMA jobsd TO {role};
GRANT SELECT ON jobsd.jobs, jobsd.job_events, jobsd.job_dependencies, jobsd.queues
  TO {role};
DO $$
BEGIN
  IF to_regclass('jobsd.jobs_archive') IS NOT NULL THEN
    GRANT SELECT ON jobsd.jobs_archive, jobsd.all_jobs, jobsd.job_events_archive,
      jobsd.all_job_events TO {role};
  END IF;
  IF to_regclass('jobsd.type_stats') IS NOT NULL THEN
    GRANT SELECT ON jobsd.type_stats TO {role};
  END IF;
END
$$;

-- name: roles_default_privileges
-- Tables that later migrations create (as the owner role) are readable by the
-- read role at once; the other roles get theirs from the next `jobsd roles create`.
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA jobsd GRANT SELECT ON TABLES TO {read};

-- name: roles_policies
-- The worker sees and updates every org's jobs: a permissive policy adds to the
-- org policy of migration 0003 (policies are OR-ed). Superusers and the owner of
-- the tables are not subject to row-level security at all.
DROP POLICY IF EXISTS {policy} ON jobsd.jobs;
CREATE POLICY {policy} ON jobsd.jobs AS PERMISSIVE FOR ALL TO {worker}
  USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS {policy} ON jobsd.job_events;
CREATE POLICY {policy} ON jobsd.job_events AS PERMISSIVE FOR ALL TO {worker}
  USING (true) WITH CHECK (true);
DO $$
BEGIN
  IF to_regclass('jobsd.jobs_archive') IS NOT NULL THEN
    DROP POLICY IF EXISTS {policy} ON jobsd.jobs_archive;
    CREATE POLICY {policy} ON jobsd.jobs_archive AS PERMISSIVE FOR ALL TO {worker}
      USING (true) WITH CHECK (true);
    DROP POLICY IF EXISTS {policy} ON jobsd.job_events_archive;
    CREATE POLICY {policy} ON jobsd.job_events_archive AS PERMISSIVE FOR ALL TO {worker}
      USING (true) WITH CHECK (true);
  END IF;
END
$$;
DROP POLICY IF EXISTS {policy} ON jobsd.concurrency_keys;
CREATE POLICY {policy} ON jobsd.concurrency_keys AS PERMISSIVE FOR ALL TO {worker}
  USING (true) WITH CHECK (true);
DO $$
BEGIN
  IF to_regclass('jobsd.type_stats') IS NOT NULL THEN
    DROP POLICY IF EXISTS {policy} ON jobsd.type_stats;
    CREATE POLICY {policy} ON jobsd.type_stats AS PERMISSIVE FOR ALL TO {worker}
      USING (true) WITH CHECK (true);
    DROP POLICY IF EXISTS {policy} ON jobsd.type_stats_all_orgs;
    CREATE POLICY {policy} ON jobsd.type_stats_all_orgs AS PERMISSIVE FOR ALL TO {worker}
      USING (true) WITH CHECK (true);
  END IF;
END
$$;

-- name: roles_sees_all_orgs
-- Whether the current user sees every org's jobs: row-level security does not
-- apply to it (superuser, owner, BYPASSRLS), or a permissive policy with a true
-- condition applies to it for reads and for updates.
SELECT NOT row_security_active('jobsd.jobs')
       OR (SELECT bool_or(p.polcmd IN ('*', 'r')) AND bool_or(p.polcmd IN ('*', 'w'))
           FROM pg_policy AS p
           WHERE p.polrelid = 'jobsd.jobs'::regclass AND p.polpermissive
             AND pg_get_expr(p.polqual, p.polrelid) = 'true'
             AND EXISTS (SELECT 1 FROM unnest(p.polroles) AS r(oid)
                         WHERE r.oid = 0 OR pg_has_role(r.oid, 'USAGE'))) IS TRUE
       AS sees_all;

-- name: roles_drop_owned
-- Before DROP ROLE: hand what the role owns to the current user, then drop its
-- grants, default privileges and policies in this database.
REASSIGN OWNED BY {role} TO CURRENT_USER;
DROP OWNED BY {role};

-- name: roles_forget
-- The roles' rows of jobsd.role_orgs, before they are dropped.
DELETE FROM jobsd.role_orgs WHERE role_name = ANY(%(names)s::text[]);

-- name: roles_drop
DROP ROLE IF EXISTS {role};
