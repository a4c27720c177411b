"""Fixtures of the database tests: async connections, empty databases, NOTIFY listeners."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import psycopg
import pytest
from dbcheck import Listener
from psycopg import sql
from psycopg.conninfo import make_conninfo


@pytest.fixture
def anyio_backend() -> str:
    """Run async tests on asyncio (psycopg's async driver)."""
    return "asyncio"


@pytest.fixture
async def aconn(db_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """Open an autocommit async connection to the test's database."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as connection:
        yield connection


@pytest.fixture
def empty_db_url(admin_url: str) -> Iterator[str]:
    """Create an empty (unmigrated) database and drop it afterwards."""
    name = f"empty_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(admin_url, dbname=name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture
def listener(db_url: str) -> Iterator[Callable[[], Listener]]:
    """Yield a factory of Listeners on the test's database, closed afterwards."""
    opened: list[Listener] = []

    def factory() -> Listener:
        opened.append(Listener(db_url))
        return opened[-1]

    yield factory
    for item in opened:
        item.close()
