"""One typed function per ``api_tokens_*`` statement of ``sql/queries/api.sql``: bearer tokens.

Only a token's SHA-256 is ever stored or looked up; making and hashing tokens is
``jobsd.ops.tokens``'s. ``api_tokens`` has row-level security (migration 0012): a
lookup runs before the org is known, through the SECURITY DEFINER function
``jobsd.api_token_lookup``. Admin (operator) tokens belong to no org.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobsd.store.db import AsyncConn, SyncConn, db_errors
from jobsd.store.named import run_named, run_named_sync

__all__ = ["TokenGrant", "TokenInfo", "find_token", "insert_token", "list_tokens", "revoke_token"]


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """A stored token, without its secret."""

    id: uuid.UUID
    org_id: str | None
    """None for an operator (admin) token: it acts for no org."""
    name: str | None
    prefix: str
    created_at: datetime
    revoked_at: datetime | None
    admin: bool = False
    """The token may administer queues (every queue); an operator's only when of no org."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TokenInfo:
        """Build from a row of ``api_tokens``."""
        return cls(**{k: row[k] for k in cls.__slots__})


@dataclass(frozen=True, slots=True)
class TokenGrant:
    """What a valid token allows: acting for ``org_id``, or (admin, no org) on queues."""

    id: uuid.UUID
    org_id: str | None
    admin: bool

    @property
    def operator(self) -> bool:
        """Say whether the token is an operator's: admin, and of no org."""
        return self.admin and self.org_id is None


async def find_token(conn: AsyncConn, token_hash: bytes) -> TokenGrant | None:
    """Return what a valid (not revoked) token allows, or None."""
    with db_errors("token lookup"):
        rows = await run_named(conn, "api_tokens_lookup", {"token_hash": token_hash})
    if not rows:
        return None
    org_id = rows[0]["org_id"]
    org = None if org_id is None else str(org_id)
    return TokenGrant(rows[0]["id"], org, bool(rows[0]["admin"]))


def insert_token(
    conn: SyncConn,
    *,
    org_id: str | None,
    name: str | None,
    prefix: str,
    token_hash: bytes,
    admin: bool,
) -> TokenInfo:
    """Store a token's hash for ``org_id`` (None: an operator token); return its record."""
    params = {
        "org_id": org_id,
        "name": name,
        "prefix": prefix,
        "token_hash": token_hash,
        "admin": admin,
    }
    what = f"for org {org_id!r}" if org_id is not None else "for operators"
    with db_errors(f"creation of a token {what}"):
        rows = run_named_sync(conn, "api_tokens_insert", params)
    return TokenInfo.from_row(rows[0])


def revoke_token(
    conn: SyncConn, *, token_id: uuid.UUID | None, token_hash: bytes | None
) -> TokenInfo | None:
    """Revoke the token with this id or this hash; None when there is no such token."""
    with db_errors("token revocation"):
        rows = run_named_sync(conn, "api_tokens_revoke", {"id": token_id, "token_hash": token_hash})
    return TokenInfo.from_row(rows[0]) if rows else None


def list_tokens(conn: SyncConn, org_id: str | None = None) -> list[TokenInfo]:
    """List tokens (all orgs, or one), revoked ones included."""
    with db_errors("token listing"):
        rows = run_named_sync(conn, "api_tokens_list", {"org_id": org_id})
    return [TokenInfo.from_row(r) for r in rows]
