-- The statements bench/scale.py fills a database with; each block starts with a name
-- line. Rows are made on the server (generate_series), not sent by the client.
--
-- A filled job is a function of its number k: hashint8extended(k, seed) gives each
-- attribute its own pseudo-random draw, so a fill is the same data every time (ids
-- included). Jobs are numbered in order of their end: chunk [first, first + n) ends
-- between lo_us and lo_us + span_us (Unix microseconds), evenly spread. Each job
-- waited 5 ms - 5 s in its queue and ran 10 ms - 30 s (mostly short); its id is a
-- UUIDv7 of its created_at (48 bits of milliseconds, version 7, 12 bits of
-- sub-millisecond fraction, variant 10, 62 pseudo-random bits), as jobsd.uuidv7()
-- makes them. Three history rows each: queued, running, succeeded or failed.
--
-- Placeholders in braces are identifiers filled in by the script (psycopg.sql).

-- name: fill_source
-- The chunk's jobs, one row each, with everything the tables need.
SELECT t.k, t.org_id, t.type, t.queue, t.status, t.failed, t.worker_id,
       encode(int8send((t.created_us / 1000) << 16 | 28672
                       | (t.created_us %% 1000) * 4096 / 1000)
              || int8send(hashint8extended(t.k, 7) & 4611686018427387903
                          | (-9223372036854775807 - 1)), 'hex')::uuid AS id,
       timestamptz 'epoch' + t.created_us * interval '1 microsecond' AS created_at,
       timestamptz 'epoch' + t.started_us * interval '1 microsecond' AS started_at,
       timestamptz 'epoch' + t.finished_us * interval '1 microsecond' AS finished_at
FROM (
  SELECT s.k, s.failed,
         (%(orgs)s::text[])[s.org_i] AS org_id,
         (%(types)s::text[])[s.type_i] AS type,
         (%(type_queues)s::text[])[s.type_i] AS queue,
         CASE WHEN s.failed THEN 'failed' ELSE 'succeeded' END AS status,
         'scale-host-' || s.k %% 4 || ':4242:fill' AS worker_id,
         s.finished_us - s.run_us - s.wait_us AS created_us,
         s.finished_us - s.run_us AS started_us,
         s.finished_us
  FROM (
    SELECT g.k,
           width_bucket((hashint8extended(g.k, 1) & 2147483647)::float8 / 2147483648,
                        %(org_cuts)s::float8[]) + 1 AS org_i,
           width_bucket((hashint8extended(g.k, 2) & 2147483647)::float8 / 2147483648,
                        %(type_cuts)s::float8[]) + 1 AS type_i,
           (hashint8extended(g.k, 3) & 2147483647)::float8 / 2147483648
             < %(failed_share)s::float8 AS failed,
           %(lo_us)s::bigint
             + floor((g.k - %(first)s::bigint
                      + (hashint8extended(g.k, 4) & 2147483647)::float8 / 2147483648)
                     * %(span_us)s::float8 / %(n)s::float8)::bigint AS finished_us,
           5000 + floor(5000000 * ((hashint8extended(g.k, 5) & 2147483647)::float8
                                   / 2147483648) ^ 4)::bigint AS wait_us,
           10000 + floor(30000000 * ((hashint8extended(g.k, 6) & 2147483647)::float8
                                     / 2147483648) ^ 3)::bigint AS run_us
    FROM generate_series(%(first)s::bigint, %(first)s::bigint + %(n)s - 1) AS g(k)
  ) AS s
) AS t

-- name: fill_archive
-- One chunk of one month into the archive's partitions of that month (no triggers
-- there), with the months' contents the prune reads. History ids come from the
-- range [event_base, event_base + 3n) taken from job_events' sequence beforehand.
WITH src AS MATERIALIZED ({source}),
jobs_in AS (
  INSERT INTO {jobs} (id, org_id, type, queue, status, attempts, payload, report, error,
                      reason, run_after, lease_id, worker_id, created_at, started_at,
                      finished_at, priority, has_dependents)
  SELECT s.id, s.org_id, s.type, s.queue, s.status, 1,
         jsonb_build_object('item', s.k, 'to', 'user' || s.k %% 9973 || '@example.com'),
         CASE WHEN NOT s.failed THEN jsonb_build_object('ok', true) END,
         CASE WHEN s.failed THEN 'RuntimeError: upstream answered 503' END,
         CASE WHEN s.failed THEN 'handler raised' END,
         s.created_at, md5(s.k::text)::uuid, s.worker_id, s.created_at, s.started_at,
         s.finished_at, 0, false
  FROM src AS s),
events_in AS (
  INSERT INTO {events} (id, job_id, org_id, from_status, to_status, attempt, worker_id,
                        reason, at, job_finished_at)
  SELECT %(event_base)s::bigint + 3 * (s.k - %(first)s) + v.i, s.id, s.org_id, v.from_status,
         v.to_status, v.attempt, v.worker_id, v.reason, v.at, s.finished_at
  FROM src AS s
  CROSS JOIN LATERAL (VALUES
    (0, NULL, 'queued', 0, NULL, NULL, s.created_at),
    (1, 'queued', 'running', 1, s.worker_id, NULL, s.started_at),
    (2, 'running', s.status, 1, s.worker_id,
     CASE WHEN s.failed THEN 'handler raised' END, s.finished_at)
  ) AS v(i, from_status, to_status, attempt, worker_id, reason, at))
INSERT INTO jobsd.archive_contents AS c (month, queue, type, jobs)
SELECT %(month)s::timestamptz, s.queue, s.type, count(*) FROM src AS s GROUP BY s.queue, s.type
ON CONFLICT (month, queue, type) DO UPDATE SET jobs = c.jobs + excluded.jobs

-- name: fill_single
-- One chunk into jobsd.jobs and jobsd.job_events (single-table layout), the session's
-- triggers off (session_replication_role = replica): the history is written here.
WITH src AS MATERIALIZED ({source}),
jobs_in AS (
  INSERT INTO jobsd.jobs (id, org_id, type, queue, status, attempts, payload, report, error,
                          reason, run_after, lease_id, worker_id, created_at, started_at,
                          finished_at, priority, has_dependents)
  SELECT s.id, s.org_id, s.type, s.queue, s.status, 1,
         jsonb_build_object('item', s.k, 'to', 'user' || s.k %% 9973 || '@example.com'),
         CASE WHEN NOT s.failed THEN jsonb_build_object('ok', true) END,
         CASE WHEN s.failed THEN 'RuntimeError: upstream answered 503' END,
         CASE WHEN s.failed THEN 'handler raised' END,
         s.created_at, md5(s.k::text)::uuid, s.worker_id, s.created_at, s.started_at,
         s.finished_at, 0, false
  FROM src AS s)
INSERT INTO jobsd.job_events (job_id, org_id, from_status, to_status, attempt, worker_id,
                              reason, at)
SELECT s.id, s.org_id, v.from_status, v.to_status, v.attempt, v.worker_id, v.reason, v.at
FROM src AS s
CROSS JOIN LATERAL (VALUES
  (0, NULL, 'queued', 0, NULL, NULL, s.created_at),
  (1, 'queued', 'running', 1, s.worker_id, NULL, s.started_at),
  (2, 'running', s.status, 1, s.worker_id,
   CASE WHEN s.failed THEN 'handler raised' END, s.finished_at)
) AS v(i, from_status, to_status, attempt, worker_id, reason, at)
ORDER BY s.k, v.i

-- name: open_jobs
-- Open jobs, through jobsd.jobs' triggers (their history and NOTIFY as an enqueue's):
-- every other one queued in the paused queue, the others (when `schedule`) scheduled
-- a year ahead in their type's queue; orgs and types in turn. Tagged in the payload
-- with `tag`.
INSERT INTO jobsd.jobs (org_id, type, queue, status, payload, run_after)
SELECT (%(orgs)s::text[])[1 + (g.k / 2) %% cardinality(%(orgs)s::text[])],
       (%(types)s::text[])[1 + (g.k / 3) %% cardinality(%(types)s::text[])],
       CASE WHEN g.k %% 2 = 0 OR NOT %(schedule)s THEN %(parked)s
            ELSE (%(type_queues)s::text[])[1 + (g.k / 3) %% cardinality(%(types)s::text[])] END,
       CASE WHEN g.k %% 2 = 0 OR NOT %(schedule)s THEN 'queued' ELSE 'scheduled' END,
       jsonb_build_object(%(tag)s::text, g.k),
       CASE WHEN g.k %% 2 = 0 OR NOT %(schedule)s THEN now() ELSE now() + interval '365 days' END
FROM generate_series(1, %(n)s) AS g(k)
