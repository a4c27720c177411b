-- The dashboard's sessions (migration 0026_ui_sessions): jobsd.ui_sessions has
-- row-level security and no policy, so every statement goes through a SECURITY
-- DEFINER function, which the API's roles may run and nobody else.

-- name: ui_sessions_start
-- A login: a session of the live token with this hash (no row: unknown or revoked),
-- ending ttl_s seconds from now; a session made prunes those that are over.
SELECT id, token_id, org_id, admin, expires_at
FROM jobsd.ui_session_start(%(token_hash)s::bytea, %(ttl_s)s::double precision);

-- name: ui_sessions_lookup
-- Every request: the token of a live session of that token (no row: ended, expired,
-- revoked, unknown, or another token's).
SELECT token_id, org_id, admin, expires_at
FROM jobsd.ui_session_lookup(%(id)s::uuid, %(token_hash)s::bytea);

-- name: ui_sessions_end
-- A logout. Ending an ended session changes nothing.
SELECT jobsd.ui_session_end(%(id)s::uuid, %(token_hash)s::bytea) AS ended;
