"""Resolve a request's bearer token to its org: the FastAPI dependency of the API."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from jobsd.http import tokens
from jobsd.http.backend import ApiBackend
from jobsd.http.problems import problem, store_errors

__all__ = ["bearer_org"]

_scheme = HTTPBearer(
    auto_error=False,
    description="A token made by `jobsd token create --org ORG`; it decides the org.",
)


def _unauthorized(message: str) -> Exception:
    return problem(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})


def bearer_org(backend: ApiBackend) -> Callable[..., Awaitable[str]]:
    """Return a dependency that resolves the request's bearer token to its org id (else 401)."""

    async def org_from_token(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_scheme)],
    ) -> str:
        if credentials is None:
            raise _unauthorized("missing bearer token (Authorization: Bearer <token>)")
        token = credentials.credentials
        if not tokens.looks_like_token(token):
            raise _unauthorized("invalid bearer token")
        with store_errors("token lookup"):
            org_id = await backend.read("token lookup", tokens.token_org, tokens.hash_token(token))
        if org_id is None:
            raise _unauthorized("invalid bearer token")
        return org_id

    return org_from_token
