"""Turn jobsd errors into HTTP answers, and declare those answers in the OpenAPI schema.

Every router names its operations with ``endpoint_name``: an operation's id is its
endpoint's name.

Errors are raised as ``HTTPException`` (body ``{"detail": {"code", "message"}}``) or,
for a bad field, as ``RequestValidationError`` (FastAPI's own 422 shape, pointing at
the field). Both are handled by every FastAPI app, so the router behaves the same
inside a host application.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import HTTPException, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from jobsd.errors import (
    BackendUnavailable,
    CancelRefused,
    DatabaseError,
    Forbidden,
    JobNotFound,
    OrgQuotaExceeded,
    OutcomeUnknown,
    QueueFull,
    ResolveRefused,
    RetryRefused,
    UnknownQueue,
    UnknownSchedule,
)
from jobsd.http.schemas import ErrorOut

__all__ = [
    "QUEUE_FULL_RETRY_S",
    "RETRY_AFTER_S",
    "AsciiJSONResponse",
    "database_error",
    "db_unavailable",
    "endpoint_name",
    "field_error",
    "http_error_handler",
    "new_correlation_id",
    "problem",
    "rate_limited",
    "refusal",
    "refused",
    "responses",
    "store_errors",
    "validation_error_handler",
]

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1
# a full queue drains at the pace of its jobs: a second is too eager
QUEUE_FULL_RETRY_S = 5

_DESCRIPTIONS = {
    401: "Missing, unknown or revoked bearer token.",
    404: "No such job in this org (a job of another org is not found either).",
    409: "The request conflicts with the job's state.",
    413: "The request body or the payload is larger than the configured cap.",
    429: "Over the token's submission rate (code rate_limited), or the queue holds its "
    "capacity of open jobs (code queue_full): nothing was written; retry after "
    "Retry-After seconds.",
    503: "The database is unavailable: nothing was done (or, with code outcome_unknown, "
    "retry with the same id).",
}


# Every refusal of jobsd.ops as an HTTP answer, the one table: the first row whose
# type matches (a subclass before its base) gives the status and the code. The API
# answers with it, the dashboard shows its status on an error page.
_REFUSALS: tuple[tuple[type[Exception], int, Any], ...] = (
    (JobNotFound, 404, "job_not_found"),
    (UnknownQueue, 404, "queue_not_found"),
    (UnknownSchedule, 404, "schedule_not_found"),
    (Forbidden, 403, "admin_required"),
    (CancelRefused, 409, lambda e: f"job_{e.why}"),
    (RetryRefused, 409, lambda e: f"job_{e.why}"),
    (ResolveRefused, 409, "job_not_recovery_required"),
    (OrgQuotaExceeded, 429, "org_quota"),
    (QueueFull, 429, "queue_full"),
)


def refusal(exc: Exception) -> tuple[int, str] | None:
    """Return the HTTP status and code of an operation's refusal, or None when ``exc``
    is not one."""
    for kind, status, code in _REFUSALS:
        if isinstance(exc, kind):
            return status, code(exc) if callable(code) else code
    return None


def refused(exc: Exception) -> HTTPException:
    """Answer an operation's refusal (``refusal``); a full queue or org quota carries
    Retry-After. Anything else is a bug: re-raise it."""
    found = refusal(exc)
    if found is None:
        raise exc
    status, code = found
    headers = {"Retry-After": str(QUEUE_FULL_RETRY_S)} if status == 429 else None
    message = f"queue {exc.queue!r} not found" if isinstance(exc, UnknownQueue) else str(exc)
    return problem(status, code, message, headers=headers)


def endpoint_name(route: APIRoute) -> str:
    """Return the id of a route's operation: its endpoint's name (``list_jobs``)."""
    return route.name


def responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """Declare error answers for a route's OpenAPI entry."""
    declared: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        declared[code] = {"model": ErrorOut, "description": _DESCRIPTIONS[code]}
        if code == 429:
            declared[code]["headers"] = {
                "Retry-After": {
                    "description": "Seconds until a submission will be accepted again.",
                    "schema": {"type": "integer", "minimum": 1},
                }
            }
    return declared


def problem(
    status: int,
    code: str,
    message: str,
    *,
    job_id: uuid.UUID | None = None,
    headers: dict[str, str] | None = None,
    correlation_id: str | None = None,
) -> HTTPException:
    """Build an error answer; it carries a correlation id (the log's, when one was written)."""
    detail: dict[str, Any] = {
        "code": code,
        "message": message,
        "correlation_id": correlation_id or new_correlation_id(),
    }
    if job_id is not None:
        detail["job_id"] = str(job_id)
    return HTTPException(status_code=status, detail=detail, headers=headers)


def new_correlation_id() -> str:
    """Return a fresh id that ties an error answer to its log line."""
    return uuid.uuid4().hex


def rate_limited(rate: str, retry_after_s: int) -> HTTPException:
    """Answer 429: the token is over its submission rate."""
    return HTTPException(
        status_code=429,
        detail={
            "code": "rate_limited",
            "message": f"too many submissions with this token (limit {rate}): "
            f"retry in {retry_after_s} s",
            "retry_after_s": retry_after_s,
            "correlation_id": new_correlation_id(),
        },
        headers={"Retry-After": str(retry_after_s)},
    )


def field_error(loc: tuple[str, ...], message: str, code: str, value: Any = None) -> Exception:
    """Build a 422 pointing at one field, in FastAPI's validation-error shape."""
    return RequestValidationError([{"loc": loc, "msg": message, "type": code, "input": value}])


def db_unavailable(exc: BackendUnavailable, *, job_id: uuid.UUID | None = None) -> HTTPException:
    """Answer 503; ``outcome_unknown`` when a submission may or may not have committed.

    The database's own text (host, port, role, DETAIL) never reaches the client: it is
    logged under the answer's correlation id.
    """
    headers = {"Retry-After": str(RETRY_AFTER_S)}
    cid = new_correlation_id()
    log.warning(
        "api.database_unavailable",
        extra={"correlation_id": cid, "job_id": job_id, "error": str(exc)},
    )
    if isinstance(exc, OutcomeUnknown):
        return problem(
            503,
            "outcome_unknown",
            "the database connection dropped during the commit: retry with the same id",
            job_id=job_id,
            headers=headers,
            correlation_id=cid,
        )
    return problem(
        503,
        "database_unavailable",
        "the database is unavailable: nothing was done; retry in a moment",
        headers=headers,
        correlation_id=cid,
    )


@contextmanager
def store_errors(operation: str) -> Iterator[None]:
    """Answer 503 for database errors raised inside the block."""
    try:
        yield
    except BackendUnavailable as exc:
        raise db_unavailable(exc) from exc
    except DatabaseError as exc:
        raise database_error(exc, operation) from exc


def database_error(exc: DatabaseError, operation: str | None = None) -> HTTPException:
    """Answer 503 for a database error that is not a lost connection (e.g. a timeout).

    The client gets the code, a human message and the correlation id; the database's
    message goes to the log under that id, never into the answer.
    """
    cid = new_correlation_id()
    log.error(
        "api.database_error",
        extra={"correlation_id": cid, "operation": operation, "error": str(exc)},
        exc_info=exc,
    )
    return problem(
        503,
        "database_error",
        f"the database could not do this (correlation id {cid} in the server log)",
        headers={"Retry-After": str(RETRY_AFTER_S)},
        correlation_id=cid,
    )


class AsciiJSONResponse(JSONResponse):
    """JSON with non-ASCII escaped: a lone surrogate echoed from the input stays encodable."""

    def render(self, content: Any) -> bytes:
        """Serialize ``content`` as ASCII JSON."""
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


async def validation_error_handler(request: Request, exc: Exception) -> Response:
    """Answer 422 like FastAPI does, but never fail on input that cannot be encoded as UTF-8."""
    assert isinstance(exc, RequestValidationError)
    return AsciiJSONResponse({"detail": _encodable_errors(exc.errors())}, status_code=422)


def _encodable_errors(errors: Any) -> Any:
    """Encode validation errors whatever input they quote: bytes that are not UTF-8 (a
    raw body under a non-JSON type) are decoded with replacement characters, and an
    input nothing can encode is left out rather than failing the answer."""

    def clean(value: Any) -> Any:
        if isinstance(value, bytes | bytearray):
            return bytes(value[:1024]).decode("utf-8", "replace")
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        return value

    try:
        return jsonable_encoder(clean(list(errors)))
    except (ValueError, TypeError, RecursionError):
        return [
            {k: str(v)[:1024] for k, v in error.items() if k != "input"}
            for error in errors
            if isinstance(error, dict)
        ]


async def http_error_handler(request: Request, exc: Exception) -> Response:
    """Answer HTTP errors like FastAPI does, except a body that is not JSON text at all.

    FastAPI answers 400 when the body cannot even be decoded (e.g. not UTF-8) but 422
    when it is malformed JSON; both are malformed JSON to a client, so both are 422.
    """
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400 and isinstance(exc.__cause__, ValueError | RecursionError):
        error = {
            "type": "json_invalid",
            "loc": ["body"],
            "msg": "JSON decode error",
            "input": {},
            "ctx": {"error": str(exc.__cause__)[:200]},
        }
        return AsciiJSONResponse({"detail": [error]}, status_code=422)
    return await http_exception_handler(request, exc)
