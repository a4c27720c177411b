-- jobsd schema, version 19: the count of unhandled jobs is the operators' (issue 13).
--
-- * jobsd.unhandled_jobs() (0014_client) counts every org's queued jobs by queue and
--   type, as its owner (SECURITY DEFINER), and was granted to PUBLIC: any role with
--   USAGE on schema jobsd, a tenant's own role included, read every org's job type
--   names and how many of each wait. EXECUTE is revoked from PUBLIC. `jobsd roles
--   create` grants it to the roles that use it: the admin role (and the API's role,
--   for /health) and the read role (`jobsd queue list`).
-- * So that an upgrade breaks neither before the next `jobsd roles create`, the
--   roles that may already list queues (EXECUTE on jobsd.queue_info(text): the admin
--   and read roles, and any an operator granted it to) get it here too.
--
-- Never edit this file once shipped: add a new numbered migration instead.

REVOKE ALL ON FUNCTION jobsd.unhandled_jobs() FROM PUBLIC;

DO $$
DECLARE
  grantee regrole;
BEGIN
  FOR grantee IN
    SELECT DISTINCT a.grantee::regrole
    FROM pg_catalog.pg_proc AS p, pg_catalog.aclexplode(p.proacl) AS a
    WHERE p.oid = 'jobsd.queue_info(text)'::regprocedure
      AND a.privilege_type = 'EXECUTE'
      AND a.grantee <> 0
      AND a.grantee <> p.proowner
  LOOP
    -- regrole's text is the role's name, quoted as an identifier when it must be
    EXECUTE format('GRANT EXECUTE ON FUNCTION jobsd.unhandled_jobs() TO %s', grantee);
  END LOOP;
END
$$;
