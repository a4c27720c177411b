"""Waits with a deadline: poll a condition until it holds, fail with what was awaited.

Tests synchronise on events or on these polls, never on a bare sleep; a test that proves
"within N s" passes N as the deadline. The sync variants serve tests that drive
subprocesses, the async ones tests that run a daemon or the API in their own loop.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import psycopg

from .jobs import fetch_job, job_row

T = TypeVar("T")

POLL_EVERY_S = 0.02


def poll(check: Callable[[], T | None], *, what: str, timeout_s: float = 20.0) -> T:
    """Call ``check`` every 20 ms until it returns a truthy value; fail after the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(POLL_EVERY_S)


async def wait_until(
    check: Callable[[], Awaitable[T | None]], *, what: str, timeout_s: float = 10.0
) -> T:
    """Await ``check`` every 20 ms until it returns a truthy value; fail after the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await anyio.sleep(POLL_EVERY_S)


def _describe(job_id: object, statuses: tuple[str, ...]) -> str:
    return f"job {job_id} to be {'/'.join(statuses)}"


def _in(row: dict[str, Any] | None, job_id: object, statuses: tuple[str, ...]) -> Any:
    assert row is not None, f"job {job_id} not found"
    return row if row["status"] in statuses else None


def wait_status(
    conn: psycopg.Connection[Any], job_id: object, *statuses: str, timeout_s: float = 20.0
) -> dict[str, Any]:
    """Wait until a job is in one of ``statuses``; return its row (a dict)."""
    return poll(
        lambda: _in(job_row(conn, job_id), job_id, statuses),
        what=_describe(job_id, statuses),
        timeout_s=timeout_s,
    )


async def wait_status_async(
    conn: psycopg.AsyncConnection[Any],
    job_id: object,
    *statuses: str,
    timeout_s: float = 10.0,
) -> dict[str, Any]:
    """Wait until a job is in one of ``statuses``; return its row (a dict)."""

    async def check() -> dict[str, Any] | None:
        return _in(await fetch_job(conn, job_id), job_id, statuses)

    return await wait_until(check, what=_describe(job_id, statuses), timeout_s=timeout_s)
