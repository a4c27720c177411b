"""The scale tier: scenarios with a million jobs, too heavy for the default run.

Every test here is marked ``scale`` and left out of a plain ``uv run pytest``; it runs
when this folder is named (``uv run pytest tests/scale``, which ``.ci/run`` runs after
the suite), with ``JOBSD_TEST_SCALE=1``, or with a ``-m`` expression naming ``scale``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SCALE_DIR = Path(__file__).resolve().parent
SELECT_ENV = "JOBSD_TEST_SCALE"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave the scale tier out unless it was asked for."""
    asked = [Path(a.split("::")[0]).resolve() for a in config.args]
    wanted = (
        os.environ.get(SELECT_ENV, "").lower() in ("1", "yes", "all")
        or "scale" in (config.option.markexpr or "")
        or any(a == SCALE_DIR or SCALE_DIR in a.parents for a in asked)
    )
    kept, dropped = [], []
    for item in items:
        if SCALE_DIR in Path(str(item.path)).parents and not wanted:
            dropped.append(item)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
