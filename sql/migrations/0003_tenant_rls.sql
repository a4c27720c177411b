-- jobsd schema, version 3: tenant isolation in depth, with row-level security.
--
-- The API and the application always filter by org_id; in addition, a role that
-- is subject to row-level security sees and writes only the rows of the org named
-- in the setting jobsd.org_id (set per transaction with
-- `SELECT set_config('jobsd.org_id', 'acme', true)`, or per session/role with
-- `SET jobsd.org_id = 'acme'` / `ALTER ROLE ... SET jobsd.org_id = 'acme'`).
-- No org set (or an empty one) means no rows at all: a forgotten setting fails
-- closed, it never shows every org.
--
-- Who is not subject to it: superusers, the owner of the tables (the migrating
-- role; RLS is enabled, not forced), roles with BYPASSRLS, and roles that a
-- permissive policy lets through. That last one is how the worker role sees
-- every org: `jobsd roles create` adds a policy `<prefix>_worker_all_orgs ... TO
-- <prefix>_worker USING (true)`, because roles do not exist when migrations run
-- and a migration must not depend on them. The policies below name no role: they
-- apply to PUBLIC, so a role jobsd does not know about fails closed too.
--
-- The history triggers run as the invoker; the rows they write carry the job's
-- org_id, so an enqueuer inserting a job of its own org passes the check on
-- job_events too, with no SECURITY DEFINER function.
--
-- Never edit this file once shipped: add a new numbered migration instead.

ALTER TABLE jobsd.jobs ENABLE ROW LEVEL SECURITY;
ALTER TABLE jobsd.job_events ENABLE ROW LEVEL SECURITY;

CREATE POLICY jobs_org_isolation ON jobsd.jobs AS PERMISSIVE FOR ALL TO PUBLIC
  USING (org_id = nullif(current_setting('jobsd.org_id', true), ''))
  WITH CHECK (org_id = nullif(current_setting('jobsd.org_id', true), ''));

CREATE POLICY job_events_org_isolation ON jobsd.job_events AS PERMISSIVE FOR ALL TO PUBLIC
  USING (org_id = nullif(current_setting('jobsd.org_id', true), ''))
  WITH CHECK (org_id = nullif(current_setting('jobsd.org_id', true), ''));
