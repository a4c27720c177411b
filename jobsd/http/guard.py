"""Keep sockets that send nothing, or send slowly, from locking the API out.

uvicorn alone arms no timer on a connection until its first response, and its
``limit_concurrency`` counts every open connection: a thousand sockets that connect
and say nothing make every request answer 503, the probes included. ``serve`` runs
uvicorn with three bounds instead:

- **per peer, at accept**: beyond ``JOBSD_HTTP_MAX_CONNECTIONS_PER_PEER`` connections
  open from one IP address, a new one is closed as it is accepted, before a byte is
  read; uvicorn never sees it.
- **deadlines** (``GuardedH11Protocol``, on uvicorn's h11 protocol): request headers
  must be complete ``JOBSD_HTTP_HEADER_TIMEOUT`` after they began (the accept, or the
  first byte of a later request on a kept-alive connection), a request body
  ``JOBSD_HTTP_BODY_TIMEOUT`` after its headers; past it the connection is dropped.
  While the app works on a request (a long-poll) there is no deadline here, and a
  kept-alive connection idles for uvicorn's keep-alive timeout (5 s).
- **slots** (``Slots``, around the app): ``JOBSD_HTTP_MAX_CONCURRENCY`` bounds the
  requests in flight, from their complete headers to their answer; beyond, 503 at
  once (uvicorn's own answer, plus ``Retry-After: 1``). A connection that
  waits (for its headers, or kept alive between requests) takes no slot, and
  ``/healthz`` and ``/readyz`` go around the slots: an orchestrator's probes are
  answered however busy the API is.

The state is the client's side of h11's state machine, read after uvicorn handled
each read: no parsing of our own, and a few attribute reads per request.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import time
from typing import Any, ClassVar

import h11
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

__all__ = ["OPEN_PROBES", "ConnectionGuard", "GuardedH11Protocol", "Slots", "guarded_protocol"]

log = logging.getLogger(__name__)

# answered beyond the slots: the orchestrator's liveness and readiness
OPEN_PROBES = frozenset({"/healthz", "/readyz"})
# a flood is logged at most once per this interval, with its count since the last line
_WARN_EVERY_S = 10.0


class _Throttled:
    """Log a warning at most once per ``_WARN_EVERY_S``, with how often it happened since."""

    def __init__(self, event: str) -> None:
        self.event = event
        self.count = 0
        self._last = -math.inf

    def __call__(self, **extra: Any) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self._last >= _WARN_EVERY_S:
            log.warning(self.event, extra={**extra, "count": self.count})
            self.count = 0
            self._last = now


class ConnectionGuard:
    """Count the server's connections, in all and per peer; refuse a peer over its cap.

    ``per_peer`` 0 means no cap.
    """

    def __init__(self, per_peer: int, header_timeout_s: float, body_timeout_s: float) -> None:
        self.per_peer = per_peer
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.open = 0
        self.refused = 0
        """connections closed at accept (tests read it)"""
        self.timed_out = 0
        """connections dropped at a deadline (tests read it)"""
        self._by_peer: dict[str, int] = {}
        self._warn_capped = _Throttled("api.peer_capped")

    def admit(self, peer: str) -> bool:
        """Count one more connection of ``peer``; False (and nothing counted) over its cap."""
        held = self._by_peer.get(peer, 0)
        if self.per_peer and held >= self.per_peer:
            self.refused += 1
            self._warn_capped(peer=peer, max=self.per_peer)
            return False
        self._by_peer[peer] = held + 1
        self.open += 1
        return True

    def release(self, peer: str) -> None:
        """Count one connection of ``peer`` less."""
        self.open -= 1
        left = self._by_peer[peer] - 1
        if left:
            self._by_peer[peer] = left
        else:
            del self._by_peer[peer]


class _Phase(enum.Enum):
    """What a connection waits for from its client, and so which deadline runs."""

    HEADERS = "headers"  # from the accept, or a later request's first byte: header deadline
    BODY = "body"  # headers complete, body not: body deadline
    SERVED = "served"  # the app has the request, or the connection is kept alive: none


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol under a ``ConnectionGuard``: the cap at accept, the deadlines.

    ``guard`` is set on a subclass per server (``guarded_protocol``).
    """

    guard: ClassVar[ConnectionGuard]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._peer: str | None = None
        self._phase = _Phase.SERVED
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(  # type: ignore[override]
        self, transport: asyncio.Transport
    ) -> None:
        peer = _peer_of(transport)
        if not self.guard.admit(peer):
            transport.abort()
            return
        self._peer = peer
        super().connection_made(transport)
        self._enter(_Phase.HEADERS)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._peer is None:  # refused at accept: uvicorn never had it
            return
        self._enter(_Phase.SERVED)
        self.guard.release(self._peer)
        self._peer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]:
            # kept alive with nothing sent yet: uvicorn's keep-alive timeout runs
            self._enter(_Phase.SERVED)
        else:
            self._follow()

    def _follow(self) -> None:
        """Run the deadline of what the client is sending now, if it sends anything."""
        if self._peer is None:
            return
        state = self.conn.their_state
        if state is h11.IDLE:  # bytes came since the last answer, no complete headers
            phase = _Phase.HEADERS
        elif state is h11.SEND_BODY:
            phase = _Phase.BODY
        else:
            phase = _Phase.SERVED
        if phase is not self._phase:
            self._enter(phase)

    def _enter(self, phase: _Phase) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._phase = phase
        if phase is _Phase.BODY:
            self._deadline = self.loop.call_later(self.guard.body_timeout_s, self._expire)
        elif phase is _Phase.HEADERS:
            self._deadline = self.loop.call_later(self.guard.header_timeout_s, self._expire)

    def _expire(self) -> None:
        """Drop the connection: its client missed the deadline of ``self._phase``."""
        self._deadline = None
        self.guard.timed_out += 1
        log.debug("api.client_too_slow", extra={"peer": self._peer, "phase": self._phase.value})
        self.transport.abort()


def guarded_protocol(guard: ConnectionGuard) -> type[GuardedH11Protocol]:
    """Return the protocol class uvicorn builds each connection with, bound to ``guard``."""

    class Guarded(GuardedH11Protocol):
        pass

    Guarded.guard = guard
    return Guarded


def _peer_of(transport: asyncio.BaseTransport) -> str:
    """Return the peer's IP address ("" when it has none, e.g. a Unix socket)."""
    peername = transport.get_extra_info("peername")
    if isinstance(peername, tuple | list) and peername:
        return str(peername[0])
    return ""


_UNAVAILABLE_HEADERS = [
    (b"content-type", b"text/plain; charset=utf-8"),
    (b"content-length", b"19"),
    (b"retry-after", b"1"),
    (b"connection", b"close"),
]


class Slots:
    """ASGI wrapper: 503 at once beyond ``limit`` requests in flight.

    The probes of ``OPEN_PROBES`` go around it (and are not counted); lifespan and
    other scopes pass.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.in_flight = 0
        self._warn_full = _Throttled("api.slots_full")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PROBES:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            self._warn_full(limit=self.limit)
            await send(
                {"type": "http.response.start", "status": 503, "headers": _UNAVAILABLE_HEADERS}
            )
            await send({"type": "http.response.body", "body": b"Service Unavailable"})
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
