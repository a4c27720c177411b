"""Make UUIDv7 job ids on the client, so a submission can be retried without a duplicate."""

from __future__ import annotations

import os
import time
import uuid

__all__ = ["uuid7"]


def uuid7() -> uuid.UUID:
    """Return a new UUIDv7: 48 bits of Unix milliseconds, then 74 random bits.

    The layout is the one ``jobsd.uuidv7()`` makes in the database, so ids made on either
    side sort by creation time together.
    """
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & 0xFFFF_FFFF_FFFF) << 80
    value |= 0x7 << 76  # version
    value |= ((rand >> 62) & 0xFFF) << 64  # 12 random bits
    value |= 0b10 << 62  # variant
    value |= rand & 0x3FFF_FFFF_FFFF_FFFF  # 62 random bits
    return uuid.UUID(int=value)
