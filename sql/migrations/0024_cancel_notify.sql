-- jobsd schema, version 24: a cancel request reaches the running handler at once.
--
-- A cancel of a running job records cancel_requested_at; the daemon that runs it used
-- to notice on its next heartbeat. Now the request also notifies the channel
-- jobsd_cancel with the job's id, which every daemon LISTENs to: the owner cancels
-- the handler when the request commits. The heartbeat still notices it, for a daemon
-- whose LISTEN connection was down when the notification went out.
--
-- The WHEN clause is evaluated without calling the function: only the first request
-- of a running job notifies.
--
-- Never edit this file once shipped: add a new numbered migration instead.

CREATE FUNCTION jobsd.notify_cancel() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('jobsd_cancel', NEW.id::text);
  RETURN NULL;
END
$$;

CREATE TRIGGER jobs_notify_cancel AFTER UPDATE OF cancel_requested_at ON jobsd.jobs
  FOR EACH ROW
  WHEN (OLD.cancel_requested_at IS NULL AND NEW.cancel_requested_at IS NOT NULL
        AND NEW.status = 'running')
  EXECUTE FUNCTION jobsd.notify_cancel();
