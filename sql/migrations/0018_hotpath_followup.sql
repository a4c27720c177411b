-- jobsd schema, version 18: the hot path's triggers (0010) under the tenant boundary
-- (0012).
--
-- * 0010_hotpath replaced the history triggers by statement triggers:
--   jobsd.after_insert_jobs() (history, admission and the start-state check of
--   inserts), jobsd.record_status_changes() (history of status updates) and
--   jobsd.delete_events_of_deleted_jobs() (what the foreign key's cascade did).
--   0012_tenant made the history functions of before (record_inserted_jobs,
--   record_status_change) SECURITY DEFINER and revoked INSERT on job_events from
--   the enqueue role: the functions that write history now are made so here, with
--   the same search_path, so that the enqueue and API roles can enqueue and cancel
--   without any right on job_events (and a tenant still cannot forge history).
--   after_insert_jobs and delete_events_of_deleted_jobs were already SECURITY
--   DEFINER; they are set again, so that the three read alike whatever came before.
--
-- Never edit this file once shipped: add a new numbered migration instead.

ALTER FUNCTION jobsd.after_insert_jobs() SECURITY DEFINER;
ALTER FUNCTION jobsd.after_insert_jobs() SET search_path = pg_catalog, jobsd, pg_temp;
ALTER FUNCTION jobsd.record_status_changes() SECURITY DEFINER;
ALTER FUNCTION jobsd.record_status_changes() SET search_path = pg_catalog, jobsd, pg_temp;
ALTER FUNCTION jobsd.delete_events_of_deleted_jobs() SECURITY DEFINER;
ALTER FUNCTION jobsd.delete_events_of_deleted_jobs() SET search_path = pg_catalog, jobsd, pg_temp;
REVOKE ALL ON FUNCTION jobsd.after_insert_jobs(), jobsd.record_status_changes(),
  jobsd.delete_events_of_deleted_jobs() FROM PUBLIC;
