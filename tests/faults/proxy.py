"""An in-process TCP proxy in front of Postgres that can misbehave on purpose.

It runs an asyncio loop in a thread of its own. Modes:

- pass: bytes flow both ways.
- ``blackhole()``: nothing flows any more, in either direction, on open connections
  and new ones (the proxy stops reading: the kernel buffers fill and the senders block,
  as behind a network partition). ``heal()`` lets the held bytes through (a partition
  healed before any timeout fired); ``heal(close=True)`` cuts every connection instead.
- ``arm_ambiguous(match, count)``: the next ``count`` times a client sends a statement
  whose text contains ``match``, the statement reaches the server (and commits at its
  Sync), but the answer is dropped and the connection is cut a moment later: an
  ambiguous commit, the client cannot know whether it happened.

The client side must not use TLS (``sslmode=disable``): the proxy reads the
protocol's messages to find statements (Parse, Bind of a named statement, Query).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
from dataclasses import dataclass, field

__all__ = ["Proxy"]

_SSL_REQUEST = 80877103
_GSS_REQUEST = 80877104


@dataclass(eq=False)
class _Conn:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    statements: dict[bytes, bytes] = field(default_factory=dict)  # prepared name -> text
    armed: bool = False
    drop_s2c: bool = False


class Proxy:
    """A TCP proxy to ``host:port`` on a free port of 127.0.0.1."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.port = 0
        self.connections = 0
        self.triggered = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._flowing = asyncio.Event()
        self._conns: set[_Conn] = set()
        self._match = b""
        self._ambiguous_left = 0
        self._server: asyncio.Server | None = None

    # -- control, from any thread ------------------------------------------------------

    def start(self) -> int:
        """Start listening; return the port."""
        self._thread.start()
        self._call(self._flowing.set)
        fut = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self.port = fut.result(10)
        return self.port

    def blackhole(self) -> None:
        """Stop every byte, both ways, on every connection (open and new)."""
        self._call(self._flowing.clear)

    def heal(self, *, close: bool = False) -> None:
        """End a blackhole: let held bytes through, or cut every connection."""
        if close:
            asyncio.run_coroutine_threadsafe(self._close_all(), self._loop).result(10)
        self._call(self._flowing.set)

    def arm_ambiguous(self, match: bytes, count: int = 1) -> None:
        """Drop the answers of the next ``count`` statements containing ``match``."""

        def arm() -> None:
            self._match, self._ambiguous_left = match, count

        self._call(arm)

    def close(self) -> None:
        """Close every connection and stop the loop."""
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _call(self, fn: object) -> None:
        done = threading.Event()

        def run() -> None:
            fn()  # type: ignore[operator]
            done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(10)

    # -- the loop ------------------------------------------------------------------------

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._close_all()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _close_all(self) -> None:
        for conn in list(self._conns):
            for writer in (conn.client, conn.server):
                writer.transport.abort()
        self._conns.clear()

    async def _accept(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        await self._flowing.wait()
        try:
            s_reader, s_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            c_writer.transport.abort()
            return
        self.connections += 1
        conn = _Conn(c_writer, s_writer)
        self._conns.add(conn)
        try:
            await asyncio.gather(
                self._client_to_server(conn, c_reader), self._server_to_client(conn, s_reader)
            )
        finally:
            self._conns.discard(conn)
            for writer in (c_writer, s_writer):
                writer.transport.abort()

    async def _read_exactly(self, reader: asyncio.StreamReader, n: int) -> bytes:
        await self._flowing.wait()
        return await reader.readexactly(n)

    async def _client_to_server(self, conn: _Conn, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            # untyped start-up packets: SSL/GSS requests, then the startup message
            while True:
                head = await self._read_exactly(reader, 8)
                length, code = struct.unpack("!ii", head)
                body = await self._read_exactly(reader, length - 8)
                await self._send(conn.server, head + body)
                if code not in (_SSL_REQUEST, _GSS_REQUEST):
                    break
            while True:
                kind = await self._read_exactly(reader, 1)
                (length,) = struct.unpack("!i", await self._read_exactly(reader, 4))
                body = await self._read_exactly(reader, length - 4)
                self._inspect(conn, kind, body)
                await self._send(conn.server, kind + struct.pack("!i", length) + body)
                if kind in (b"S", b"Q") and conn.armed:
                    conn.armed = False
                    if self._ambiguous_left > 0:
                        self._ambiguous_left -= 1
                        self.triggered += 1
                        conn.drop_s2c = True
                        asyncio.get_running_loop().call_later(0.3, self._cut, conn)

    def _inspect(self, conn: _Conn, kind: bytes, body: bytes) -> None:
        if kind == b"P":
            # every prepared statement is remembered, armed or not: a statement the
            # client prepared before the proxy was armed is then run by name only
            name, rest = body.split(b"\0", 1)
            query = rest.split(b"\0", 1)[0]
            conn.statements[name] = query
            conn.armed |= bool(self._match) and self._match in query
            return
        if not self._match:
            return
        if kind == b"B":
            _portal, rest = body.split(b"\0", 1)
            name = rest.split(b"\0", 1)[0]
            conn.armed |= self._match in conn.statements.get(name, b"")
        elif kind == b"Q":
            conn.armed |= self._match in body

    def _cut(self, conn: _Conn) -> None:
        for writer in (conn.client, conn.server):
            writer.transport.abort()

    async def _server_to_client(self, conn: _Conn, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(ConnectionError):
            while True:
                await self._flowing.wait()
                data = await reader.read(65536)
                if not data:
                    break
                if conn.drop_s2c:
                    continue
                await self._send(conn.client, data)

    async def _send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        await self._flowing.wait()
        writer.write(data)
        await writer.drain()
