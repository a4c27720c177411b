"""A database that does not answer is noticed (fault campaign finding T7-detect).

Every connection gets keepalives, ``tcp_user_timeout`` and ``connect_timeout`` (a link
that is down is dropped within about 5 s); the daemon's pool also gets a statement
deadline: the server cancels a statement after ``statement_timeout_s``, and the client
gives up on a block 1 s after that (no answer at all: a partition, a blackhole).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

import pytest

from jobsd.errors import BackendUnavailable
from jobsd.store import queries
from jobsd.store.connect import _params, connect, make_async_pool
from jobsd.store.db import AsyncPool, DeadlinePool, acquire, db_errors

pytestmark = pytest.mark.anyio


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncPool]:
    """A daemon-like pool: statements may run 0.5 s, warned at 1.5 s, given up at 3 s."""
    pool = make_async_pool(
        db_url,
        name="daemon",
        min_size=1,
        max_size=2,
        timeout_s=5.0,
        statement_timeout_s=0.5,
        give_up_after_s=3.0,
    )
    await pool.open(wait=True)
    try:
        yield pool
    finally:
        await pool.close()


def test_every_connection_notices_a_dead_link_within_about_5_s(db_url: str) -> None:
    params = _params(db_url, "jobsd-test")
    assert params["tcp_user_timeout"] == 5000
    idle, interval, count = (
        params["keepalives_idle"],
        params["keepalives_interval"],
        params["keepalives_count"],
    )
    assert idle + interval * count <= 5
    # a value the URL gives itself wins
    assert "connect_timeout" not in _params(f"{db_url}?connect_timeout=30", "jobsd-test")
    with connect(db_url, application_name="jobsd-test", operation="test") as conn:
        # libpq took them (an unknown parameter would have failed the connection)
        assert conn.info.get_parameters()["tcp_user_timeout"] == "5000"


async def test_the_daemons_pool_sets_the_deadlines_on_each_connection(db_url: str) -> None:
    pool = make_async_pool(
        db_url, name="daemon", min_size=1, max_size=1, timeout_s=5.0, statement_timeout_s=5.0
    )
    assert isinstance(pool, DeadlinePool)
    assert (pool.warn_after_s, pool.give_up_after_s) == (6.0, 30.0)
    await pool.open(wait=True)
    try:
        async with acquire(pool, "test") as conn:
            cur = await conn.execute(
                "SELECT current_setting('statement_timeout') AS st,"
                " current_setting('idle_in_transaction_session_timeout') AS idle,"
                " current_setting('client_connection_check_interval') AS check"
            )
            row = await cur.fetchone()
    finally:
        await pool.close()
    assert row == {"st": "5s", "idle": "10s", "check": "1s"}


async def test_a_slow_statement_is_cancelled_by_the_server_and_the_pool_goes_on(
    pool: AsyncPool,
) -> None:
    t0 = time.monotonic()
    with pytest.raises(BackendUnavailable, match="statement timeout"):
        async with acquire(pool, "slow") as conn:
            with db_errors("slow"):
                await conn.execute("SELECT pg_sleep(5)")
    assert time.monotonic() - t0 < 1.5
    async with acquire(pool, "after") as conn:
        assert await queries.db_now(conn)


def _events(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [
        (r.getMessage(), r.__dict__.get("operation", ""))
        for r in caplog.records
        if r.name == "jobsd.store.db"
    ]


async def test_a_database_that_does_not_answer_is_warned_about_then_given_up(
    pool: AsyncPool, caplog: pytest.LogCaptureFixture
) -> None:
    t0 = time.monotonic()
    with (
        caplog.at_level(logging.INFO, logger="jobsd.store.db"),
        pytest.raises(BackendUnavailable, match=r"heartbeat failed: no answer .* within 3 s"),
    ):
        async with acquire(pool, "heartbeat") as aconn:
            # the server would wait 10 s: as if its answer never came back
            await aconn.execute("SET statement_timeout = 0")
            await aconn.execute("SELECT pg_sleep(10)")
    elapsed = time.monotonic() - t0
    assert 3.0 <= elapsed < 6.0
    assert _events(caplog) == [("db.no_answer", "heartbeat")]
    assert aconn.closed
    # the pool hands out a working connection, with its deadlines, next time
    async with acquire(pool, "after") as again:
        assert again is not aconn
        cur = await again.execute("SELECT current_setting('statement_timeout') AS st")
        assert await cur.fetchone() == {"st": "500ms"}


async def test_an_answer_that_comes_late_is_taken(
    pool: AsyncPool, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="jobsd.store.db"):
        async with acquire(pool, "claim") as aconn:
            await aconn.execute("SET statement_timeout = 0")
            cur = await aconn.execute("SELECT pg_sleep(2) AS slept, 42 AS answer")
            assert (await cur.fetchone())["answer"] == 42  # type: ignore[index]
            await aconn.execute("RESET statement_timeout")
    assert _events(caplog) == [("db.no_answer", "claim"), ("db.answered", "claim")]
    assert not aconn.closed
