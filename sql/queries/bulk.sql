-- Named queries of the bulk actions (migration 0031): each runs one function, which
-- acts on the jobs of a filter in its own transaction and returns one summary row:
-- bulk_id (the jobsd.bulk_actions row; null for a dry run), matched, done, requested
-- (a cancel: of done, the running jobs whose cancel it requested), refused (a count
-- per reason), remaining (still matching after the call) and queue_found (false: the
-- filter's queue does not exist, and nothing was done).

-- name: bulk_retry
SELECT b.* FROM jobsd.bulk_retry(%(actor)s::text, %(scope)s::text, %(filter)s::jsonb,
                                 %(limit)s::integer, %(force)s::boolean,
                                 %(dry_run)s::boolean) AS b;

-- name: bulk_cancel
SELECT b.* FROM jobsd.bulk_cancel(%(actor)s::text, %(scope)s::text, %(filter)s::jsonb,
                                  %(limit)s::integer, %(reason)s::text,
                                  %(dry_run)s::boolean) AS b;

-- name: bulk_resolve
SELECT b.* FROM jobsd.bulk_resolve(%(actor)s::text, %(scope)s::text, %(filter)s::jsonb,
                                   %(limit)s::integer, %(status)s::text, %(reason)s::text,
                                   %(error)s::text, %(dry_run)s::boolean) AS b;
