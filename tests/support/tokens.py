"""API tokens stored straight into jobsd.api_tokens, as any version of jobsd could have
stored them (an org's token made ``--admin`` included, which ``create_token`` refuses)."""

from __future__ import annotations

import psycopg

from jobsd.ops.tokens import hash_token, new_token

__all__ = ["stored_token"]


def stored_token(db_url: str, org_id: str | None, *, admin: bool = False) -> str:
    """Store a new token of ``org_id`` (None: an operator's) and return it."""
    token = new_token()
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobsd.api_tokens (org_id, name, prefix, token_hash, admin) "
            "VALUES (%s, 'tests', %s, %s, %s)",
            (org_id, token[:12], hash_token(token), admin),
        )
    return token
