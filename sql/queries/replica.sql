-- Named queries of the reads that may lag (JOBSD_READ_DATABASE_URL): run on the server
-- that answered them, a streaming replica or, after a promotion, a primary.

-- name: replica_lag
-- The server's delay behind its primary, in seconds: 0 on a primary, and 0 on a
-- replica that has replayed everything it received (an idle primary sends nothing, so
-- the age of the last replayed commit would grow without any delay); else the age of
-- the last replayed commit. NULL when unknown (nothing replayed since the start).
SELECT CASE
  WHEN NOT pg_is_in_recovery() THEN 0
  WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0
  ELSE greatest(extract(epoch FROM now() - pg_last_xact_replay_timestamp()), 0)
END::float8 AS lag_s;
