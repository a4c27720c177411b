"""Resolve a request's bearer token to its org: the FastAPI dependencies of the API."""

# No `from __future__ import annotations` here: FastAPI reads the annotations of the
# dependencies at runtime, and `resolve` is local to the function that makes them.

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from jobsd.http.backend import ApiBackend
from jobsd.http.problems import problem, store_errors
from jobsd.ops import Act, Caller, may, tokens
from jobsd.ops.tokens import find_token

__all__ = ["API_ACTOR", "TOKEN_ID_STATE", "bearer_admin", "bearer_caller", "caller_of_org"]

# the actor recorded in job histories for changes made through the API
API_ACTOR = "api"

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


def bearer_caller(backend: ApiBackend) -> Callable[..., Awaitable[Caller]]:
    """Return a dependency that resolves the request's bearer token to its ``Caller``
    (else 401): an org's, whatever its admin flag, or an operator's (an admin token of
    no org).

    It also leaves the token's id in ``request.state`` (``TOKEN_ID_STATE``): the
    submission and read rates are limited per token.
    """
    resolve = _resolver(backend)

    async def caller_from_token(grant: Annotated[tokens.TokenGrant, Depends(resolve)]) -> Caller:
        return Caller.of_grant(grant, API_ACTOR)

    return caller_from_token


def caller_of_org(org_dependency: Callable[..., Any]) -> Callable[..., Awaitable[Caller]]:
    """Return a dependency that makes the ``Caller`` of the org a host application's
    ``org_dependency`` returns (a non-empty str)."""

    async def caller_for_org(org_id: Annotated[str, Depends(org_dependency)]) -> Caller:
        return Caller.for_org(org_id, API_ACTOR)

    return caller_for_org


def bearer_admin(backend: ApiBackend) -> Callable[..., Awaitable[str]]:
    """Return a dependency that admits only operator tokens (else 401, or 403).

    Queues are shared by every org: only an operator's token (admin, of no org)
    administers them, never a token of an org (an admin token made for an org before
    migration 0012 included). Returns the actor's name for the audit: ``token:<id>``.
    """
    resolve = _resolver(backend)

    async def admin_from_token(grant: Annotated[tokens.TokenGrant, Depends(resolve)]) -> str:
        caller = Caller.of_grant(grant, f"token:{grant.id}")
        if not may(caller, Act.ADMINISTER_QUEUES):
            raise problem(
                403,
                "admin_required",
                "this token may not administer queues: use an operator token, made by "
                "`jobsd token create --admin`",
            )
        return caller.actor

    return admin_from_token
