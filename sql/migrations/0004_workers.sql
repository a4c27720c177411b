-- jobsd schema, version 4: registered workers, whose death is proven by a lock.
--
-- Each daemon inserts its row after taking a session advisory lock on
-- jobsd.worker_lock_key(worker_id) on a dedicated connection, and keeps both while
-- it lives. A sweeper that can take that lock (pg_try_advisory_xact_lock) has proof
-- that the owner's session is gone: it rescues the worker's running jobs at once
-- and deletes the row. A clean shutdown deletes the row itself.
--
-- Never edit this file once shipped: add a new numbered migration instead.

CREATE TABLE jobsd.workers (
  worker_id     text PRIMARY KEY,
  hostname      text NOT NULL,
  pid           integer NOT NULL,
  started_at    timestamptz NOT NULL DEFAULT now(),
  last_seen_at  timestamptz NOT NULL DEFAULT now()
);

-- The advisory lock key of a worker: a 64-bit hash of its id, in a namespace of
-- its own so it cannot meet the migration lock or an application's locks.
CREATE FUNCTION jobsd.worker_lock_key(worker_id text) RETURNS bigint
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  AS $$ SELECT hashtextextended('jobsd.worker:' || worker_id, 0) $$;
