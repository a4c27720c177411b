"""Resolve a request's bearer token to its org: the FastAPI dependencies of the API."""

# No `from __future__ import annotations` here: FastAPI reads the annotations of the
# dependencies at runtime, and `resolve` is local to the function that makes them.

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from jobsd.http import tokens
from jobsd.http.backend import ApiBackend
from jobsd.http.problems import problem, store_errors
from jobsd.store.tokens import find_token

__all__ = ["TOKEN_ID_STATE", "bearer_admin", "bearer_org"]

# request.state attribute holding the id of the request's token (the rate-limit key)
TOKEN_ID_STATE = "jobsd_token_id"

_scheme = HTTPBearer(
    auto_error=False,
    description="A token made by `jobsd token create --org ORG`; it decides the org.",
)


def _unauthorized(message: str) -> Exception:
    return problem(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})


def _resolver(backend: ApiBackend) -> Callable[..., Awaitable[tokens.TokenGrant]]:
    """Return a dependency that resolves the request's bearer token (else 401)."""

    async def grant_from_token(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_scheme)],
    ) -> tokens.TokenGrant:
        if credentials is None:
            raise _unauthorized("missing bearer token (Authorization: Bearer <token>)")
        token = credentials.credentials
        if not tokens.looks_like_token(token):
            raise _unauthorized("invalid bearer token")
        digest = tokens.hash_token(token)
        with store_errors("token lookup"):
            # one lookup per token and second, however many requests carry it
            found: tokens.TokenGrant | None = await backend.grants.get(
                digest.hex(), lambda: backend.read("token lookup", find_token, digest)
            )
        if found is None:
            raise _unauthorized("invalid bearer token")
        setattr(request.state, TOKEN_ID_STATE, found.id)
        return found

    return grant_from_token


def bearer_org(backend: ApiBackend) -> Callable[..., Awaitable[str]]:
    """Return a dependency that resolves the request's bearer token to its org id (else 401).

    It also leaves the token's id in ``request.state`` (``TOKEN_ID_STATE``): the
    submission rate is limited per token.
    """
    resolve = _resolver(backend)

    async def org_from_token(grant: Annotated[tokens.TokenGrant, Depends(resolve)]) -> str:
        if grant.org_id is None:
            raise problem(
                403,
                "org_required",
                "an operator token acts for no org: use a token made by "
                "`jobsd token create --org ORG` for jobs",
            )
        return grant.org_id

    return org_from_token


def bearer_admin(backend: ApiBackend) -> Callable[..., Awaitable[str]]:
    """Return a dependency that admits only operator tokens (else 401, or 403).

    Queues are shared by every org: only an operator's token (admin, of no org)
    administers them, never a token of an org (an admin token made for an org before
    migration 0012 included). Returns the actor's name for the audit: ``token:<id>``.
    """
    resolve = _resolver(backend)

    async def admin_from_token(grant: Annotated[tokens.TokenGrant, Depends(resolve)]) -> str:
        if not grant.operator:
            raise problem(
                403,
                "admin_required",
                "this token may not administer queues: use an operator token, made by "
                "`jobsd token create --admin`",
            )
        return f"token:{grant.id}"

    return admin_from_token
