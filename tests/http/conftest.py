"""Fixtures of the HTTP API tests: a migrated database per test, tokens for two orgs."""

from __future__ import annotations

import pytest
from apikit import make_token


@pytest.fixture
def token_a(db_url: str) -> str:
    """Return a bearer token of org ``acme``."""
    return make_token(db_url, "acme", "tests")


@pytest.fixture
def token_b(db_url: str) -> str:
    """Return a bearer token of org ``globex``."""
    return make_token(db_url, "globex", "tests")
