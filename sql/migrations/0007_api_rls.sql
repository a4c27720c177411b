-- jobsd schema: the figures of /metrics and /health for every org, whatever the
-- API's role.
--
-- Under the enqueue or the read role, row-level security (migration 0003) hides
-- every job of an org other than the one in jobsd.org_id, and /metrics and /health
-- run with no org set: they would count nothing. These two functions count for
-- all orgs and return only aggregates (a count per queue and state, one age):
-- no id, no org, no payload leaves them.
--
-- SECURITY DEFINER: they run as their owner, the owner role once `jobsd roles
-- create` has adopted them (the owner of the tables, to which row-level security
-- does not apply). The search path is fixed, pg_temp last, and every name is
-- schema-qualified, so a caller cannot substitute a table or a function of its
-- own. EXECUTE is granted to PUBLIC (Postgres's default for functions, written
-- out here): any role with USAGE on schema jobsd may read these aggregates, as
-- anyone who can reach /metrics already does.
--
-- Never edit this file once shipped: add a new numbered migration instead.

CREATE FUNCTION jobsd.queue_depth()
RETURNS TABLE (queue text, status text, jobs bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
  -- Queued, scheduled and running jobs by declared queue and state, zeros
  -- included. Only the states with a partial index are counted: no table scan.
  SELECT q.name, s.status, coalesce(d.jobs, 0)::bigint
  FROM jobsd.queues AS q
  CROSS JOIN unnest(ARRAY['queued', 'scheduled', 'running']) AS s(status)
  LEFT JOIN (
    SELECT j.queue, j.status, count(*) AS jobs FROM jobsd.jobs AS j
    WHERE j.status IN ('queued', 'running') GROUP BY j.queue, j.status
    UNION ALL
    SELECT j.queue, j.status, count(*) FROM jobsd.jobs AS j
    WHERE j.status = 'scheduled' GROUP BY j.queue, j.status) AS d
    ON d.queue = q.name AND d.status = s.status
  ORDER BY q.name, s.status
$$;

CREATE FUNCTION jobsd.oldest_queued_age_s()
RETURNS float8
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
  -- Pickup lag: the longest wait among the next 1,000 jobs in claim order, in
  -- seconds; null when nothing is queued.
  SELECT extract(epoch FROM now() - min(greatest(w.created_at, w.run_after)))::float8
  FROM (SELECT j.created_at, j.run_after FROM jobsd.jobs AS j
        WHERE j.status = 'queued'
        ORDER BY j.created_at, j.id LIMIT 1000) AS w
$$;

REVOKE ALL ON FUNCTION jobsd.queue_depth(), jobsd.oldest_queued_age_s() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION jobsd.queue_depth(), jobsd.oldest_queued_age_s() TO PUBLIC;
