-- jobsd schema, version 17: what the dashboard (/ui, `jobsd top`) reads fast.
--
-- * jobs_created_idx: the jobs list of an admin (every org), newest first, keyset on
--   (created_at, id); an org's list keeps jobs_org_created_idx.
-- * jobs_finished_idx: throughput and failures of the last hour, and the recent
--   failures of `jobsd top`, read only the jobs that finished in the window.
--
-- Plain CREATE INDEX (a migration runs in a transaction): it blocks writes to jobs
-- while it builds, about a second per million jobs (docs/decisions.md).
--
-- Never edit this file once shipped: add a new numbered migration instead.

CREATE INDEX jobs_created_idx ON jobsd.jobs (created_at, id);
CREATE INDEX jobs_finished_idx ON jobsd.jobs (finished_at) WHERE finished_at IS NOT NULL;
