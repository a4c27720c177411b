-- jobsd schema, version 31: bulk actions, each job of a filter retried, cancelled or
-- resolved in one call.
--
-- * jobsd.bulk_retry(), jobsd.bulk_cancel(), jobsd.bulk_resolve(): one call acts on
--   the jobs a filter matches (the jobs list's filter: org, status, type, queue,
--   created since / until), oldest first, at most p_limit (1..10000) of them, in one
--   transaction. A repeated call continues where the last one stopped, because what
--   was done no longer matches: a retried job has its retry (a job whose retry_of
--   names it, in the hot table or the archive), a cancelled job is no longer open (a
--   running one whose cancel is requested already is not taken again), a resolved
--   job is no longer recovery_required.
-- * A retry is jobsd.job_retry() for each job, each in its own subtransaction: a job
--   the admission refuses (JQ001 queue full, JQ003 org quota) is counted as refused
--   and the others go on. Once a queue (or an org's quota in a queue) refused one,
--   the rest of its jobs in the call are refused for the same reason without being
--   tried again. job_retry's own refusals (at_most_once without p_force, a dependency
--   not succeeded) are refusals too; a refused job still matches.
-- * A cancel and a resolve are one statement each: the jobs are locked FOR UPDATE
--   SKIP LOCKED; a job another transaction holds at that moment is counted as refused
--   ("busy") and still matches.
-- * The history of each job names the caller's actor followed by "(bulk <id>)", the id
--   of the call's row in jobsd.bulk_actions: one row per call that changes (or may
--   change) something, with its actor, the caller's org (null: an operator), the
--   action, the filter and options, and how many jobs matched, were done and were
--   refused by reason. A dry run (p_dry_run) counts and writes nothing.
-- * The org is p_scope (the caller's org), else the caller's jobsd.org_id (the API
--   sets it), else the filter's org_id, else every org. A filter naming another org
--   than the scope matches nothing. SECURITY DEFINER, as job_retry: the org check is
--   here. An unknown queue in the filter returns queue_found false, and nothing else.
-- * jobsd.bulk_actions has row-level security: an org's role reads its own org's
--   rows (jobsd.current_org()), the owner reads every row; only the functions write.
--   The roles that may run jobsd.job_retry may run the three functions.
--
-- Never edit this file once shipped: add a new numbered migration instead.

CREATE TABLE jobsd.bulk_actions (
  id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  at       timestamptz NOT NULL DEFAULT now(),
  actor    text NOT NULL,
  org_id   text,
  action   text NOT NULL CHECK (action IN ('retry', 'cancel', 'resolve')),
  filter   jsonb NOT NULL,
  matched  integer NOT NULL DEFAULT 0,
  done     integer NOT NULL DEFAULT 0,
  refused  jsonb NOT NULL DEFAULT '{}'
);

CREATE INDEX bulk_actions_at_idx ON jobsd.bulk_actions (at);

ALTER TABLE jobsd.bulk_actions ENABLE ROW LEVEL SECURITY;
CREATE POLICY bulk_actions_org_isolation ON jobsd.bulk_actions AS PERMISSIVE FOR SELECT
  TO PUBLIC USING (org_id = (SELECT jobsd.current_org()));

-- The checks every bulk action shares: p_limit in 1..10000, until after since; then
-- the org the call is limited to (see above), whether the filter can match anything
-- at all (not when it names another org than the caller's), and whether the filter's
-- queue exists (true without one).
CREATE FUNCTION jobsd.bulk_scope(p_scope text, p_filter jsonb, p_limit integer,
                                 OUT org_id text, OUT can_match boolean,
                                 OUT queue_found boolean)
RETURNS record
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
DECLARE
  v_scope text := coalesce(p_scope, nullif(current_setting('jobsd.org_id', true), ''));
  v_wanted text := p_filter ->> 'org_id';
BEGIN
  IF p_limit IS NULL OR p_limit < 1 OR p_limit > 10000 THEN
    RAISE EXCEPTION 'limit must be between 1 and 10000, not %', p_limit
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF (p_filter ->> 'since')::timestamptz >= (p_filter ->> 'until')::timestamptz THEN
    RAISE EXCEPTION 'until must be after since'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  org_id := coalesce(v_scope, v_wanted);
  can_match := v_scope IS NULL OR v_wanted IS NULL OR v_wanted = v_scope;
  queue_found := p_filter ->> 'queue' IS NULL
    OR EXISTS (SELECT 1 FROM jobsd.queues AS q WHERE q.name = p_filter ->> 'queue');
END
$$;

-- Insert the retries of a batch of locked jobs (p_old; p_new their new ids, in the
-- same order) and their notes, as jobsd.job_retry() does for one: the set form of
-- its insert (keep them alike). One statement inserts the new jobs, so the admission
-- (capacity, org quota) runs once for the batch, and refuses all of it or none.
CREATE FUNCTION jobsd.bulk_retry_batch(p_old uuid[], p_new uuid[], p_actor text,
                                       p_force boolean)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
DECLARE
  v_made integer;
BEGIN
  PERFORM set_config('jobsd.actor', coalesce(p_actor, ''), true);
  INSERT INTO jobsd.jobs (id, org_id, type, queue, status, payload, priority,
                          concurrency_key, trace_context, reason, retry_of)
  SELECT b.new_id, c.org_id, c.type, c.queue, 'queued', c.payload, c.priority,
         c.concurrency_key, c.trace_context,
         CASE WHEN coalesce(p_force, false) THEN 'retry (forced) of ' ELSE 'retry of ' END
           || c.id::text,
         c.id
  FROM unnest(p_old, p_new) WITH ORDINALITY AS b(old_id, new_id, ord)
  JOIN jobsd.all_jobs AS c ON c.id = b.old_id
  ORDER BY b.ord;
  GET DIAGNOSTICS v_made = ROW_COUNT;
  INSERT INTO jobsd.job_events (job_id, org_id, from_status, to_status, attempt, worker_id,
                                reason)
  SELECT c.id, c.org_id, c.status, c.status, c.attempts, nullif(p_actor, ''),
         'retried as ' || b.new_id::text
  FROM unnest(p_old, p_new) WITH ORDINALITY AS b(old_id, new_id, ord)
  JOIN jobsd.jobs AS c ON c.id = b.old_id
  ORDER BY b.ord;
  INSERT INTO jobsd.job_events_archive (id, job_id, org_id, from_status, to_status, attempt,
                                        worker_id, reason, at, job_finished_at)
  SELECT nextval('jobsd.job_events_id_seq'), c.id, c.org_id, c.status, c.status, c.attempts,
         nullif(p_actor, ''), 'retried as ' || b.new_id::text, clock_timestamp(),
         c.finished_at
  FROM unnest(p_old, p_new) WITH ORDINALITY AS b(old_id, new_id, ord)
  JOIN jobsd.jobs_archive AS c ON c.id = b.old_id
  ORDER BY b.ord;
  PERFORM set_config('jobsd.actor', '', true);
  RETURN v_made;
END
$$;

-- Retry the failed (or cancelled: p_filter's status) jobs of the filter that have no
-- retry yet, oldest first, at most p_limit, as job_retry does for one: the jobs are
-- locked (in id order), checked again (still of the status, still without a retry:
-- else "changed"; at_most_once without p_force; a dependency not succeeded), and the
-- rest retried in batches (bulk_retry_batch). A batch the admission refuses is split
-- in halves, first half first, down to the one job refused: that job's queue (JQ001)
-- or its org in that queue (JQ003) then refuses the rest of its jobs in this call
-- without another try. So a refusal costs a few statements, not one per job.
CREATE FUNCTION jobsd.bulk_retry(p_actor text, p_scope text, p_filter jsonb, p_limit integer,
                                 p_force boolean, p_dry_run boolean)
RETURNS TABLE (bulk_id bigint, matched integer, done integer, requested integer,
               refused jsonb, remaining bigint, queue_found boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  v_scope record;
  v_status text := coalesce(p_filter ->> 'status', 'failed');
  v_type text := p_filter ->> 'type';
  v_queue text := p_filter ->> 'queue';
  v_since timestamptz := (p_filter ->> 'since')::timestamptz;
  v_until timestamptz := (p_filter ->> 'until')::timestamptz;
  v_total bigint := 0;
  v_matched integer := 0;
  v_done integer := 0;
  v_refused jsonb := '{}';
  v_id bigint;
  v_actor text;
  v_ids uuid[];
  v_job record;
  -- the jobs to retry, oldest first: id, new id, queue, org
  v_old uuid[] := '{}';
  v_new uuid[] := '{}';
  v_queues text[] := '{}';
  v_orgs text[] := '{}';
  -- ranges [lo, hi] of those still to try, the next one last
  v_los integer[] := '{}';
  v_his integer[] := '{}';
  v_lo integer;
  v_hi integer;
  v_mid integer;
  v_try integer[];
  v_closed text[] := '{}';  -- 'q:<queue>' (full) and 'o:<queue> <org>' (quota reached)
  v_gone boolean[] := '{}';  -- refused already (by what a refusal closed)
  v_why text;
  i integer;
BEGIN
  IF v_status NOT IN ('failed', 'cancelled') THEN
    RAISE EXCEPTION 'a retry takes failed or cancelled jobs, not %', v_status
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  v_scope := jobsd.bulk_scope(p_scope, p_filter, p_limit);
  IF NOT v_scope.queue_found THEN
    RETURN QUERY SELECT NULL::bigint, 0, 0, 0, '{}'::jsonb, 0::bigint, false;
    RETURN;
  END IF;
  IF v_scope.can_match THEN
    SELECT count(*) INTO v_total FROM jobsd.all_jobs AS j
    WHERE j.status = v_status
      AND (v_scope.org_id IS NULL OR j.org_id = v_scope.org_id)
      AND (v_type IS NULL OR j.type = v_type)
      AND (v_queue IS NULL OR j.queue = v_queue)
      AND (v_since IS NULL OR j.created_at >= v_since)
      AND (v_until IS NULL OR j.created_at < v_until)
      AND NOT EXISTS (SELECT 1 FROM jobsd.all_jobs AS r WHERE r.retry_of = j.id);
  END IF;
  v_matched := least(v_total, p_limit);
  IF p_dry_run THEN
    RETURN QUERY SELECT NULL::bigint, v_matched, 0, 0, '{}'::jsonb, v_total, true;
    RETURN;
  END IF;
  INSERT INTO jobsd.bulk_actions AS b (actor, org_id, action, filter)
  VALUES (p_actor, v_scope.org_id, 'retry',
          p_filter || jsonb_build_object('limit', p_limit, 'force', coalesce(p_force, false)))
  RETURNING b.id INTO v_id;
  v_actor := p_actor || ' (bulk ' || v_id || ')';

  SELECT coalesce(array_agg(c.id ORDER BY c.created_at, c.id), '{}') INTO v_ids
  FROM (SELECT j.id, j.created_at FROM jobsd.all_jobs AS j
        WHERE v_matched > 0 AND j.status = v_status
          AND (v_scope.org_id IS NULL OR j.org_id = v_scope.org_id)
          AND (v_type IS NULL OR j.type = v_type)
          AND (v_queue IS NULL OR j.queue = v_queue)
          AND (v_since IS NULL OR j.created_at >= v_since)
          AND (v_until IS NULL OR j.created_at < v_until)
          AND NOT EXISTS (SELECT 1 FROM jobsd.all_jobs AS r WHERE r.retry_of = j.id)
        ORDER BY j.created_at, j.id
        LIMIT v_matched) AS c;
  -- concurrent retries of one job take turns (as in job_retry); id order: no deadlock
  PERFORM 1 FROM jobsd.jobs AS j WHERE j.id = ANY(v_ids) ORDER BY j.id FOR UPDATE;
  PERFORM 1 FROM jobsd.jobs_archive AS a WHERE a.id = ANY(v_ids) ORDER BY a.id FOR UPDATE;
  FOR v_job IN
    SELECT c.id, c.queue, c.org_id,
           CASE WHEN c.status <> v_status
                  OR EXISTS (SELECT 1 FROM jobsd.all_jobs AS r WHERE r.retry_of = c.id)
                  THEN 'changed'
                WHEN NOT coalesce(p_force, false) AND EXISTS (
                  SELECT 1 FROM jobsd.job_types AS t
                  WHERE t.type = c.type AND t.delivery = 'at_most_once')
                  THEN 'at_most_once'
                WHEN EXISTS (
                  SELECT 1 FROM jobsd.job_dependencies AS d
                  JOIN jobsd.all_jobs AS p ON p.id = d.depends_on
                  WHERE d.job_id = c.id AND p.status <> 'succeeded')
                  THEN 'dependency'
           END AS refusal
    FROM unnest(v_ids) WITH ORDINALITY AS w(id, ord)
    LEFT JOIN jobsd.all_jobs AS c ON c.id = w.id
    ORDER BY w.ord
  LOOP
    IF v_job.id IS NULL THEN  -- gone meanwhile (a prune)
      v_why := 'changed';
    ELSE
      v_why := v_job.refusal;
    END IF;
    IF v_why IS NOT NULL THEN
      v_refused := jsonb_set(v_refused, ARRAY[v_why],
                             to_jsonb(coalesce((v_refused ->> v_why)::integer, 0) + 1));
    ELSE
      v_old := v_old || v_job.id;
      v_new := v_new || jobsd.uuidv7();
      v_queues := v_queues || v_job.queue;
      v_orgs := v_orgs || v_job.org_id;
      v_gone := v_gone || false;
    END IF;
  END LOOP;

  IF cardinality(v_old) > 0 THEN
    v_los := ARRAY[1];
    v_his := ARRAY[cardinality(v_old)];
  END IF;
  WHILE cardinality(v_los) > 0 LOOP
    v_lo := v_los[cardinality(v_los)];
    v_hi := v_his[cardinality(v_his)];
    v_los := v_los[1:cardinality(v_los) - 1];
    v_his := v_his[1:cardinality(v_his) - 1];
    -- what a refusal closed is refused without a try
    v_try := '{}';
    FOR i IN v_lo .. v_hi LOOP
      CONTINUE WHEN v_gone[i];
      IF ('q:' || v_queues[i]) = ANY(v_closed) THEN
        v_why := 'queue_full';
      ELSIF ('o:' || v_queues[i] || ' ' || v_orgs[i]) = ANY(v_closed) THEN
        v_why := 'org_quota';
      ELSE
        v_try := v_try || i;
        CONTINUE;
      END IF;
      v_gone[i] := true;
      v_refused := jsonb_set(v_refused, ARRAY[v_why],
                             to_jsonb(coalesce((v_refused ->> v_why)::integer, 0) + 1));
    END LOOP;
    CONTINUE WHEN cardinality(v_try) = 0;
    BEGIN
      v_done := v_done + jobsd.bulk_retry_batch(
        ARRAY(SELECT v_old[k] FROM unnest(v_try) AS k ORDER BY k),
        ARRAY(SELECT v_new[k] FROM unnest(v_try) AS k ORDER BY k),
        v_actor, p_force);
    EXCEPTION
      WHEN SQLSTATE 'JQ001' OR SQLSTATE 'JQ003' THEN
        IF cardinality(v_try) = 1 THEN
          i := v_try[1];
          IF SQLSTATE = 'JQ001' THEN
            v_closed := v_closed || ('q:' || v_queues[i]);
            v_why := 'queue_full';
          ELSE
            v_closed := v_closed || ('o:' || v_queues[i] || ' ' || v_orgs[i]);
            v_why := 'org_quota';
          END IF;
          v_refused := jsonb_set(v_refused, ARRAY[v_why],
                                 to_jsonb(coalesce((v_refused ->> v_why)::integer, 0) + 1));
        ELSE
          -- the second half waits under the first
          v_mid := (cardinality(v_try) + 1) / 2;
          v_los := v_los || v_try[v_mid + 1] || v_try[1];
          v_his := v_his || v_try[cardinality(v_try)] || v_try[v_mid];
        END IF;
    END;
  END LOOP;

  UPDATE jobsd.bulk_actions AS b
  SET matched = v_matched, done = v_done, refused = v_refused
  WHERE b.id = v_id;
  RETURN QUERY SELECT v_id, v_matched, v_done, 0, v_refused, v_total - v_done, true;
END
$$;

-- Cancel the open jobs of the filter (queued, scheduled, blocked, running; or the
-- filter's status), oldest first, at most p_limit, as jobs_cancel does: at once, or a
-- cancel request for a running job (not taken again while one is pending). p_reason is
-- the cancelled jobs' reason.
CREATE FUNCTION jobsd.bulk_cancel(p_actor text, p_scope text, p_filter jsonb, p_limit integer,
                                  p_reason text, p_dry_run boolean)
RETURNS TABLE (bulk_id bigint, matched integer, done integer, requested integer,
               refused jsonb, remaining bigint, queue_found boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  v_scope record;
  v_statuses text[] := CASE WHEN p_filter ->> 'status' IS NULL
                            THEN ARRAY['queued', 'scheduled', 'blocked', 'running']
                            ELSE ARRAY[p_filter ->> 'status'] END;
  v_type text := p_filter ->> 'type';
  v_queue text := p_filter ->> 'queue';
  v_since timestamptz := (p_filter ->> 'since')::timestamptz;
  v_until timestamptz := (p_filter ->> 'until')::timestamptz;
  v_total bigint := 0;
  v_matched integer := 0;
  v_done integer := 0;
  v_requested integer := 0;
  v_refused jsonb := '{}';
  v_id bigint;
BEGIN
  IF NOT v_statuses <@ ARRAY['queued', 'scheduled', 'blocked', 'running'] THEN
    RAISE EXCEPTION 'a cancel takes queued, scheduled, blocked or running jobs, not %',
      p_filter ->> 'status'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  v_scope := jobsd.bulk_scope(p_scope, p_filter, p_limit);
  IF NOT v_scope.queue_found THEN
    RETURN QUERY SELECT NULL::bigint, 0, 0, 0, '{}'::jsonb, 0::bigint, false;
    RETURN;
  END IF;
  IF v_scope.can_match THEN
    SELECT count(*) INTO v_total FROM jobsd.jobs AS j
    WHERE j.status = ANY(v_statuses)
      AND NOT (j.status = 'running' AND j.cancel_requested_at IS NOT NULL)
      AND (v_scope.org_id IS NULL OR j.org_id = v_scope.org_id)
      AND (v_type IS NULL OR j.type = v_type)
      AND (v_queue IS NULL OR j.queue = v_queue)
      AND (v_since IS NULL OR j.created_at >= v_since)
      AND (v_until IS NULL OR j.created_at < v_until);
  END IF;
  v_matched := least(v_total, p_limit);
  IF p_dry_run THEN
    RETURN QUERY SELECT NULL::bigint, v_matched, 0, 0, '{}'::jsonb, v_total, true;
    RETURN;
  END IF;
  INSERT INTO jobsd.bulk_actions AS b (actor, org_id, action, filter)
  VALUES (p_actor, v_scope.org_id, 'cancel', p_filter || jsonb_build_object('limit', p_limit))
  RETURNING b.id INTO v_id;
  PERFORM set_config('jobsd.actor', p_actor || ' (bulk ' || v_id || ')', true);
  WITH picked AS (
    SELECT j.id, j.status FROM jobsd.jobs AS j
    WHERE v_matched > 0 AND j.status = ANY(v_statuses)
      AND NOT (j.status = 'running' AND j.cancel_requested_at IS NOT NULL)
      AND (v_scope.org_id IS NULL OR j.org_id = v_scope.org_id)
      AND (v_type IS NULL OR j.type = v_type)
      AND (v_queue IS NULL OR j.queue = v_queue)
      AND (v_since IS NULL OR j.created_at >= v_since)
      AND (v_until IS NULL OR j.created_at < v_until)
    ORDER BY j.created_at, j.id
    LIMIT v_matched
    FOR UPDATE OF j SKIP LOCKED),
  changed AS (
    UPDATE jobsd.jobs AS j
    SET status = CASE WHEN p.status = 'running' THEN j.status ELSE 'cancelled' END,
        reason = CASE WHEN p.status = 'running' THEN j.reason ELSE p_reason END,
        finished_at = CASE WHEN p.status = 'running' THEN j.finished_at ELSE now() END,
        dedup_key = CASE WHEN p.status = 'running' THEN j.dedup_key END,
        cancel_requested_at = coalesce(j.cancel_requested_at, now())
    FROM picked AS p
    WHERE j.id = p.id
    RETURNING p.status AS previous)
  SELECT count(*), count(*) FILTER (WHERE c.previous = 'running')
  INTO v_done, v_requested
  FROM changed AS c;
  PERFORM set_config('jobsd.actor', '', true);
  IF v_done < v_matched THEN
    v_refused := jsonb_build_object('busy', v_matched - v_done);
  END IF;
  UPDATE jobsd.bulk_actions AS b
  SET matched = v_matched, done = v_done, refused = v_refused
  WHERE b.id = v_id;
  RETURN QUERY SELECT v_id, v_matched, v_done, v_requested, v_refused, v_total - v_done, true;
END
$$;

-- Settle the recovery_required jobs of the filter as p_status (succeeded, failed or
-- queued), oldest first, at most p_limit, as jobs_resolve does; p_reason is their
-- reason, p_error the error of those settled as failed.
CREATE FUNCTION jobsd.bulk_resolve(p_actor text, p_scope text, p_filter jsonb,
                                   p_limit integer, p_status text, p_reason text,
                                   p_error text, p_dry_run boolean)
RETURNS TABLE (bulk_id bigint, matched integer, done integer, requested integer,
               refused jsonb, remaining bigint, queue_found boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  v_scope record;
  v_type text := p_filter ->> 'type';
  v_queue text := p_filter ->> 'queue';
  v_since timestamptz := (p_filter ->> 'since')::timestamptz;
  v_until timestamptz := (p_filter ->> 'until')::timestamptz;
  v_total bigint := 0;
  v_matched integer := 0;
  v_done integer := 0;
  v_refused jsonb := '{}';
  v_id bigint;
BEGIN
  IF coalesce(p_filter ->> 'status', 'recovery_required') <> 'recovery_required' THEN
    RAISE EXCEPTION 'a resolve takes recovery_required jobs, not %', p_filter ->> 'status'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF p_status IS NULL OR p_status NOT IN ('succeeded', 'failed', 'queued') THEN
    RAISE EXCEPTION 'a resolve settles jobs as succeeded, failed or queued, not %', p_status
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  v_scope := jobsd.bulk_scope(p_scope, p_filter, p_limit);
  IF NOT v_scope.queue_found THEN
    RETURN QUERY SELECT NULL::bigint, 0, 0, 0, '{}'::jsonb, 0::bigint, false;
    RETURN;
  END IF;
  IF v_scope.can_match THEN
    SELECT count(*) INTO v_total FROM jobsd.jobs AS j
    WHERE j.status = 'recovery_required'
      AND (v_scope.org_id IS NULL OR j.org_id = v_scope.org_id)
      AND (v_type IS NULL OR j.type = v_type)
      AND (v_queue IS NULL OR j.queue = v_queue)
      AND (v_since IS NULL OR j.created_at >= v_since)
      AND (v_until IS NULL OR j.created_at < v_until);
  END IF;
  v_matched := least(v_total, p_limit);
  IF p_dry_run THEN
    RETURN QUERY SELECT NULL::bigint, v_matched, 0, 0, '{}'::jsonb, v_total, true;
    RETURN;
  END IF;
  INSERT INTO jobsd.bulk_actions AS b (actor, org_id, action, filter)
  VALUES (p_actor, v_scope.org_id, 'resolve',
          p_filter || jsonb_build_object('limit', p_limit, 'outcome', p_status))
  RETURNING b.id INTO v_id;
  PERFORM set_config('jobsd.actor', p_actor || ' (bulk ' || v_id || ')', true);
  WITH picked AS (
    SELECT j.id FROM jobsd.jobs AS j
    WHERE v_matched > 0 AND j.status = 'recovery_required'
      AND (v_scope.org_id IS NULL OR j.org_id = v_scope.org_id)
      AND (v_type IS NULL OR j.type = v_type)
      AND (v_queue IS NULL OR j.queue = v_queue)
      AND (v_since IS NULL OR j.created_at >= v_since)
      AND (v_until IS NULL OR j.created_at < v_until)
    ORDER BY j.created_at, j.id
    LIMIT v_matched
    FOR UPDATE OF j SKIP LOCKED),
  changed AS (
    UPDATE jobsd.jobs AS j
    SET status = p_status, reason = p_reason,
        error = CASE p_status WHEN 'failed' THEN coalesce(p_error, j.error)
                              WHEN 'succeeded' THEN NULL ELSE j.error END,
        finished_at = CASE WHEN p_status IN ('succeeded', 'failed') THEN now() END,
        dedup_key = CASE WHEN p_status IN ('succeeded', 'failed') THEN NULL
                         ELSE j.dedup_key END
    FROM picked AS p
    WHERE j.id = p.id
    RETURNING j.id)
  SELECT count(*) INTO v_done FROM changed;
  PERFORM set_config('jobsd.actor', '', true);
  IF v_done < v_matched THEN
    v_refused := jsonb_build_object('busy', v_matched - v_done);
  END IF;
  UPDATE jobsd.bulk_actions AS b
  SET matched = v_matched, done = v_done, refused = v_refused
  WHERE b.id = v_id;
  RETURN QUERY SELECT v_id, v_matched, v_done, 0, v_refused, v_total - v_done, true;
END
$$;

REVOKE ALL ON FUNCTION jobsd.bulk_scope(text, jsonb, integer),
                       jobsd.bulk_retry_batch(uuid[], uuid[], text, boolean),
                       jobsd.bulk_retry(text, text, jsonb, integer, boolean, boolean),
                       jobsd.bulk_cancel(text, text, jsonb, integer, text, boolean),
                       jobsd.bulk_resolve(text, text, jsonb, integer, text, text, text, boolean)
  FROM PUBLIC;

-- The roles that may retry one job (jobsd roles create's enqueue and API roles) may
-- act on many, so an upgrade needs no `jobsd roles create`.
DO $$
DECLARE
  r record;
BEGIN
  FOR r IN
    SELECT a.rolname FROM pg_roles AS a
    WHERE has_function_privilege(a.oid, 'jobsd.job_retry(uuid, uuid, text, boolean, text)',
                                 'EXECUTE')
      AND NOT a.rolsuper AND a.oid <> (SELECT p.proowner FROM pg_proc AS p
                                       WHERE p.oid = 'jobsd.job_retry(uuid, uuid, text, boolean, text)'::regprocedure)
  LOOP
    EXECUTE format('GRANT EXECUTE ON FUNCTION '
                   'jobsd.bulk_retry(text, text, jsonb, integer, boolean, boolean), '
                   'jobsd.bulk_cancel(text, text, jsonb, integer, text, boolean), '
                   'jobsd.bulk_resolve(text, text, jsonb, integer, text, text, text, boolean) '
                   'TO %I', r.rolname);
  END LOOP;
END
$$;
