-- jobsd schema, version 2: what the HTTP API needs.
--
-- * jobsd.api_tokens: bearer tokens, one or more per org. Only a SHA-256 of each
--   token is stored; the token itself is shown once, by `jobsd token create`.
--   Tokens are 256-bit random strings, so a fast hash is enough (no password
--   stretching is needed against brute force).
-- * jobs_org_created_idx: the org's jobs newest first, for the keyset-paginated
--   list endpoint (read backwards).
-- * a NOTIFY on channel 'jobsd_done' with the job id when a job reaches a terminal
--   state, so `GET /jobs/{id}?wait=S` is woken by the database, not by polling.
--
-- Never edit this file once shipped: add a new numbered migration instead.

CREATE TABLE jobsd.api_tokens (
  id          uuid PRIMARY KEY DEFAULT jobsd.uuidv7(),
  org_id      text NOT NULL CHECK (org_id <> ''),
  name        text,
  -- the first characters of the token, to recognise it in listings
  prefix      text NOT NULL,
  token_hash  bytea NOT NULL UNIQUE CHECK (octet_length(token_hash) = 32),
  created_at  timestamptz NOT NULL DEFAULT now(),
  revoked_at  timestamptz
);

CREATE INDEX api_tokens_org_idx ON jobsd.api_tokens (org_id, created_at);

CREATE INDEX jobs_org_created_idx ON jobsd.jobs (org_id, created_at, id);

-- One notification per job that becomes terminal; the payload is the job id. The
-- WHEN clause is evaluated without calling the function, so other updates of
-- status (claims, requeues) cost nothing. A batch of outcomes written in one
-- statement commits once: the notifications share that commit.
CREATE FUNCTION jobsd.notify_done() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('jobsd_done', NEW.id::text);
  RETURN NULL;
END
$$;

CREATE TRIGGER jobs_notify_done AFTER UPDATE OF status ON jobsd.jobs
  FOR EACH ROW
  WHEN (NEW.status IN ('succeeded', 'failed', 'cancelled')
        AND OLD.status IS DISTINCT FROM NEW.status)
  EXECUTE FUNCTION jobsd.notify_done();
