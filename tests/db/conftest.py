"""Fixtures of the database tests: async connections and NOTIFY listeners."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import psycopg
import pytest
from dbcheck import Listener


@pytest.fixture
async def aconn(db_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """Open an autocommit async connection to the test's database."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as connection:
        yield connection


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
