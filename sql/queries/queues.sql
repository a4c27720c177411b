-- Named queries on jobsd.queues.

-- name: queues_existing
SELECT name FROM jobsd.queues WHERE name = ANY(%(names)s::text[]);

-- name: queues_exists
SELECT EXISTS (SELECT 1 FROM jobsd.queues WHERE name = %(name)s) AS exists;
