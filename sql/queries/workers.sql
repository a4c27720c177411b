-- Named queries on jobsd.workers: registration, liveness, death by lock.

-- name: workers_lock
-- Taken on the worker's dedicated connection before its row exists, held for the
-- life of that session: whoever can take it (once the worker's lease is over too)
-- knows the worker is gone. The session's pid comes back: if the daemon loses this
-- connection while the server keeps the session (a network cut it has not noticed),
-- its next connection ends that session by pid (workers_end_session).
SELECT pg_try_advisory_lock(jobsd.worker_lock_key(%(worker_id)s)) AS locked,
       pg_backend_pid() AS pid;

-- name: workers_end_session
-- End the daemon's own earlier lock session, still holding its lock after the daemon
-- lost the connection to it. Only that session: the pid it had, still a lifeline's.
SELECT count(pg_terminate_backend(a.pid)) AS ended
FROM pg_stat_activity AS a
WHERE a.pid = %(pid)s AND a.application_name = 'jobsd-lifeline'
  AND a.pid <> pg_backend_pid();

-- name: workers_register
-- The worker's row with the types it claims (NULL: every type), and the rules of
-- the types it has handlers for in jobsd.job_types (a retry reads the delivery).
WITH rules AS (
  INSERT INTO jobsd.job_types AS t (type, delivery, max_attempts)
  SELECT r.type, r.delivery, r.max_attempts
  FROM unnest(%(rule_types)s::text[], %(rule_deliveries)s::text[],
              %(rule_max_attempts)s::int[]) AS r(type, delivery, max_attempts)
  ON CONFLICT (type) DO UPDATE
    SET delivery = excluded.delivery, max_attempts = excluded.max_attempts, seen_at = now()
  RETURNING t.type)
-- The lease starts here: alive_until is the database time until which the worker
-- counts as alive even with its lock free.
INSERT INTO jobsd.workers (worker_id, hostname, pid, types, alive_until)
VALUES (%(worker_id)s, %(hostname)s, %(pid)s, %(types)s::text[],
        now() + make_interval(secs => %(lease_s)s::float8))
ON CONFLICT (worker_id) DO UPDATE
  SET last_seen_at = now(), types = excluded.types, alive_until = excluded.alive_until
RETURNING *, (SELECT count(*) FROM rules) AS rules_recorded;

-- name: workers_renew
-- Renew the worker's lease, on the connection that holds its lock: the worker counts
-- as alive until alive_until even if that connection is lost meanwhile.
UPDATE jobsd.workers
SET last_seen_at = now(), alive_until = now() + make_interval(secs => %(lease_s)s::float8)
WHERE worker_id = %(worker_id)s
RETURNING worker_id;

-- name: workers_deregister
DELETE FROM jobsd.workers WHERE worker_id = %(worker_id)s;

-- name: workers_take_dead
-- Inside a transaction: the registered workers, other than the caller, whose lease
-- has run out and whose lock the caller could take. Both are needed: a free lock
-- alone may be a live worker whose lock's connection was just lost (it takes the lock
-- again within its lease, or stops its handlers before the lease ends). The locks
-- are transaction-scoped: the commit releases them. CASE keeps the caller from ever
-- trying its own lock, or a live worker's. Two sweepers cannot both take one worker:
-- the second one's try fails while the first holds it.
SELECT worker_id FROM jobsd.workers
WHERE CASE WHEN worker_id = %(worker_id)s THEN false
           WHEN alive_until >= now() THEN false
           ELSE pg_try_advisory_xact_lock(jobsd.worker_lock_key(worker_id)) END
ORDER BY worker_id;

-- name: workers_delete_many
DELETE FROM jobsd.workers WHERE worker_id = ANY(%(worker_ids)s::text[]);

-- name: workers_session_deadlines
-- Set on each connection of jobsd's pools: `settings` maps a parameter to its value
-- (jit off on every pool; on the daemon's, statement_timeout,
-- idle_in_transaction_session_timeout and client_connection_check_interval in ms);
-- one the server does not have (a check interval before PG 14) is skipped.
SELECT s.name, set_config(s.name, v.value, false) AS value
FROM jsonb_each_text(%(settings)s::jsonb) AS v(name, value)
JOIN pg_settings AS s ON s.name = v.name;
