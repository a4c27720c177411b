"""Keep /metrics and /health (operators' figures) behind a token.

They show the queues, the registered job types and the health of the database: an
operator's view, not a tenant's. With ``JOBSD_PROBE_TOKEN`` set they answer only to
``Authorization: Bearer <that token>`` (compared in constant time; no database
lookup, so they work while the database is away). With no token they answer 403
``probe_token_required``, unless ``JOBSD_ALLOW_INSECURE=1`` (development, the test
suite). The orchestrator's probes /healthz and /readyz say only "ok" or not and stay
open.
"""

from __future__ import annotations

import hmac

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from jobsd.http.problems import new_correlation_id
from jobsd.store.tls import allow_insecure

__all__ = ["GUARDED_PATHS", "ProbeGuard"]

GUARDED_PATHS = frozenset({"/metrics", "/health"})


class ProbeGuard:
    """ASGI middleware: admit /metrics and /health only with the probe token."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token.encode("utf-8") if token else None
        self.open = self.token is None and allow_insecure()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.open or scope.get("path") not in GUARDED_PATHS:
            await self.app(scope, receive, send)
            return
        if self.token is None:
            await _refuse(
                scope,
                receive,
                send,
                403,
                "probe_token_required",
                "/metrics and /health need JOBSD_PROBE_TOKEN set on the server "
                "(then Authorization: Bearer <it>)",
            )
            return
        given = b""
        for name, value in scope.get("headers", []):
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                given = value[7:].strip()
        if not hmac.compare_digest(given, self.token):
            await _refuse(scope, receive, send, 401, "unauthorized", "missing or wrong probe token")
            return
        await self.app(scope, receive, send)


async def _refuse(
    scope: Scope, receive: Receive, send: Send, status: int, code: str, message: str
) -> None:
    detail = {"code": code, "message": message, "correlation_id": new_correlation_id()}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    await JSONResponse({"detail": detail}, status_code=status, headers=headers)(
        scope, receive, send
    )
