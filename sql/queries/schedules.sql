-- Named queries on jobsd.schedules and jobsd.schedule_ticks (periodic jobs).

-- name: schedules_upsert
-- Declare a schedule, or update its definition (the latest declaration wins); its
-- state (paused, last tick, counters) is kept. A new schedule fires only the ticks
-- after its creation.
INSERT INTO jobsd.schedules AS s (id, type, org_id, queue, cron, every_ms, timezone,
                                  payload, priority, dedup_key, concurrency_key,
                                  catch_up, catch_up_max, created_at, updated_at)
VALUES (%(id)s, %(type)s, %(org_id)s, %(queue)s, %(cron)s, %(every_ms)s, %(timezone)s,
        %(payload)s::jsonb, %(priority)s, %(dedup_key)s, %(concurrency_key)s,
        %(catch_up)s, %(catch_up_max)s,
        coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (id) DO UPDATE
SET type = excluded.type, org_id = excluded.org_id, queue = excluded.queue,
    cron = excluded.cron, every_ms = excluded.every_ms, timezone = excluded.timezone,
    payload = excluded.payload, priority = excluded.priority,
    dedup_key = excluded.dedup_key, concurrency_key = excluded.concurrency_key,
    catch_up = excluded.catch_up,
    catch_up_max = excluded.catch_up_max, updated_at = excluded.updated_at
WHERE (s.type, s.org_id, s.queue, s.cron, s.every_ms, s.timezone, s.payload, s.priority,
       s.dedup_key, s.concurrency_key, s.catch_up, s.catch_up_max)
      IS DISTINCT FROM
      (excluded.type, excluded.org_id, excluded.queue, excluded.cron, excluded.every_ms,
       excluded.timezone, excluded.payload, excluded.priority, excluded.dedup_key,
       excluded.concurrency_key, excluded.catch_up, excluded.catch_up_max);

-- name: schedules_state
-- What a scheduler pass needs: the database's time (or the pinned one), whether
-- each schedule is paused, and the time after which its ticks may fire. One row
-- with a null id when none of the schedules exists.
SELECT n.now, s.id, s.paused,
       greatest(s.created_at, s.resumed_at, s.last_tick, s.skipped_until) AS since
FROM (SELECT coalesce(%(now)s::timestamptz, now()) AS now) AS n
LEFT JOIN jobsd.schedules AS s ON s.id = ANY(%(ids)s::text[])
ORDER BY s.id;

-- name: schedule_ticks_claim
-- Take a tick: the first scheduler inserts the row; any other one waits for its
-- commit, then finds the conflict and gets no row. Rolled back with the job if the
-- transaction fails, so a tick is never taken without its outcome.
INSERT INTO jobsd.schedule_ticks (schedule_id, tick, outcome, late, worker_id, fired_at)
VALUES (%(id)s, %(tick)s, 'enqueued', %(late)s, %(worker_id)s,
        coalesce(%(now)s::timestamptz, now()))
ON CONFLICT DO NOTHING
RETURNING tick;

-- name: schedule_ticks_settle
-- Record what the taken tick did, advance the schedule, and forget its ticks older
-- than a week (a tick at or before last_tick never fires again).
WITH settled AS (
  UPDATE jobsd.schedule_ticks
  SET outcome = %(outcome)s, job_id = %(job_id)s, reason = %(reason)s
  WHERE schedule_id = %(id)s AND tick = %(tick)s
  RETURNING tick
), advanced AS (
  UPDATE jobsd.schedules AS s
  SET last_job_id = CASE WHEN s.last_tick IS NULL OR s.last_tick <= %(tick)s
                         THEN %(job_id)s::uuid ELSE s.last_job_id END,
      last_tick = greatest(s.last_tick, %(tick)s),
      fired = s.fired + (%(outcome)s <> 'refused')::int,
      refused = s.refused + (%(outcome)s = 'refused')::int,
      late = s.late + %(late)s::int
  WHERE s.id = %(id)s
  RETURNING s.id
), pruned AS (
  DELETE FROM jobsd.schedule_ticks
  WHERE schedule_id = %(id)s AND tick < %(tick)s::timestamptz - interval '7 days'
  RETURNING 1
)
SELECT (SELECT count(*) FROM settled) AS settled, (SELECT count(*) FROM advanced) AS advanced,
       (SELECT count(*) FROM pruned) AS pruned;

-- name: schedules_skip
-- Count the missed ticks a catch-up policy does not fire, once: only the scheduler
-- that moves skipped_until forward counts them.
UPDATE jobsd.schedules
SET skipped = skipped + %(count)s, skipped_until = %(until)s
WHERE id = %(id)s AND (skipped_until IS NULL OR skipped_until < %(until)s)
RETURNING id;

-- name: schedules_info
-- One schedule (id given) or all, by id, with the outcome and job state of the last tick.
SELECT * FROM jobsd.schedule_info(%(id)s::text);

-- name: schedules_pause
-- Stop firing; keep the first paused_at.
UPDATE jobsd.schedules
SET paused = true, paused_at = coalesce(paused_at, coalesce(%(now)s::timestamptz, now()))
WHERE id = %(id)s
RETURNING id;

-- name: schedules_resume
-- Fire again from the next tick: the ticks that fell while paused never fire.
UPDATE jobsd.schedules
SET paused = false, paused_at = NULL,
    resumed_at = CASE WHEN paused THEN coalesce(%(now)s::timestamptz, now())
                      ELSE resumed_at END
WHERE id = %(id)s
RETURNING id;
