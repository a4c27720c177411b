"""Sizes in bytes from numbers or strings such as ``"512MB"`` or ``"1.5GiB"``."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["parse_size"]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)


def parse_size(value: Any) -> int:
    """Read a positive size in bytes: ``1048576``, ``"512MB"``, ``"512MiB"``, ``"2G"``.

    ``K``, ``M``, ``G``, ``T`` (with or without ``B``) are powers of 1000; with ``i``
    (``KiB``, ``MiB``) powers of 1024.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int | float):
        size = int(value)
    else:
        match = _SIZE.match(str(value))
        if match is None:
            raise ValueError(f"not a size: {value!r} (use bytes, or 512MB, 512MiB, 2GB)")
        unit = (match.group(2) or "").lower()
        base = 1024 if "i" in unit else 1000
        power = "bkmgt".find(unit[:1]) if unit[:1] in "kmgt" and unit else 0
        size = int(float(match.group(1)) * (base**power if power > 0 else 1))
    if size <= 0:
        raise ValueError(f"a size must be positive, not {value!r}")
    return size
