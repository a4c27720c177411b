"""Idle and slow sockets cannot lock the API out: the per-peer connection cap, the
deadlines for request headers and bodies, and the probes past full slots.

Every test serves the real API with uvicorn on a loopback port. The flooding sockets
are plain sockets opened from a worker thread, so the server (in the test's loop)
accepts while they connect; another client comes from 127.0.0.2, another peer.
"""

from __future__ import annotations

import contextlib
import resource
import socket
import struct
import time
from collections.abc import Iterator

import anyio
import httpx
import pytest
from apikit import bearer, http_settings, served_api, settings_for, wait_until

from jobsd.http.guard import ConnectionGuard

pytestmark = pytest.mark.anyio

FLOOD = 1_100
OTHER_PEER = "127.0.0.2"
# a request line and one header: a request whose headers never end
PARTIAL = b"GET /healthz HTTP/1.1\r\nHost: flood\r\n"


@pytest.fixture(autouse=True)
def enough_files() -> Iterator[None]:
    """Allow the flood's sockets (both ends live in this process): raise the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4 * FLOOD + 1_024
    if soft != resource.RLIM_INFINITY and soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.skip(f"needs {want} open files, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _open(address: tuple[str, int], count: int, source: str, first: bytes) -> list[socket.socket]:
    """Connect ``count`` sockets from ``source`` and send each ``first`` (blocking)."""
    socks: list[socket.socket] = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # closed with a reset at the end: no TIME_WAIT left over for the next run
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.bind((source, 0))
        sock.connect(address)
        if first:
            with contextlib.suppress(OSError):  # already refused by the server
                sock.sendall(first)
        sock.setblocking(False)
        socks.append(sock)
    return socks


async def open_sockets(
    base_url: str, count: int, *, source: str = "127.0.0.1", first: bytes = b""
) -> list[socket.socket]:
    """Open ``count`` sockets to the API from ``source``, off the loop the server runs in."""
    host, port = httpx.URL(base_url).host, httpx.URL(base_url).port
    assert port is not None
    return await anyio.to_thread.run_sync(_open, (host, port), count, source, first)


def closed_by_server(sock: socket.socket) -> bool:
    """Return True once the server closed ``sock`` (end of stream or reset), without
    waiting; what it sent before is read and dropped."""
    try:
        while sock.recv(65536):
            pass
    except BlockingIOError:
        return False
    except OSError:
        return True
    return True


async def wait_closed(sock: socket.socket, *, what: str, timeout_s: float) -> float:
    """Wait until the server closes ``sock``; return the monotonic time it was seen closed."""

    async def closed() -> bool:
        return closed_by_server(sock)

    await wait_until(closed, what=what, timeout_s=timeout_s)
    return time.monotonic()


def close_all(socks: list[socket.socket]) -> None:
    for sock in socks:
        sock.close()


def client_from(base_url: str, source: str) -> httpx.AsyncClient:
    """Return a client whose connections come from ``source``."""
    transport = httpx.AsyncHTTPTransport(local_address=source)
    return httpx.AsyncClient(base_url=base_url, transport=transport, timeout=10.0)


async def timed(request: httpx.Request, client: httpx.AsyncClient) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = await client.send(request)
    return response, time.monotonic() - started


@pytest.mark.timeout(60)
async def test_1100_half_open_sockets_of_one_peer_leave_the_api_to_the_others(
    db_url: str, token_a: str
) -> None:
    """A peer that opens 1,100 sockets and sends nothing (or never ends its headers)
    takes none of the API's slots: another client submits and probes at once."""
    http = http_settings()
    async with served_api(settings_for(db_url), http) as (base_url, _backend):
        silent = await open_sockets(base_url, FLOOD // 2)
        partial = await open_sockets(base_url, FLOOD - FLOOD // 2, first=PARTIAL)
        flood = silent + partial
        try:
            async with client_from(base_url, OTHER_PEER) as other:
                submit = other.build_request(
                    "POST", "/jobs", json={"type": "t"}, headers=bearer(token_a)
                )
                r, took = await timed(submit, other)
                assert r.status_code == 202, r.text
                assert took < 1.0, took
                for path in ("/healthz", "/readyz"):
                    r, took = await timed(other.build_request("GET", path), other)
                    assert r.status_code == 200, (path, r.text)
                    assert took < 1.0, (path, took)

            # the sockets over the peer's cap were closed at accept, the rest wait
            over = FLOOD - http.http_max_connections_per_peer
            assert over > 0

            async def refused() -> bool:
                return sum(closed_by_server(s) for s in flood) >= over

            await wait_until(refused, what=f"{over} sockets closed at accept", timeout_s=10)
        finally:
            close_all(flood)


@pytest.mark.timeout(60)
async def test_headers_that_never_end_are_cut_at_the_header_deadline(db_url: str) -> None:
    """A socket that sends nothing, one that stops mid-headers, one that trickles a
    byte every 100 ms and one that stalls in its second request: each is closed
    JOBSD_HTTP_HEADER_TIMEOUT after its headers began, not before; a complete request
    is answered."""
    http = http_settings(http_header_timeout=0.5)
    async with served_api(settings_for(db_url), http) as (base_url, _backend):
        started = time.monotonic()
        (silent,) = await open_sockets(base_url, 1)
        (partial,) = await open_sockets(base_url, 1, first=PARTIAL)
        (trickle,) = await open_sockets(base_url, 1, first=b"GET /healthz HTTP/1.1\r\n")
        (second,) = await open_sockets(
            base_url, 1, first=b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        socks = [silent, partial, trickle, second]
        try:

            async def keep_trickling() -> None:
                while not closed_by_server(trickle):
                    try:
                        trickle.send(b"X")
                    except OSError:
                        return
                    await anyio.sleep(0.1)  # the slow client's pace, not a wait

            async def second_answered() -> bytes | None:
                try:
                    return second.recv(65536)
                except BlockingIOError:
                    return None

            async with anyio.create_task_group() as tg:
                tg.start_soon(keep_trickling)
                answer = await wait_until(second_answered, what="the first answer", timeout_s=5)
                assert answer.startswith(b"HTTP/1.1 200 "), answer
                # the next request on the kept connection stalls in its headers
                second_started = time.monotonic()
                second.send(PARTIAL)
                for sock, what in zip(
                    socks, ("silent", "partial", "trickle", "second"), strict=True
                ):
                    seen = await wait_closed(sock, what=f"the {what} socket closed", timeout_s=5)
                    since = second_started if sock is second else started
                    assert seen - since >= 0.5, (what, seen - since)
            async with httpx.AsyncClient(base_url=base_url) as client:
                assert (await client.get("/healthz")).status_code == 200
        finally:
            close_all(socks)


@pytest.mark.timeout(60)
async def test_a_body_that_never_ends_is_cut_at_the_body_deadline(
    db_url: str, token_a: str
) -> None:
    """A body short of its Content-Length is cut JOBSD_HTTP_BODY_TIMEOUT after its
    headers, not before; a body sent in parts within it is taken, and a long-poll (no
    body) outlives both deadlines."""
    http = http_settings(http_header_timeout=0.5, http_body_timeout=0.5)
    body = b'{"type": "t"}'
    head = (
        b"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {token_a}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    )
    async with served_api(settings_for(db_url), http) as (base_url, _backend):
        started = time.monotonic()
        (stalled,) = await open_sockets(base_url, 1, first=head + body[:5])
        try:
            seen = await wait_closed(stalled, what="the stalled body cut", timeout_s=5)
        finally:
            stalled.close()
        assert seen - started >= 0.5, seen - started

        (parts,) = await open_sockets(base_url, 1, first=head + body[:5])
        try:
            await anyio.sleep(0.25)  # the slow client's pace, within the deadline
            parts.send(body[5:])

            async def answered() -> bytes | None:
                try:
                    return parts.recv(65536)
                except BlockingIOError:
                    return None

            answer = await wait_until(answered, what="the submission's answer", timeout_s=5)
            assert answer.startswith(b"HTTP/1.1 202 "), answer
        finally:
            parts.close()

        async with httpx.AsyncClient(base_url=base_url, timeout=10.0) as client:
            r = await client.post("/jobs", json={"type": "t"}, headers=bearer(token_a))
            job_id = r.json()["id"]
            started = time.monotonic()
            r = await client.get(f"/jobs/{job_id}?wait=1.5", headers=bearer(token_a))
            assert r.status_code == 200 and r.json()["status"] == "queued", r.text
            assert time.monotonic() - started >= 1.4


@pytest.mark.timeout(60)
async def test_the_per_peer_cap_refuses_one_peer_and_not_the_others(db_url: str) -> None:
    """With JOBSD_HTTP_MAX_CONNECTIONS_PER_PEER=3, the 4th connection of 127.0.0.1 is
    closed at accept while 127.0.0.2 is served; a freed connection lets it in again."""
    http = http_settings(http_max_connections_per_peer=3)
    async with served_api(settings_for(db_url), http) as (base_url, _backend):
        held = await open_sockets(base_url, 3)
        try:
            (fourth,) = await open_sockets(base_url, 1)
            await wait_closed(fourth, what="the 4th connection closed at accept", timeout_s=5)
            fourth.close()
            assert not any(closed_by_server(s) for s in held)
            async with client_from(base_url, OTHER_PEER) as other:
                assert (await other.get("/healthz")).status_code == 200
            async with client_from(base_url, "127.0.0.1") as same:
                with pytest.raises(httpx.TransportError):
                    await same.get("/healthz")
                held.pop().close()

                async def let_in() -> bool:
                    try:
                        return (await same.get("/healthz")).status_code == 200
                    except httpx.TransportError:
                        return False

                await wait_until(let_in, what="a freed place for 127.0.0.1", timeout_s=5)
        finally:
            close_all(held)


@pytest.mark.timeout(60)
async def test_probes_are_answered_when_the_slots_are_full(db_url: str, token_a: str) -> None:
    """With JOBSD_HTTP_MAX_CONCURRENCY=2: sockets that never sent a request take no
    slot; two long-polls fill the slots, then /jobs answers 503 with Retry-After while
    /healthz and /readyz still answer 200."""
    http = http_settings(http_max_concurrency=2)
    async with (
        served_api(settings_for(db_url), http) as (base_url, backend),
        client_from(base_url, OTHER_PEER) as other,
    ):
        idle = await open_sockets(base_url, 5, first=PARTIAL)
        try:
            r = await other.post("/jobs", json={"type": "t"}, headers=bearer(token_a))
            assert r.status_code == 202, r.text
        finally:
            close_all(idle)
        url = f"/jobs/{r.json()['id']}?wait=5"
        answers: list[int] = []
        async with (
            httpx.AsyncClient(base_url=base_url, timeout=10.0) as pollers,
            anyio.create_task_group() as tg,
        ):

            async def poll() -> None:
                answers.append((await pollers.get(url, headers=bearer(token_a))).status_code)

            tg.start_soon(poll)
            tg.start_soon(poll)

            async def both_waiting() -> bool:
                return backend.waiter.waiting >= 2

            await wait_until(both_waiting, what="two long-polls", timeout_s=5)
            r = await other.get("/jobs", headers=bearer(token_a))
            assert r.status_code == 503, r.text
            assert r.headers["Retry-After"] == "1"
            for path in ("/healthz", "/readyz"):
                r = await other.get(path)
                assert r.status_code == 200, (path, r.text)
            backend.close_waits()
        assert answers == [200, 200]


def test_the_guard_counts_connections_per_peer() -> None:
    guard = ConnectionGuard(per_peer=2, header_timeout_s=10.0, body_timeout_s=30.0)
    assert guard.admit("10.0.0.1") and guard.admit("10.0.0.1")
    assert not guard.admit("10.0.0.1")  # the 3rd of one peer
    assert guard.admit("10.0.0.2")  # another peer
    assert (guard.open, guard.refused) == (3, 1)
    guard.release("10.0.0.1")
    assert guard.admit("10.0.0.1")  # a freed place
    for peer in ("10.0.0.1", "10.0.0.1", "10.0.0.2"):
        guard.release(peer)
    assert guard.open == 0 and not guard._by_peer  # peers gone are forgotten
    unbounded = ConnectionGuard(per_peer=0, header_timeout_s=10.0, body_timeout_s=30.0)
    assert all(unbounded.admit("10.0.0.1") for _ in range(10_000))  # 0: no cap
