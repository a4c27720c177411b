"""Resolve a request's bearer token to its org: the FastAPI dependency of the API."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from jobsd.http import tokens
from jobsd.http.backend import ApiBackend
from jobsd.http.problems import problem, store_errors

__all__ = ["TOKEN_ID_STATE", "bearer_org"]

# request.state attribute holding the id of the request's token (the rate-limit key)
TOKEN_ID_STATE = "jobsd_token_id"

_scheme = HTTPBearer(
    auto_error=False,
    description="A token made by `jobsd token create --org ORG`; it decides the org.",
)


def _unauthorized(message: str) -> Exception:
    return problem(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})


def bearer_org(backend: ApiBackend) -> Callable[..., Awaitable[str]]:
    """Return a dependency that resolves the request's bearer token to its org id (else 401).

    It also leaves the token's id in ``request.state`` (``TOKEN_ID_STATE``): the
    submission rate is limited per token.
    """

    async def org_from_token(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_scheme)],
    ) -> str:
        if credentials is None:
            raise _unauthorized("missing bearer token (Authorization: Bearer <token>)")
        token = credentials.credentials
        if not tokens.looks_like_token(token):
            raise _unauthorized("invalid bearer token")
        with store_errors("token lookup"):
            found = await backend.read(
                "token lookup", tokens.lookup_token, tokens.hash_token(token)
            )
        if found is None:
            raise _unauthorized("invalid bearer token")
        token_id, org_id = found
        setattr(request.state, TOKEN_ID_STATE, token_id)
        return org_id

    return org_from_token
