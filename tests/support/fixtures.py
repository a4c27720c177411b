"""Fixtures of every tier; tests/conftest.py imports them so pytest registers them."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo


@pytest.fixture
def anyio_backend() -> str:
    """Run async tests on asyncio: the loop the daemon and the API run on in production,
    and the one psycopg's async driver needs."""
    return "asyncio"


@pytest.fixture
def empty_db_url(admin_url: str) -> Iterator[str]:
    """Create an empty (never migrated) database; return its URL and drop it afterwards."""
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
def shared_tmp() -> Iterator[Path]:
    """A temp dir the unprivileged Postgres user can traverse (tmp_path is 0700 as root)."""
    path = Path(tempfile.mkdtemp(prefix="jobsd-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)
