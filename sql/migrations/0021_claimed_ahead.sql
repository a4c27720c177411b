-- jobsd schema, version 21: a job claimed ahead that its daemon never started is not
-- charged a run when the daemon dies (docs/decisions.md, "Claiming ahead").
--
-- jobs.claimed_ahead is true from a claim that took the job ahead of the daemon's free
-- slots and of the jobs it arms at once (jobs_claim_batch: the rows beyond
-- `free` + `armed`) until the daemon arms it (jobs_arm_claimed_ahead), which it does
-- before the job's handler starts, a batch at a time; every other claim, every outcome
-- and every rescue clears it. So a job marked claimed_ahead has not started. The sweep
-- of a dead or silent owner sends such a job back to `queued` with reason
-- `not started`, as a stop gives it back, instead of charging it the run it never had
-- (with one attempt, the default, it used to fail `max attempts exceeded` unrun); its
-- claim stays counted in `attempts`, and no limit of attempts applies to it.
--
-- Not indexed: setting or clearing it alone is a HOT update.
--
-- Never edit this file once shipped: add a new numbered migration instead.

ALTER TABLE jobsd.jobs ADD COLUMN claimed_ahead boolean;
