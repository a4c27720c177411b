-- Named queries on jobsd.queues.

-- name: queues_existing
SELECT name FROM jobsd.queues WHERE name = ANY(%(names)s::text[]);

-- name: queues_exists
SELECT EXISTS (SELECT 1 FROM jobsd.queues WHERE name = %(name)s) AS exists;

-- Administration (`jobsd queue`, jobsd.queues, the API's /queues), through the
-- SECURITY DEFINER functions of migration 0009: they count every org's jobs and
-- need no right on jobsd.queues beyond EXECUTE.

-- name: queues_info
-- One queue (name given) or all, by name, with their open jobs by state.
SELECT * FROM jobsd.queue_info(%(name)s::text);

-- name: queues_create
SELECT jobsd.queue_create(%(name)s::text, %(capacity)s::integer,
                          %(concurrency_limit)s::integer, %(retention_days)s::integer) AS done;

-- name: queues_set_limits
SELECT jobsd.queue_set_limits(%(name)s::text,
                              %(set_capacity)s::boolean, %(capacity)s::integer,
                              %(set_concurrency_limit)s::boolean, %(concurrency_limit)s::integer,
                              %(set_retention_days)s::boolean, %(retention_days)s::integer)
       AS done;

-- name: queues_set_org_limits
-- The per-org limits of migration 0012 (each org's running and open jobs).
SELECT jobsd.queue_set_org_limits(%(name)s::text,
                                  %(set_running)s::boolean, %(org_running_limit)s::integer,
                                  %(set_open)s::boolean, %(org_open_limit)s::integer) AS done;

-- name: queues_pause
SELECT jobsd.queue_pause(%(name)s::text) AS done;

-- name: queues_resume
-- Also wakes the daemons: NOTIFY jobsd, '<name>' at commit.
SELECT jobsd.queue_resume(%(name)s::text) AS done;

-- name: queues_drop
SELECT queue_found, open_jobs, deleted_jobs FROM jobsd.queue_drop(%(name)s::text);
