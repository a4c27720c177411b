-- jobsd schema, version 26: dashboard sessions that end on the server.
--
-- * jobsd.ui_sessions: one row per dashboard login. The session cookie carries the
--   row's id (random, signed with the dashboard's key) and the token's SHA-256;
--   every request asks whether the row is live: not ended, not expired, and its
--   token not revoked. So logging out, revoking the token (`jobsd token revoke`) and
--   expiry end a session at once, whoever holds a copy of the cookie.
-- * Row-level security and no policy: only the owner reads or writes the table.
--   The API's roles go through three SECURITY DEFINER functions (fixed search_path,
--   pg_temp last; every object named with its schema; no EXECUTE for PUBLIC):
--   jobsd.ui_session_start(token hash, ttl) opens a session for a live token and
--   deletes the sessions that are over; jobsd.ui_session_lookup(id, token hash) and
--   jobsd.ui_session_end(id, token hash) need both the id and the token's hash, so
--   a session id alone opens nothing. "Now" is the database's clock, never a
--   parameter: a caller cannot revive an expired session.
-- * Revoking a token ends its sessions (a trigger sets ended_at); deleting a token
--   deletes them. The lookup checks revoked_at as well.
-- * The roles that may look a token up (EXECUTE on jobsd.api_token_lookup) may run
--   the three functions from now on, so an upgrade needs no `jobsd roles create`
--   for the dashboard to keep working.
--
-- Never edit this file once shipped: add a new numbered migration instead.

CREATE TABLE jobsd.ui_sessions (
  id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  token_id    uuid NOT NULL REFERENCES jobsd.api_tokens (id) ON DELETE CASCADE,
  created_at  timestamptz NOT NULL DEFAULT now(),
  expires_at  timestamptz NOT NULL,
  ended_at    timestamptz,
  CONSTRAINT ui_sessions_expire_later CHECK (expires_at > created_at)
);

CREATE INDEX ui_sessions_token_idx ON jobsd.ui_sessions (token_id);

ALTER TABLE jobsd.ui_sessions ENABLE ROW LEVEL SECURITY;

-- A login: a session for the live token with this hash, lasting p_ttl_s seconds;
-- no row when the token is unknown or revoked. A login that opens a session also
-- deletes the sessions that are over (ended, expired): the table holds the live
-- ones and those ended since the last login.
CREATE FUNCTION jobsd.ui_session_start(p_token_hash bytea, p_ttl_s double precision)
RETURNS TABLE (id uuid, token_id uuid, org_id text, admin boolean, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  WITH token AS (
    SELECT t.id, t.org_id, t.admin FROM jobsd.api_tokens AS t
    WHERE t.token_hash = p_token_hash AND t.revoked_at IS NULL
  ), made AS (
    INSERT INTO jobsd.ui_sessions AS n (token_id, expires_at)
    SELECT token.id, now() + make_interval(secs => p_ttl_s) FROM token
    RETURNING n.id, n.token_id, n.expires_at
  )
  SELECT made.id, made.token_id, token.org_id, token.admin, made.expires_at
  FROM made JOIN token ON token.id = made.token_id;
  IF FOUND THEN
    DELETE FROM jobsd.ui_sessions AS s
    WHERE s.ended_at IS NOT NULL OR s.expires_at <= now();
  END IF;
END
$$;
REVOKE ALL ON FUNCTION jobsd.ui_session_start(bytea, double precision) FROM PUBLIC;

-- Every request: the session's token, when the session is live and of that token.
CREATE FUNCTION jobsd.ui_session_lookup(p_id uuid, p_token_hash bytea)
RETURNS TABLE (token_id uuid, org_id text, admin boolean, expires_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
  SELECT t.id, t.org_id, t.admin, s.expires_at
  FROM jobsd.ui_sessions AS s
  JOIN jobsd.api_tokens AS t ON t.id = s.token_id
  WHERE s.id = p_id AND t.token_hash = p_token_hash
    AND s.ended_at IS NULL AND s.expires_at > now() AND t.revoked_at IS NULL
$$;
REVOKE ALL ON FUNCTION jobsd.ui_session_lookup(uuid, bytea) FROM PUBLIC;

-- A logout: end the session (of that token). True when it was live until now.
CREATE FUNCTION jobsd.ui_session_end(p_id uuid, p_token_hash bytea)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
  WITH ended AS (
    UPDATE jobsd.ui_sessions AS s SET ended_at = now()
    FROM jobsd.api_tokens AS t
    WHERE s.id = p_id AND t.id = s.token_id AND t.token_hash = p_token_hash
      AND s.ended_at IS NULL
    RETURNING s.id
  )
  SELECT count(*) > 0 FROM ended
$$;
REVOKE ALL ON FUNCTION jobsd.ui_session_end(uuid, bytea) FROM PUBLIC;

-- A revoked token's sessions end with it, whoever revokes it and however.
CREATE FUNCTION jobsd.ui_sessions_end_revoked() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, jobsd, pg_temp
AS $$
BEGIN
  UPDATE jobsd.ui_sessions SET ended_at = now()
  WHERE token_id = NEW.id AND ended_at IS NULL;
  RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION jobsd.ui_sessions_end_revoked() FROM PUBLIC;

CREATE TRIGGER api_tokens_end_ui_sessions AFTER UPDATE OF revoked_at ON jobsd.api_tokens
  FOR EACH ROW WHEN (OLD.revoked_at IS NULL AND NEW.revoked_at IS NOT NULL)
  EXECUTE FUNCTION jobsd.ui_sessions_end_revoked();

-- The roles that look tokens up (`jobsd roles create` grants it to the API's, the
-- enqueue and the read roles) may keep the dashboard working before the next
-- `jobsd roles create`, which grants the same.
DO $$
DECLARE
  grantee regrole;
BEGIN
  FOR grantee IN
    SELECT DISTINCT a.grantee::regrole
    FROM pg_catalog.pg_proc AS p, pg_catalog.aclexplode(p.proacl) AS a
    WHERE p.oid = 'jobsd.api_token_lookup(bytea)'::regprocedure
      AND a.privilege_type = 'EXECUTE'
      AND a.grantee <> 0
      AND a.grantee <> p.proowner
  LOOP
    -- regrole's text is the role's name, quoted as an identifier when it must be
    EXECUTE format('GRANT EXECUTE ON FUNCTION jobsd.ui_session_start(bytea, double precision), '
                   'jobsd.ui_session_lookup(uuid, bytea), jobsd.ui_session_end(uuid, bytea) '
                   'TO %s', grantee);
  END LOOP;
END
$$;
