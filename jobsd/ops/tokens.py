"""Bearer tokens of the HTTP API: make, hash, store, list and revoke them; an operator's.

A token is ``jobsd_`` followed by 43 characters of base64url (256 random bits). Only
its SHA-256 is stored (``jobsd.store.tokens``), so a database dump gives no usable
token; with that much entropy a fast hash is safe, there is nothing to stretch. The
token itself is shown once, when it is made. This module does not import FastAPI:
the CLI uses it. Making, listing and revoking tokens takes an operator
(``Act.MANAGE_TOKENS``); a token's lookup (``find_token``) is every request's, and a
dashboard login exchanges a token for a session the database keeps (``start_session``,
``find_session``, ``end_session``).
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import uuid

from jobsd.ops.authority import Act, require
from jobsd.ops.caller import Caller
from jobsd.store import tokens as store
from jobsd.store.db import SyncConn
from jobsd.store.sessions import UiSession, end_session, find_session, start_session
from jobsd.store.tokens import TokenGrant, TokenInfo, find_token

__all__ = [
    "TOKEN_PREFIX",
    "TokenGrant",
    "TokenInfo",
    "UiSession",
    "create_token",
    "end_session",
    "find_session",
    "find_token",
    "hash_token",
    "list_tokens",
    "looks_like_token",
    "new_token",
    "revoke_token",
    "start_session",
]

TOKEN_PREFIX = "jobsd_"
_TOKEN_LEN = len(TOKEN_PREFIX) + 43
# how much of a token listings show: enough to recognise it, useless to an attacker
_SHOWN_LEN = len(TOKEN_PREFIX) + 6


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


def create_token(
    conn: SyncConn,
    caller: Caller,
    org_id: str | None,
    name: str | None = None,
    *,
    admin: bool = False,
) -> tuple[str, TokenInfo]:
    """Store a new token for ``org_id``; return the token (shown once) and its record.

    With ``admin`` (and no org) it is an operator's token: it administers queues through
    the API and acts for no org. A tenant's token is never an admin one.
    """
    require(caller, Act.MANAGE_TOKENS)
    if admin and org_id is not None:
        raise ValueError("an admin token belongs to no org: leave the org out")
    if not admin and not org_id:
        raise ValueError("org must be a non-empty string")
    token = new_token()
    info = store.insert_token(
        conn,
        org_id=org_id,
        name=name,
        prefix=token[:_SHOWN_LEN],
        token_hash=hash_token(token),
        admin=admin,
    )
    return token, info


def revoke_token(conn: SyncConn, caller: Caller, id_or_token: str) -> TokenInfo | None:
    """Revoke a token given by its id or by the token itself; None when there is no such token."""
    require(caller, Act.MANAGE_TOKENS)
    if looks_like_token(id_or_token):
        return store.revoke_token(conn, token_id=None, token_hash=hash_token(id_or_token))
    try:
        token_id = uuid.UUID(id_or_token)
    except ValueError:
        return None
    return store.revoke_token(conn, token_id=token_id, token_hash=None)


def list_tokens(conn: SyncConn, caller: Caller, org_id: str | None = None) -> list[TokenInfo]:
    """List tokens (all orgs, or one), revoked ones included."""
    require(caller, Act.MANAGE_TOKENS)
    return store.list_tokens(conn, org_id)
