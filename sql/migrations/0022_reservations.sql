-- jobsd schema, version 22: a job held ahead of a daemon's free slots is reserved, not
-- running (docs/states.md, "Reserved jobs"; docs/decisions.md, "Claiming ahead").
--
-- `running` means a handler has started and its outcome is not written yet, and an
-- attempt is a handler start. A job a daemon claims ahead of its free slots stays
-- `queued`, with a reservation: the daemon's lease (lease_id, worker_id) and
-- reserved_until, the database time after which any daemon may claim it again. The
-- daemon starts it (queued -> running, attempts + 1, a fresh lease) in one statement
-- when a slot frees, conditioned on its reservation's lease. A reservation given back,
-- lost with its daemon, or never answered ends without a status change, a history row
-- or an attempt: the job is simply claimable again.
--
-- reserved_until is in no index: reserving or releasing a job is a HOT update. The
-- claim reads past the unexpired reservations at the head of its index.
--
-- Jobs marked claimed_ahead by version 21 are running in the database without a
-- handler: they go back to queued with their attempt refunded.
--
-- Never edit this file once shipped: add a new numbered migration instead.

ALTER TABLE jobsd.jobs ADD COLUMN reserved_until timestamptz;

UPDATE jobsd.jobs
SET status = 'queued', reason = 'not started', attempts = greatest(attempts - 1, 0),
    lease_id = NULL, started_at = NULL
WHERE claimed_ahead AND status = 'running';

ALTER TABLE jobsd.jobs DROP COLUMN claimed_ahead;
