"""The unit tier: pure logic, no database. A test here that asks for a server fails."""

from __future__ import annotations

import pytest

# the fixtures that start or reach a Postgres server (every database fixture needs one)
_SERVER_FIXTURES = {"pg_cluster", "admin_url", "make_cluster"}


def pytest_runtest_setup(item: pytest.Item) -> None:
    used = _SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ()))
    if used:
        pytest.fail(
            f"{item.nodeid} uses {sorted(used)}: a unit test needs no database; "
            "move it to the tier it belongs to (tests/README.md)",
            pytrace=False,
        )
