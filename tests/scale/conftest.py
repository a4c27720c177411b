"""The scale tier: scenarios with a million jobs, too heavy for the default run.

Every test here is marked ``scale`` and left out of a plain ``uv run pytest``; it runs
when this folder is named (``uv run pytest tests/scale``, which ``.ci/run`` runs after
the suite), with ``JOBSD_TEST_SCALE=1``, or with a ``-m`` expression naming ``scale``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.tiers import leave_out_unless_asked

SCALE_DIR = Path(__file__).resolve().parent
SELECT_ENV = "JOBSD_TEST_SCALE"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave the scale tier out unless it was asked for."""
    leave_out_unless_asked(config, items, SCALE_DIR, SELECT_ENV, "scale")
