"""Refuse request bodies over a cap with 413, before they are read into memory.

A declared ``Content-Length`` over the cap is refused at once; a streamed body is
counted as it arrives. The error is an ``HTTPException``, which FastAPI lets through
its body parsing, so the answer has the API's usual JSON shape.
"""

from __future__ import annotations

from fastapi import HTTPException
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["BodyLimitMiddleware", "BodyTooLarge"]


class BodyTooLarge(HTTPException):
    """The request body is larger than the cap."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            status_code=413,
            detail={
                "code": "body_too_large",
                "message": f"request body over the limit of {limit} bytes",
            },
        )


class BodyLimitMiddleware:
    """ASGI middleware: cap request bodies at ``max_body_bytes``."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_body_bytes
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            error = BodyTooLarge(limit)
            response = JSONResponse({"detail": error.detail}, status_code=413)
            await response(scope, receive, send)
            return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        async def watch_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, watch_send)
        except BodyTooLarge as error:
            if started:
                raise
            response = JSONResponse({"detail": error.detail}, status_code=413)
            await response(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
