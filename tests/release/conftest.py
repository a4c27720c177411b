"""The release tier: the wheel and sdist as a user gets them, built and installed.

Every test here is marked ``release`` and left out of a plain ``uv run pytest``; it runs
when this folder is named (``uv run pytest tests/release``, which ``.ci/run`` runs after
the suite), with ``JOBSD_TEST_RELEASE=1``, or with a ``-m`` expression naming ``release``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.tiers import leave_out_unless_asked

RELEASE_DIR = Path(__file__).resolve().parent
SELECT_ENV = "JOBSD_TEST_RELEASE"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave the release tier out unless it was asked for."""
    leave_out_unless_asked(config, items, RELEASE_DIR, SELECT_ENV, "release")
