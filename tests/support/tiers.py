"""Tiers too heavy or too slow for a plain ``uv run pytest``: run when asked for."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def leave_out_unless_asked(
    config: pytest.Config, items: list[pytest.Item], folder: Path, select_env: str, mark: str
) -> None:
    """Deselect the tests of ``folder`` unless the folder (or a file in it) is named on
    the command line, ``select_env`` is 1/yes/all, or the ``-m`` expression names ``mark``."""
    asked = [Path(a.split("::")[0]).resolve() for a in config.args]
    wanted = (
        os.environ.get(select_env, "").lower() in ("1", "yes", "all")
        or mark in (config.option.markexpr or "")
        or any(a == folder or folder in a.parents for a in asked)
    )
    if wanted:
        return
    kept, dropped = [], []
    for item in items:
        (dropped if folder in Path(str(item.path)).parents else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
