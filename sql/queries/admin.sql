-- Named queries for operators: switches and introspection.

-- name: admin_notify_enable
ALTER TABLE jobsd.jobs ENABLE TRIGGER jobs_notify_insert;
ALTER TABLE jobsd.jobs ENABLE TRIGGER jobs_notify_requeue;

-- name: admin_notify_disable
ALTER TABLE jobsd.jobs DISABLE TRIGGER jobs_notify_insert;
ALTER TABLE jobsd.jobs DISABLE TRIGGER jobs_notify_requeue;

-- name: admin_notify_status
SELECT tgenabled <> 'D' AS enabled FROM pg_trigger
WHERE tgrelid = 'jobsd.jobs'::regclass AND tgname = 'jobs_notify_insert';

-- name: admin_set_actor
SELECT set_config('jobsd.actor', %(worker_id)s, true);
