-- jobsd schema, version 6: cancel requests for running jobs.
--
-- A queued, scheduled or blocked job is cancelled at once. A running job cannot be:
-- its handler is somewhere else. `cancel_requested_at` records the request; the
-- owner's next heartbeat returns it, the daemon cancels the handler and writes the
-- job `cancelled` under its lease. A sweeper rescuing a job with a request pending
-- cancels it instead of running it again.
--
-- Never edit this file once shipped: add a new numbered migration instead.

ALTER TABLE jobsd.jobs ADD COLUMN cancel_requested_at timestamptz;
