"""Fixtures of the security tests: least-privilege roles on the test's database, and URLs.

Roles are cluster-wide: every test gets its own prefix and its roles are dropped at
teardown (what they own passes back to the superuser first).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from daemonkit import wait_until as wait_until
from psycopg.conninfo import make_conninfo

from jobsd.admin.roles import RoleNames, create_roles, drop_roles

T = TypeVar("T")

# Fast daemons: a scenario takes well under a second of daemon time.
FAST: dict[str, Any] = {
    "slots": 2,
    "poll_interval": 0.5,
    "heartbeat_interval": 0.2,
    "progress_interval": 0.05,
    "sweep_interval": 3600.0,
    "drain_timeout": 2.0,
    "handlers": [],
    "queues": [],
}


def url_as(url: str, user: str, **params: Any) -> str:
    """Return ``url`` for another user (and other libpq parameters)."""
    return make_conninfo(url, user=user, **params)


def org_option(org_id: str) -> str:
    """Return the libpq ``options`` value that sets jobsd.org_id for the session."""
    return f"-c jobsd.org_id={org_id}"


@dataclass(frozen=True)
class Roles:
    """The roles of one test and the superuser URL of its database."""

    names: RoleNames
    db_url: str

    def url(self, kind: str, *, org: str | None = None) -> str:
        """Return the URL of role ``kind``, optionally with jobsd.org_id set for the session."""
        extra = {"options": org_option(org)} if org is not None else {}
        return url_as(self.db_url, getattr(self.names, kind), **extra)


@pytest.fixture
def roles(db_url: str) -> Iterator[Roles]:
    """Create the four roles (a unique prefix) on the test's database; drop them after."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    create_roles(db_url, prefix=prefix)
    try:
        yield Roles(RoleNames.for_prefix(prefix), db_url)
    finally:
        drop_roles(db_url, prefix=prefix)


@pytest.fixture
def anyio_backend() -> str:
    """Run the async tests on asyncio, the loop the daemon runs on in production."""
    return "asyncio"
