"""Bearer tokens of the HTTP API: make, hash, store, look up, list and revoke them.

A token is ``jobsd_`` followed by 43 characters of base64url (256 random bits). Only
its SHA-256 is stored, so a database dump gives no usable token; with that much
entropy a fast hash is safe, there is nothing to stretch. The token itself is shown
once, when it is made. This module does not import FastAPI: the CLI uses it.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from jobsd.store.db import db_errors
from jobsd.store.queries import run_named, run_named_sync

__all__ = [
    "TOKEN_PREFIX",
    "TokenGrant",
    "TokenInfo",
    "create_token",
    "find_token",
    "hash_token",
    "list_tokens",
    "looks_like_token",
    "lookup_token",
    "new_token",
    "revoke_token",
]

TOKEN_PREFIX = "jobsd_"
_TOKEN_LEN = len(TOKEN_PREFIX) + 43
# how much of a token listings show: enough to recognise it, useless to an attacker
_SHOWN_LEN = len(TOKEN_PREFIX) + 6


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """A stored token, without its secret."""

    id: uuid.UUID
    org_id: str
    name: str | None
    prefix: str
    created_at: datetime
    revoked_at: datetime | None
    admin: bool = False
    """The token may also administer queues (every queue, whatever its org)."""

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> TokenInfo:
        """Build from a row of ``api_tokens``."""
        return cls(**{k: row[k] for k in cls.__slots__})


@dataclass(frozen=True, slots=True)
class TokenGrant:
    """What a valid token allows: acting for ``org_id``, and with ``admin`` on queues."""

    id: uuid.UUID
    org_id: str
    admin: bool


def new_token() -> str:
    """Return a fresh random token."""
    raw = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode("ascii")
    return TOKEN_PREFIX + raw


def hash_token(token: str) -> bytes:
    """Return the SHA-256 of a token, as stored."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def looks_like_token(text: str) -> bool:
    """Say whether ``text`` has the shape of a token (junk is refused without a query)."""
    return len(text) == _TOKEN_LEN and text.startswith(TOKEN_PREFIX) and text.isascii()


async def find_token(conn: psycopg.AsyncConnection[Any], token_hash: bytes) -> TokenGrant | None:
    """Return what a valid (not revoked) token allows, or None.

    Runs before the org is known: ``api_tokens`` has no row-level security.
    """
    with db_errors("token lookup"):
        rows = await run_named(conn, "api_tokens_lookup", {"token_hash": token_hash})
    if not rows:
        return None
    return TokenGrant(rows[0]["id"], str(rows[0]["org_id"]), bool(rows[0]["admin"]))


async def lookup_token(
    conn: psycopg.AsyncConnection[Any], token_hash: bytes
) -> tuple[uuid.UUID, str] | None:
    """Return the id and the org of a valid (not revoked) token, or None (see ``find_token``)."""
    grant = await find_token(conn, token_hash)
    return (grant.id, grant.org_id) if grant else None


def create_token(
    conn: psycopg.Connection[Any], org_id: str, name: str | None = None, *, admin: bool = False
) -> tuple[str, TokenInfo]:
    """Store a new token for ``org_id``; return the token (shown once) and its record.

    With ``admin`` the token may also administer queues through the API.
    """
    if not org_id:
        raise ValueError("org must be a non-empty string")
    token = new_token()
    params = {
        "org_id": org_id,
        "name": name,
        "prefix": token[:_SHOWN_LEN],
        "token_hash": hash_token(token),
        "admin": admin,
    }
    with db_errors(f"creation of a token for org {org_id!r}"):
        rows = run_named_sync(conn, "api_tokens_insert", params)
    return token, TokenInfo.from_row(rows[0])


def revoke_token(conn: psycopg.Connection[Any], id_or_token: str) -> TokenInfo | None:
    """Revoke a token given by its id or by the token itself; None when there is no such token."""
    token_id: uuid.UUID | None = None
    token_hash: bytes | None = None
    if looks_like_token(id_or_token):
        token_hash = hash_token(id_or_token)
    else:
        try:
            token_id = uuid.UUID(id_or_token)
        except ValueError:
            return None
    with db_errors("token revocation"):
        rows = run_named_sync(conn, "api_tokens_revoke", {"id": token_id, "token_hash": token_hash})
    return TokenInfo.from_row(rows[0]) if rows else None


def list_tokens(conn: psycopg.Connection[Any], org_id: str | None = None) -> list[TokenInfo]:
    """List tokens (all orgs, or one), revoked ones included."""
    with db_errors("token listing"):
        rows = run_named_sync(conn, "api_tokens_list", {"org_id": org_id})
    return [TokenInfo.from_row(r) for r in rows]
