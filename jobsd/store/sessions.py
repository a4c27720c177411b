"""One typed function per ``ui_sessions_*`` statement of ``sql/queries/sessions.sql``.

A dashboard login is a row of ``jobsd.ui_sessions`` (migration 0026), reached only
through SECURITY DEFINER functions: the table has row-level security and no policy.
Looking a session up or ending it takes its id and its token's SHA-256; the
database's clock decides expiry. A revoked token's sessions end with it (a trigger),
and a deleted token's go with it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from jobsd.store.db import AsyncConn, db_errors
from jobsd.store.named import Row, run_named
from jobsd.store.tokens import TokenGrant

__all__ = ["UiSession", "end_session", "find_session", "start_session"]


@dataclass(frozen=True, slots=True)
class UiSession:
    """A live dashboard session: its id, what its token allows, and when it ends."""

    id: uuid.UUID
    grant: TokenGrant
    expires_at: datetime


def _grant(row: Row) -> TokenGrant:
    org_id = row["org_id"]
    return TokenGrant(row["token_id"], None if org_id is None else str(org_id), bool(row["admin"]))


async def start_session(conn: AsyncConn, token_hash: bytes, ttl_s: float) -> UiSession | None:
    """Open a session of the live token with this hash for ``ttl_s`` seconds.

    None when the token is unknown or revoked. A session made deletes the sessions that
    are over (ended, expired) in the same statement.
    """
    with db_errors("dashboard login"):
        rows = await run_named(
            conn, "ui_sessions_start", {"token_hash": token_hash, "ttl_s": ttl_s}
        )
    if not rows:
        return None
    return UiSession(rows[0]["id"], _grant(rows[0]), rows[0]["expires_at"])


async def find_session(
    conn: AsyncConn, session_id: uuid.UUID, token_hash: bytes
) -> UiSession | None:
    """Return the live session ``session_id`` of the token with this hash, or None.

    None when it ended, expired, its token was revoked, or it is another token's.
    """
    with db_errors("dashboard session lookup"):
        rows = await run_named(
            conn, "ui_sessions_lookup", {"id": session_id, "token_hash": token_hash}
        )
    if not rows:
        return None
    return UiSession(session_id, _grant(rows[0]), rows[0]["expires_at"])


async def end_session(conn: AsyncConn, session_id: uuid.UUID, token_hash: bytes) -> bool:
    """End the session ``session_id`` of the token with this hash; say whether it was live.

    Idempotent: ending an ended session changes nothing.
    """
    with db_errors("dashboard logout"):
        rows = await run_named(
            conn, "ui_sessions_end", {"id": session_id, "token_hash": token_hash}
        )
    return bool(rows and rows[0]["ended"])
