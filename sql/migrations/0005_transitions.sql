-- jobsd schema, version 5: the state machine, enforced by the database.
--
-- Every status change of jobsd.jobs must be an edge of the machine drawn in
-- docs/states.md; any other raises (SQLSTATE 23514, check_violation), whatever
-- code path tried it. Terminal states (succeeded, failed, cancelled) never change
-- again. A new job starts in queued, scheduled or blocked.
--
-- Never edit this file once shipped: add a new numbered migration instead.

CREATE FUNCTION jobsd.transition_allowed(from_status text, to_status text) RETURNS boolean
  LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT CASE from_status
    WHEN 'queued'            THEN to_status IN ('running', 'cancelled')
    WHEN 'scheduled'         THEN to_status IN ('queued', 'cancelled')
    WHEN 'blocked'           THEN to_status IN ('queued', 'failed', 'cancelled')
    WHEN 'running'           THEN to_status IN ('succeeded', 'failed', 'cancelled', 'queued',
                                                'scheduled', 'recovery_required')
    WHEN 'recovery_required' THEN to_status IN ('succeeded', 'failed', 'queued', 'cancelled')
    ELSE false  -- succeeded, failed, cancelled: terminal
  END
$$;

CREATE FUNCTION jobsd.check_transition() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    IF NEW.status NOT IN ('queued', 'scheduled', 'blocked') THEN
      RAISE EXCEPTION 'illegal transition of job %: a job starts queued, scheduled or blocked, not %',
        NEW.id, NEW.status
        USING ERRCODE = 'check_violation';
    END IF;
  ELSIF NOT jobsd.transition_allowed(OLD.status, NEW.status) THEN
    RAISE EXCEPTION 'illegal transition of job %: % -> %', NEW.id, OLD.status, NEW.status
      USING ERRCODE = 'check_violation';
  END IF;
  RETURN NEW;
END
$$;

CREATE TRIGGER jobs_check_transition BEFORE UPDATE OF status ON jobsd.jobs
  FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
  EXECUTE FUNCTION jobsd.check_transition();

-- Inserts are checked too; the WHEN clause keeps the bulk enqueue path free of a
-- function call per row.
CREATE TRIGGER jobs_check_insert BEFORE INSERT ON jobsd.jobs
  FOR EACH ROW WHEN (NEW.status NOT IN ('queued', 'scheduled', 'blocked'))
  EXECUTE FUNCTION jobsd.check_transition();
