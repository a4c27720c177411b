-- Named queries on jobsd.jobs and jobsd.job_events. Each starts with a name line;
-- parameters are named; "now" is a parameter where tests need to pin the clock.

-- name: jobs_insert
-- One job, only if its queue exists. ON CONFLICT covers both a taken id (a retried
-- submission) and a taken (org_id, dedup_key): no row comes back and the caller
-- re-reads the holder.
-- A job with dependencies still pending starts blocked.
-- Only what the database decided comes back: the caller has the rest (decoding the
-- whole row was a sixth of the client's CPU per enqueue).
INSERT INTO jobsd.jobs (id, org_id, type, queue, status, dedup_key, payload, run_after,
                        priority, concurrency_key, trace_context)
SELECT %(id)s, %(org_id)s, %(type)s, q.name,
       CASE WHEN %(blocked)s THEN 'blocked'
            WHEN %(run_after)s::timestamptz > now() THEN 'scheduled' ELSE 'queued' END,
       %(dedup_key)s, %(payload)s::jsonb, coalesce(%(run_after)s::timestamptz, now()),
       %(priority)s, %(concurrency_key)s, %(trace_context)s::jsonb
FROM jobsd.queues AS q
WHERE q.name = %(queue)s
ON CONFLICT DO NOTHING
RETURNING id, status, run_after, created_at;

-- name: jobs_insert_many
-- Many jobs in one statement, all or nothing (one autocommit statement): an unknown
-- queue fails it through the queue's foreign key. Rows that hit a conflict are
-- simply absent from the result; the others return what the database decided.
INSERT INTO jobsd.jobs (id, org_id, type, queue, status, dedup_key, payload, run_after,
                        priority, concurrency_key, trace_context)
SELECT b.id, b.org_id, b.type, b.queue,
       CASE WHEN b.run_after > now() THEN 'scheduled' ELSE 'queued' END,
       b.dedup_key, b.payload, coalesce(b.run_after, now()), b.priority, b.concurrency_key,
       b.trace_context
FROM unnest(%(ids)b::uuid[], %(org_ids)b::text[], %(types)b::text[], %(queues)b::text[],
            %(dedup_keys)b::text[], %(payloads)b::text[]::jsonb[],
            %(run_afters)b::timestamptz[], %(priorities)b::int[],
            %(concurrency_keys)b::text[], %(trace_contexts)b::text[]::jsonb[])
     WITH ORDINALITY AS b(id, org_id, type, queue, dedup_key, payload, run_after, priority,
                          concurrency_key, trace_context, ord)
ORDER BY b.ord
ON CONFLICT DO NOTHING
RETURNING id, status, run_after, created_at;

-- name: jobs_copy_start
-- The first statement of a bulk enqueue through COPY, in its transaction: the
-- transaction's now() (every job's created_at, and the run_after of those without
-- one), and whether row-level security applies to this role (COPY FROM refuses to
-- run then, and the batch goes through jobs_insert_many instead).
SELECT now() AS now, row_security_active('jobsd.jobs') AS row_security;

-- name: jobs_copy
-- The rows of a bulk enqueue whose jobs cannot exist yet (fresh ids, no dedup key, no
-- dependency): the client decided each status against jobs_copy_start's now(), as
-- jobs_insert_many decides it against its own. The insert triggers run as for an
-- INSERT: history, admission (capacity, quotas), the wake-up NOTIFY.
COPY jobsd.jobs (id, org_id, type, queue, status, payload, run_after, priority,
                 concurrency_key, trace_context)
FROM STDIN;

-- name: jobs_mark_dependencies
-- The dependencies of a job being enqueued, in the enqueuer's org: mark each as
-- having dependents and return its latest status. The UPDATE locks the rows: a
-- dependency ending concurrently is either committed (its new status is returned)
-- or waits for the enqueue's commit (then its trigger sees the new edges).
-- The lock also makes a claimer skip a queued dependency until the enqueue commits:
-- the NOTIFY of its queue (sent at that commit) wakes the claimer that skipped it.
WITH marked AS (
  UPDATE jobsd.jobs SET has_dependents = true
  WHERE id = ANY(%(ids)s::uuid[]) AND org_id = %(org_id)s
  RETURNING id, status, queue),
woken AS (
  SELECT pg_notify('jobsd', w.queue)
  FROM (SELECT DISTINCT m.queue FROM marked AS m
        WHERE m.status IN ('queued', 'scheduled')) AS w)
SELECT m.id, m.status, (SELECT count(*) FROM woken) AS woken_queues
FROM marked AS m;

-- name: job_dependencies_insert
INSERT INTO jobsd.job_dependencies (job_id, depends_on, org_id)
SELECT %(job_id)s, d.id, %(org_id)s FROM unnest(%(depends_on)s::uuid[]) AS d(id)
ON CONFLICT DO NOTHING;

-- name: jobs_fail_blocked
-- A job enqueued after one of its dependencies failed or was cancelled fails at once.
UPDATE jobsd.jobs
SET status = 'failed', reason = %(reason)s, error = %(reason)s, finished_at = now(),
    dedup_key = NULL
WHERE id = %(id)s AND status = 'blocked'
RETURNING *;

-- name: jobs_get
-- One job, open or archived.
SELECT * FROM jobsd.all_jobs WHERE id = %(id)s;

-- name: jobs_get_in_org
-- One job of one org (org_id set) or of any (null), open or archived.
SELECT * FROM jobsd.all_jobs
WHERE id = %(id)s AND (%(org_id)s::text IS NULL OR org_id = %(org_id)s::text);

-- name: jobs_get_by_dedup_key
SELECT * FROM jobsd.jobs WHERE org_id = %(org_id)s AND dedup_key = %(dedup_key)s;

-- name: job_events_for_job
SELECT * FROM jobsd.all_job_events WHERE job_id = %(id)s ORDER BY id;

-- name: jobs_hold_id
-- A given id's job, if it is in the hot table, held (in the enqueue's transaction)
-- so that it cannot move to the archive meanwhile; a move in flight is waited for.
SELECT id FROM jobsd.jobs WHERE id = %(id)s FOR KEY SHARE;

-- name: jobs_archived_org
-- The org of the archived job with this id, null if there is none: every org's
-- (a SECURITY DEFINER function), so that an id taken by another org is refused
-- without anything else about it being read.
SELECT jobsd.archived_job_org(%(id)s::uuid) AS org_id;

-- name: jobs_archived_statuses
-- The dependencies of a job being enqueued that ended long enough ago to be archived,
-- in the enqueuer's org: a statement of its own, run after jobs_mark_dependencies
-- found them missing, so that a move committed meanwhile is seen. An archived job
-- never changes: no lock is needed.
SELECT a.id, a.status FROM jobsd.jobs_archive AS a
WHERE a.id = ANY(%(ids)s::uuid[]) AND a.org_id = %(org_id)s;

-- name: jobs_claim_batch
-- Claim up to `limit` queued jobs in claim order (priority, then oldest first) in
-- one statement. Paused queues are not read at all; each other queue is read from
-- the head of its claim index, so what other queues hold costs nothing. SKIP
-- LOCKED lets any number of daemons claim at once without waiting on each other.
-- Every claim gets a fresh lease id; all later writes by the worker are
-- conditioned on it. The dedup key is released at the start of the run unless the
-- type holds it until the end (dedup_scope 'active').
--
-- Concurrency keys: a job with a key runs only while fewer than its limit (the
-- type's, else the queue's, else 1) of its key run. The scan skips keys already at
-- their limit; the key rows of the candidates are then locked (SKIP LOCKED: a key
-- another claimer is deciding on waits for the next round) and the count read
-- there is the latest committed one, so daemons claiming at once never exceed a
-- limit. The jobs_count_key_runs trigger keeps the counts. `considered` tells the
-- claimer whether candidates were left for a busy key, so it can claim again.
--
-- Claiming ahead: only the first `free` jobs (the daemon's free slots; null: all)
-- start: they become `running` (attempts + 1, a fresh lease). The rest are reserved
-- for the daemon, ahead of its slots: they stay `queued` with the daemon's lease and
-- `reserved_until` (`reserve_s` from now), no attempt is charged and no history row
-- written, and other claims skip them until then; the daemon starts them when a slot
-- frees (jobs_start_reserved). Only jobs without a dedup or concurrency key, not of a
-- type delivered at most once (`at_most_once_types`) and not in a queue with an
-- org_running_limit are reserved: what counts running jobs must see every one.
--
-- Orgs (migration 0012): in a queue with an org_running_limit, the scan skips the
-- jobs of an org already at that many running jobs there, and a round starts at
-- most the rest; an org that floods the head of a queue leaves the next round to
-- the others (`considered` makes the claimer claim again at once). A soft limit:
-- two daemons claiming at the same instant may each start up to it.
WITH active AS (
  SELECT q.name, q.concurrency_limit, q.org_running_limit
  FROM jobsd.queues AS q
  WHERE q.paused_at IS NULL
    AND (%(queues)s::text[] IS NULL OR q.name = ANY(%(queues)s::text[]))),
type_limits AS MATERIALIZED (
  SELECT t.type, t.key_limit
  FROM unnest(%(limit_types)s::text[], %(limit_values)s::int[]) AS t(type, key_limit)),
picked AS (
  SELECT c.* FROM active AS a
  CROSS JOIN LATERAL (
    SELECT j.id, j.org_id, j.concurrency_key, j.priority, j.created_at,
           j.dedup_key IS NOT NULL AS has_dedup,
           j.type = ANY(%(at_most_once_types)s::text[]) AS at_most_once,
           CASE WHEN j.concurrency_key IS NOT NULL THEN
             coalesce((SELECT t.key_limit FROM type_limits AS t WHERE t.type = j.type),
                      a.concurrency_limit, 1) END AS key_limit,
           j.queue AS org_queue, a.org_running_limit AS org_limit, o.running AS org_running
    FROM jobsd.jobs AS j
    -- org fairness (migration 0012): the org's running jobs in this queue, counted
    -- only when the queue has an org_running_limit
    LEFT JOIN LATERAL (
      SELECT count(*) AS running FROM jobsd.jobs AS r
      WHERE a.org_running_limit IS NOT NULL AND r.queue = a.name
        AND r.org_id = j.org_id AND r.status = 'running') AS o ON true
    WHERE j.status = 'queued' AND j.queue = a.name
      -- reserved by a daemon (its own included) until then (0022)
      AND (j.reserved_until IS NULL OR j.reserved_until <= now())
      AND (a.org_running_limit IS NULL OR o.running < a.org_running_limit)
      -- only the types this daemon handles (NULL: every type, JOBSD_UNKNOWN_TYPES=fail)
      AND (%(types)s::text[] IS NULL OR array_position(%(types)s::text[], j.type) IS NOT NULL)
      AND (j.concurrency_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM jobsd.concurrency_keys AS k
        WHERE k.org_id = j.org_id AND k.concurrency_key = j.concurrency_key
          AND k.running >= coalesce((SELECT t.key_limit FROM type_limits AS t
                                     WHERE t.type = j.type), a.concurrency_limit, 1)))
    ORDER BY j.priority, j.created_at, j.id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED) AS c),
ranked AS (
  SELECT p.*, row_number() OVER (PARTITION BY p.org_id, p.concurrency_key
                                 ORDER BY p.priority, p.created_at, p.id) AS nth,
         row_number() OVER (PARTITION BY p.org_queue, p.org_id
                            ORDER BY p.priority, p.created_at, p.id) AS org_nth
  FROM picked AS p),
key_counts AS (
  SELECT k.org_id, k.concurrency_key, k.running
  FROM jobsd.concurrency_keys AS k
  WHERE (k.org_id, k.concurrency_key) IN (
    SELECT p.org_id, p.concurrency_key FROM picked AS p WHERE p.concurrency_key IS NOT NULL)
  FOR UPDATE OF k SKIP LOCKED),
eligible AS (
  SELECT r.id, r.priority, r.created_at, r.concurrency_key, r.has_dedup, r.at_most_once,
         r.org_limit, row_number() OVER (ORDER BY r.priority, r.created_at, r.id) AS pos
  FROM ranked AS r
  LEFT JOIN key_counts AS k
    ON k.org_id = r.org_id AND k.concurrency_key = r.concurrency_key
  WHERE (r.concurrency_key IS NULL OR k.running + r.nth <= r.key_limit)
    AND (r.org_limit IS NULL OR r.org_running + r.org_nth <= r.org_limit)),
chosen AS (
  SELECT e.id, e.at_most_once, e.concurrency_key,
         e.pos <= coalesce(%(free)s, %(limit)s) AS starts
  FROM eligible AS e
  WHERE e.pos <= coalesce(%(free)s, %(limit)s)
     OR (e.concurrency_key IS NULL AND NOT e.has_dedup AND NOT e.at_most_once
         AND e.org_limit IS NULL)
  ORDER BY e.priority, e.created_at, e.id
  LIMIT %(limit)s),
-- Durability (docs/decisions.md, "A claim commits without waiting for the disk"):
-- unless the daemon asks for durable claims (`relaxed_commit` false), or a chosen job
-- is of an at-most-once type or has a concurrency key, this transaction commits
-- without waiting for its WAL to reach the disk. A claim lost in a crash of Postgres
-- is a job queued again, never a job lost; the run's later writes (heartbeat, outcome)
-- wait for the disk, and with them for this claim. A server that waits for synchronous
-- standbys (synchronous_standby_names set) waits for them on claims too: a failover
-- must not undo a claim whose handler runs. `relaxed_commit` in RETURNING is there to
-- make commit_mode run (a CTE nobody reads is not evaluated).
commit_mode AS MATERIALIZED (
  SELECT set_config('synchronous_commit', 'off', true) AS synchronous_commit
  WHERE %(relaxed_commit)s AND current_setting('synchronous_standby_names') = ''
    AND NOT EXISTS (
    SELECT 1 FROM chosen AS c WHERE c.at_most_once OR c.concurrency_key IS NOT NULL))
UPDATE jobsd.jobs AS j
SET status = CASE WHEN chosen.starts THEN 'running' ELSE 'queued' END,
    -- the clock at the row's update, as the history's stored events are stamped: the
    -- run's start in the history is read from it (0032), after any event before it
    started_at = CASE WHEN chosen.starts THEN clock_timestamp() ELSE j.started_at END,
    attempts = CASE WHEN chosen.starts THEN j.attempts + 1 ELSE j.attempts END,
    -- the run's start in the history: derived from this row under this id (0032)
    start_event_id = CASE WHEN chosen.starts THEN nextval('jobsd.job_events_id_seq')
                          ELSE j.start_event_id END,
    lease_id = gen_random_uuid(), worker_id = %(worker_id)s,
    reason = CASE WHEN chosen.starts THEN NULL ELSE j.reason END,
    dedup_key = CASE WHEN NOT chosen.starts OR j.type = ANY(%(keep_dedup_types)s::text[])
                     THEN j.dedup_key END,
    reserved_until = CASE WHEN NOT chosen.starts
                          THEN now() + make_interval(secs => %(reserve_s)s::float8) END
FROM chosen
WHERE j.id = chosen.id
-- the columns of a Job in its fields' order (store.queries builds it positionally);
-- not `errors` (0028): the daemon never reads a job's past errors, a Job it builds
-- here has none
RETURNING j.id, j.org_id, j.type, j.queue, j.status, j.attempts, j.dedup_key, j.payload,
          j.progress, j.report, j.error, j.reason, j.run_after, j.lease_id, j.worker_id,
          j.created_at, j.started_at, j.finished_at, j.cancel_requested_at, j.priority,
          j.concurrency_key, j.trace_context, j.reserved_until,
          (SELECT count(*) FROM picked) AS considered,
          (SELECT count(*) FROM commit_mode) AS relaxed_commit;

-- name: jobs_heartbeat
-- One statement for every job a daemon holds: merge the pending progress of those
-- whose handlers reported some (stamping progress.updated_at: the handler's last sign
-- of life, never the daemon's), and check the others without writing them. Jobs
-- whose lease changed are not returned: the worker lost them. A job with a cancel
-- request says so: its handler is to be cancelled.
WITH held AS (
  SELECT * FROM unnest(%(ids)s::uuid[], %(lease_ids)s::uuid[], %(fields)s::jsonb[])
    AS h(id, lease_id, fields)),
written AS (
  UPDATE jobsd.jobs AS j
  SET progress = coalesce(j.progress, '{}'::jsonb) || h.fields
                 || jsonb_build_object('updated_at', now())
  FROM held AS h
  WHERE j.id = h.id AND j.lease_id = h.lease_id AND j.status = 'running'
    AND h.fields IS NOT NULL
  RETURNING j.id, j.cancel_requested_at IS NOT NULL AS cancel_requested)
SELECT w.id, w.cancel_requested FROM written AS w
UNION ALL
SELECT j.id, j.cancel_requested_at IS NOT NULL
FROM held AS h JOIN jobsd.jobs AS j ON j.id = h.id
WHERE h.fields IS NULL AND j.lease_id = h.lease_id AND j.status = 'running';

-- name: jobs_start_reserved
-- Start jobs this daemon reserved (jobs_claim_batch), one per free slot, just before
-- their handlers start: queued -> running, the attempt counted now, a fresh lease.
-- Each is conditioned on its reservation's lease, so a reservation that another
-- claim took after it expired, or a job cancelled meanwhile, does not start.
-- `confirm` (a second try after an answer that never came) also returns the jobs the
-- first try started: their rows are locked and read at their latest version, so a
-- try still committing is waited for. The commit waits for the disk unless `relaxed`
-- (the claim's rule: a start undone by a crash of Postgres is a job queued again; on a
-- server with synchronous standbys it waits for them, as the claim does).
WITH commit_mode AS MATERIALIZED (
  SELECT set_config('synchronous_commit', 'off', true) AS synchronous_commit
  WHERE %(relaxed)s AND current_setting('synchronous_standby_names') = '')
UPDATE jobsd.jobs AS j
SET status = 'running',
    started_at = CASE WHEN j.status = 'queued' THEN clock_timestamp() ELSE j.started_at END,
    attempts = CASE WHEN j.status = 'queued' THEN j.attempts + 1 ELSE j.attempts END,
    start_event_id = CASE WHEN j.status = 'queued' THEN nextval('jobsd.job_events_id_seq')
                          ELSE j.start_event_id END,
    lease_id = CASE WHEN j.status = 'queued' THEN s.new_lease_id ELSE j.lease_id END,
    reason = CASE WHEN j.status = 'queued' THEN NULL ELSE j.reason END,
    reserved_until = NULL
FROM unnest(%(ids)s::uuid[], %(lease_ids)s::uuid[], %(new_lease_ids)s::uuid[])
     AS s(id, lease_id, new_lease_id)
WHERE j.id = s.id
  AND ((j.status = 'queued' AND j.lease_id = s.lease_id)
       OR (%(confirm)s AND j.status = 'running' AND j.lease_id = s.new_lease_id))
RETURNING j.id, j.attempts, j.started_at, (SELECT count(*) FROM commit_mode) AS relaxed;

-- name: jobs_release_reserved
-- Give back reservations this daemon will not start (its stop, or no slot freed in
-- time): the jobs stay queued, claimable at once; nothing was charged, no history is
-- written. Their queues are notified so an idle daemon takes them now.
WITH released AS (
  UPDATE jobsd.jobs AS j
  SET lease_id = NULL, worker_id = NULL, reserved_until = NULL
  FROM unnest(%(ids)s::uuid[], %(lease_ids)s::uuid[]) AS s(id, lease_id)
  WHERE j.id = s.id AND j.lease_id = s.lease_id AND j.status = 'queued'
  RETURNING j.id, j.queue),
woken AS (
  SELECT pg_notify('jobsd', w.queue) FROM (SELECT DISTINCT r.queue FROM released AS r) AS w)
SELECT r.id, (SELECT count(*) FROM woken) AS woken_queues FROM released AS r;

-- name: jobs_owned_unheld
-- Running jobs of this worker whose lease it does not hold: the jobs of a claim whose
-- answer never reached it (the claim committed, the connection broke). The daemon
-- adopts them: their handlers start now.
SELECT j.id, j.org_id, j.type, j.queue, j.status, j.attempts, j.dedup_key, j.payload,
       j.progress, j.report, j.error, j.reason, j.run_after, j.lease_id, j.worker_id,
       j.created_at, j.started_at, j.finished_at, j.cancel_requested_at, j.priority,
       j.concurrency_key, j.trace_context, j.reserved_until
FROM jobsd.jobs AS j
WHERE j.status = 'running' AND j.worker_id = %(worker_id)s
  AND j.lease_id <> ALL(%(held)s::uuid[]);

-- name: jobs_finish_batch
-- Write many outcomes in one statement, each conditioned on its lease. A result
-- whose lease is gone is not applied and its id is not returned. An outcome may
-- also be non-terminal (back to queued after an interrupted run, or scheduled for a
-- retry `delay_s` from now on the database clock): then the dedup key is kept. The
-- row keeps the run's lease (the next claim writes a new one; nothing but a running
-- row takes a worker's write), so that a write tried again after its answer was lost
-- (`confirm`) finds the rows the first try wrote: same lease, the outcome's status.
-- Only the columns the outcome changed come back (the daemon has
-- the rest): decoding whole rows was a fifth of the daemon's CPU per job.
-- The outcomes are read through jobsd.outcome_rows_v2 (migrations 0020, 0028), which
-- tells the planner a batch is small: one primary-key lookup per outcome.
-- An outcome that carries an error carries its attempt's record (`error_record`: type,
-- message, traceback, cause, capped by the daemon); it goes first in `errors`, with
-- the attempt and the database's clock, the oldest beyond `errors_kept` dropped
-- (jobsd.error_records_push). Only a write that moves the job from running adds it:
-- a write tried again (`confirm`) finds the record there. An outcome without one
-- (every success) leaves `errors` as it is.
UPDATE jobsd.jobs AS j
SET status = r.status, report = r.report, error = r.error, reason = r.reason,
    errors = CASE WHEN r.error_record IS NULL OR j.status <> 'running' THEN j.errors
                  ELSE jobsd.error_records_push(
                         j.errors,
                         r.error_record
                           || jsonb_build_object('attempt', j.attempts, 'at', now()),
                         %(errors_kept)s) END,
    progress = CASE WHEN r.progress IS NULL THEN j.progress
                    ELSE coalesce(j.progress, '{}'::jsonb) || r.progress END,
    -- the clock at the row's update, as for the run's start (0032)
    finished_at = CASE WHEN r.status IN ('succeeded', 'failed', 'cancelled')
                       THEN clock_timestamp() END,
    dedup_key = CASE WHEN r.status IN ('succeeded', 'failed', 'cancelled') THEN NULL
                     ELSE j.dedup_key END,
    run_after = coalesce(r.run_after, now() + make_interval(secs => r.delay_s), j.run_after),
    -- the run's end, when it ends the job: derived from this row under this id (0032);
    -- an outcome that does not end the job is stored by the history trigger
    end_event_id = CASE WHEN j.status = 'running'
                             AND r.status IN ('succeeded', 'failed', 'cancelled')
                        THEN nextval('jobsd.job_events_id_seq') ELSE j.end_event_id END
FROM jobsd.outcome_rows_v2(%(results)s::jsonb) AS r
WHERE j.id = r.id AND j.lease_id = r.lease_id
  AND (j.status = 'running' OR (%(confirm)s AND j.status = r.status))
-- in the order of store.queries.Finished's fields, which is built positionally
RETURNING j.id, j.type, j.status, j.concurrency_key, j.dedup_key, j.lease_id, j.error,
          j.reason, j.progress, j.finished_at, j.run_after;

-- name: jobs_db_now
-- The database's clock, the one that stamps leases: the sweeper checks it against its
-- own monotonic clock before a stale sweep (a step of it would age every lease).
SELECT now() AS now;

-- name: jobs_rescue_candidates
-- Inside a transaction, with jobs_rescue_apply: lock the running jobs to rescue, with
-- what deciding their fate needs (worker/decide.py decides; these statements hold no
-- rule). A job is rescued when its owner is dead (its worker id is in `dead_workers`:
-- the sweeper holds its lock, and its lease is over) or unresponsive (its lease ended
-- more than `stale_after_s` ago while it still holds its lock: a process stopped, or
-- cut off from the database; an owner with no row is judged by the run's start; a
-- null threshold checks only the dead). A handler's own silence is no owner's death:
-- timeouts and stall limits end silent handlers. `only` (when not null) limits the
-- pass to that job: the sweeper's one-by-one pass after the database refused a whole one.
SELECT j.id, j.type, j.attempts, j.cancel_requested_at IS NOT NULL AS cancel_requested,
       j.worker_id = ANY(coalesce(%(dead_workers)s::text[], '{}')) AS dead
FROM jobsd.jobs AS j
LEFT JOIN jobsd.workers AS w ON w.worker_id = j.worker_id
WHERE j.status = 'running'
  AND (%(only)s::uuid IS NULL OR j.id = %(only)s::uuid)
  AND (j.worker_id = ANY(coalesce(%(dead_workers)s::text[], '{}'))
       OR coalesce(w.alive_until, j.started_at)
          < coalesce(%(now)s::timestamptz, now())
            - make_interval(secs => %(stale_after_s)s::float8))
ORDER BY j.id
FOR UPDATE OF j SKIP LOCKED;

-- name: jobs_rescue_apply
-- Write the verdicts the daemon decided for the jobs jobs_rescue_candidates locked, in
-- the same transaction: the next status, its reason, and the cause kept in `error`
-- (null: the job keeps its error). The lease is cleared, so a late report from the old
-- owner is discarded; a job that leaves for good loses its dedup key. The attempt the
-- lost worker ran gets its error record (`records`), as jobs_finish_batch writes one.
UPDATE jobsd.jobs AS j
SET status = d.status, reason = d.reason, error = coalesce(d.error, j.error),
    errors = CASE WHEN d.record IS NULL THEN j.errors
                  ELSE jobsd.error_records_push(
                         j.errors,
                         d.record || jsonb_build_object('attempt', j.attempts, 'at', now()),
                         %(errors_kept)s) END,
    finished_at = CASE WHEN d.status IN ('succeeded', 'failed', 'cancelled') THEN now() END,
    dedup_key = CASE WHEN d.status IN ('succeeded', 'failed', 'cancelled') THEN NULL
                     ELSE j.dedup_key END,
    lease_id = NULL
FROM unnest(%(ids)s::uuid[], %(statuses)s::text[], %(reasons)s::text[], %(errors)s::text[],
            %(records)s::text[]::jsonb[])
     AS d(id, status, reason, error, record)
WHERE j.id = d.id AND j.status = 'running'
RETURNING j.*;

-- name: jobs_stale_list
-- The running jobs whose owner's lease ended more than the threshold ago (an owner
-- with no row: the run's start), with their lease: what jobs_sweep_stale would
-- rescue, for the sweeper to take them one by one when the database refused the
-- whole pass.
SELECT j.id, j.lease_id
FROM jobsd.jobs AS j
LEFT JOIN jobsd.workers AS w ON w.worker_id = j.worker_id
WHERE j.status = 'running'
  AND coalesce(w.alive_until, j.started_at)
      < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(stale_after_s)s::float8)
ORDER BY j.id;

-- name: jobs_promote_due
-- Scheduled jobs whose time has come become queued (the requeue trigger notifies);
-- also say when the next one is due (and in how many seconds, on the database's
-- clock), so the claimer can sleep until then.
WITH due AS (
  SELECT id FROM jobsd.jobs
  WHERE status = 'scheduled' AND run_after <= coalesce(%(now)s::timestamptz, now())
  ORDER BY run_after
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED),
promoted AS (
  UPDATE jobsd.jobs AS j SET status = 'queued', reason = 'due'
  FROM due WHERE j.id = due.id
  RETURNING j.id)
SELECT (SELECT count(*) FROM promoted) AS promoted,
       n.next_due,
       -- how long until then on the database's clock: the daemon's own clock may differ
       extract(epoch FROM n.next_due - coalesce(%(now)s::timestamptz, now()))::float8
         AS next_due_in_s
FROM (SELECT min(run_after) AS next_due FROM jobsd.jobs
      WHERE status = 'scheduled'
        AND run_after > coalesce(%(now)s::timestamptz, now())) AS n;

-- name: jobs_cancel
-- Cancel a job: queued, scheduled or blocked ones at once; a running one gets a
-- request (kept if one is pending) that its owner's heartbeat picks up. Other
-- states are left alone and not returned. `previous` says which case it was;
-- `changed` is false for a running job whose cancel was requested before.
WITH target AS (
  SELECT id, status, cancel_requested_at FROM jobsd.jobs
  WHERE id = %(id)s AND (%(org_id)s::text IS NULL OR org_id = %(org_id)s::text)
    AND status IN ('queued', 'scheduled', 'blocked', 'running')
  FOR UPDATE)
UPDATE jobsd.jobs AS j
SET status = CASE WHEN t.status = 'running' THEN j.status ELSE 'cancelled' END,
    reason = CASE WHEN t.status = 'running' THEN j.reason ELSE %(reason)s END,
    finished_at = CASE WHEN t.status = 'running' THEN j.finished_at ELSE now() END,
    dedup_key = CASE WHEN t.status = 'running' THEN j.dedup_key END,
    cancel_requested_at = coalesce(j.cancel_requested_at, now())
FROM target AS t
WHERE j.id = t.id
RETURNING j.*, t.status AS previous,
          t.status <> 'running' OR t.cancel_requested_at IS NULL AS changed;

-- name: job_events_note_discarded
-- Evidence of fencing: for each job whose result a worker could not write (its lease
-- was gone), an event from the job's current status to the same status, naming the
-- worker whose result was discarded. FOR SHARE waits for a transition in flight, so
-- the note lands after that transition's own event and the chain stays gapless.
INSERT INTO jobsd.job_events (job_id, org_id, from_status, to_status, attempt, worker_id, reason)
SELECT j.id, j.org_id, j.status, j.status, j.attempts, %(worker_id)s,
       'result discarded: lease lost'
FROM jobsd.jobs AS j
WHERE j.id = ANY(%(ids)s::uuid[])
FOR SHARE OF j;

-- name: jobs_claim_one
-- Claim one specific job, if it is queued. The row lock makes two
-- claimers of the same id take turns: the second finds it running and gets no row.
-- The queue's pause and the job's concurrency key hold here too: the key row is
-- locked (waiting for a claimer deciding on it) and its latest count decides.
WITH target AS (
  SELECT j.id, j.org_id, j.concurrency_key, q.paused_at,
         coalesce(%(key_limit)s::int, q.concurrency_limit, 1) AS key_limit
  FROM jobsd.jobs AS j JOIN jobsd.queues AS q ON q.name = j.queue
  WHERE j.id = %(id)s AND j.status = 'queued'
  FOR UPDATE OF j),
key_count AS (
  SELECT k.running FROM jobsd.concurrency_keys AS k
  JOIN target AS t ON k.org_id = t.org_id AND k.concurrency_key = t.concurrency_key
  FOR UPDATE OF k)
UPDATE jobsd.jobs AS j
SET status = 'running', started_at = now(), attempts = j.attempts + 1,
    lease_id = gen_random_uuid(), worker_id = %(worker_id)s, reason = NULL,
    dedup_key = CASE WHEN %(keep_dedup)s THEN j.dedup_key END, reserved_until = NULL
FROM target AS t
WHERE j.id = t.id AND t.paused_at IS NULL
  AND (t.concurrency_key IS NULL
       OR coalesce((SELECT c.running FROM key_count AS c), 0) < t.key_limit)
RETURNING j.*;

-- name: jobs_resolve
-- Settle a recovery_required job (a recover hook's answer, or an operator's):
-- succeeded, failed, cancelled (a job cancelled while running whose work was not
-- done) or queued again; of one org (org_id set) or of any (null). Any other current
-- state is left alone.
UPDATE jobsd.jobs
SET status = %(status)s, reason = %(reason)s,
    report = coalesce(%(report)s::jsonb, report),
    error = CASE %(status)s WHEN 'failed' THEN coalesce(%(error)s, error)
                            WHEN 'succeeded' THEN NULL ELSE error END,
    finished_at = CASE WHEN %(status)s IN ('succeeded', 'failed', 'cancelled') THEN now() END,
    dedup_key = CASE WHEN %(status)s IN ('succeeded', 'failed', 'cancelled') THEN NULL
                     ELSE dedup_key END
WHERE id = %(id)s AND status = 'recovery_required'
  AND (%(org_id)s::text IS NULL OR org_id = %(org_id)s::text)
RETURNING *;

-- name: jobs_retry
-- A failed or cancelled job retried as a new job (jobsd.job_retry): the outcome says
-- what happened, job_id names the new job (or the retry made before); the caller
-- reads it back.
SELECT r.outcome, r.job_id
FROM jobsd.job_retry(%(id)s::uuid, %(new_id)s::uuid, %(actor)s::text, %(force)s::boolean,
                     %(org_id)s::text) AS r;

-- name: jobs_list
-- Jobs newest first, after a keyset cursor (created_at, id) (the first page passes
-- ('infinity', 'ffffffff-...')), filtered by org, status, type, queue and creation
-- time; every filter is optional; open and archived jobs. One org's list reads
-- jobs_org_created_idx (and the archive's) backwards; the others read
-- jobs_created_idx (and the archive's).
SELECT * FROM jobsd.all_jobs
WHERE (%(org_id)s::text IS NULL OR org_id = %(org_id)s::text)
  AND (created_at, id) < (%(before_created_at)s::timestamptz, %(before_id)s::uuid)
  AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s::timestamptz)
  AND (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(type)s::text IS NULL OR type = %(type)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;

-- name: jobs_unhandled
-- Queued jobs of types no live daemon handles, by queue and type (migration 0014).
SELECT queue, type, jobs FROM jobsd.unhandled_jobs();

-- name: jobs_copy_batch
-- A batch of one type, org, queue and priority (jobsd.store.enqueue_batch), in one
-- autocommit statement, all or nothing: the rows are built by the client in COPY's
-- text format, with fresh ids; status, run_after and created_at take their defaults
-- (queued, now). The insert triggers run as for an INSERT. An unknown queue fails it
-- through the queue's foreign key.
COPY jobsd.jobs (id, org_id, type, queue, priority, trace_context, payload) FROM STDIN;

-- name: jobs_insert_batch
-- The same batch as one INSERT: a small one, one with a start time (the status is
-- decided against the statement's now()), or where COPY does not run (row-level
-- security applies to the role).
INSERT INTO jobsd.jobs (id, org_id, type, queue, status, payload, run_after, priority,
                        trace_context)
SELECT b.id, %(org_id)s, %(type)s, %(queue)s,
       CASE WHEN %(run_after)s::timestamptz > now() THEN 'scheduled' ELSE 'queued' END,
       b.payload, coalesce(%(run_after)s::timestamptz, now()), %(priority)s,
       %(trace_context)s::jsonb
FROM unnest(%(ids)s::uuid[], %(payloads)s::text[]::jsonb[]) WITH ORDINALITY
     AS b(id, payload, ord)
ORDER BY b.ord;
