"""Fixtures of the HTTP API tests: a migrated database per test, tokens for two orgs."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from apikit import make_token

from jobsd.admin.roles import RoleNames, create_roles, drop_roles


@pytest.fixture
def token_a(db_url: str) -> str:
    """Return a bearer token of org ``acme``."""
    return make_token(db_url, "acme", "tests")


@pytest.fixture
def token_b(db_url: str) -> str:
    """Return a bearer token of org ``globex``."""
    return make_token(db_url, "globex", "tests")


@pytest.fixture
def roles(db_url: str) -> Iterator[RoleNames]:
    """The least-privilege roles on the test's database (a unique prefix), dropped after."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    create_roles(db_url, prefix=prefix)
    try:
        yield RoleNames.for_prefix(prefix)
    finally:
        drop_roles(db_url, prefix=prefix)
