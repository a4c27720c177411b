-- jobsd schema, version 30: what alerting rules read from /metrics, every org's.
--
-- * jobsd.queue_depth_v2(): jobsd.queue_depth() (migration 0007) with the
--   recovery_required jobs of each queue counted too, zeros included: the backlog
--   an operator (or a recover hook) must settle, worth an alert when it lasts. The
--   first function stays, for an API of the previous version.
-- * jobsd.queue_oldest_age(p_now): per declared queue, how long its oldest job that
--   is due and not started has been due (seconds; 0 when none), and whether the queue
--   is paused (its jobs then wait on purpose). Bounded like the pickup lag of /health:
--   among the queue's next 1,000 queued jobs in claim order (jobs_claim_v2_idx), so
--   a scrape never reads a whole backlog. A job is due from its run_after, or from its
--   creation when it was enqueued with a run_after already past. p_now null: now().
--
-- Both are SECURITY DEFINER like queue_depth(): the API's role may see one org only
-- (row-level security), and these return aggregates by queue, never an id, an org
-- or a payload. Search path fixed, pg_temp last, every name schema-qualified;
-- EXECUTE to PUBLIC, as for queue_depth(): whoever reaches /metrics reads them.
--
-- Never edit this file once shipped: add a new numbered migration instead.

CREATE FUNCTION jobsd.queue_depth_v2()
RETURNS TABLE (queue text, status text, jobs bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
  -- Each state through a partial index: queued and running jobs_active_idx,
  -- scheduled jobs_scheduled_idx, recovery_required jobs_open_by_queue_org_idx.
  SELECT q.name, s.status, coalesce(d.jobs, 0)::bigint
  FROM jobsd.queues AS q
  CROSS JOIN unnest(ARRAY['queued', 'scheduled', 'running', 'recovery_required'])
    AS s(status)
  LEFT JOIN (
    SELECT j.queue, j.status, count(*) AS jobs FROM jobsd.jobs AS j
    WHERE j.status IN ('queued', 'running') GROUP BY j.queue, j.status
    UNION ALL
    SELECT j.queue, j.status, count(*) FROM jobsd.jobs AS j
    WHERE j.status = 'scheduled' GROUP BY j.queue, j.status
    UNION ALL
    SELECT j.queue, j.status, count(*) FROM jobsd.jobs AS j
    WHERE j.status = 'recovery_required' GROUP BY j.queue, j.status) AS d
    ON d.queue = q.name AND d.status = s.status
  ORDER BY q.name, s.status
$$;

CREATE FUNCTION jobsd.queue_oldest_age(p_now timestamptz DEFAULT NULL)
RETURNS TABLE (queue text, paused boolean, age_s float8)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
  SELECT q.name, q.paused_at IS NOT NULL,
         coalesce(greatest(extract(epoch FROM coalesce(p_now, now()) - w.due_since), 0),
                  0)::float8
  FROM jobsd.queues AS q
  CROSS JOIN LATERAL (
    SELECT min(greatest(n.created_at, n.run_after)) AS due_since
    FROM (SELECT j.created_at, j.run_after FROM jobsd.jobs AS j
          WHERE j.status = 'queued' AND j.queue = q.name
          ORDER BY j.priority, j.created_at, j.id
          LIMIT 1000) AS n
    WHERE n.run_after <= coalesce(p_now, now())) AS w
  ORDER BY q.name
$$;

REVOKE ALL ON FUNCTION jobsd.queue_depth_v2(), jobsd.queue_oldest_age(timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION jobsd.queue_depth_v2(), jobsd.queue_oldest_age(timestamptz)
  TO PUBLIC;
