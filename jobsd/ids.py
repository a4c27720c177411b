"""Make UUIDv7 job ids on the client, so a submission can be retried without a duplicate.

The layout is Postgres 18's ``uuidv7()``, which ``jobsd.uuidv7()`` also builds on older
servers: 48 bits of Unix milliseconds, the version, 12 bits of sub-millisecond fraction,
the variant, then 62 random bits. Ids made in one process are strictly increasing, so
jobs enqueued in one transaction (same ``created_at``) are claimed in enqueue order.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

__all__ = ["uuid7"]

_NS_PER_MS = 1_000_000
_FRACTION_STEPS = 4096  # 12 bits of sub-millisecond fraction
_RANDOM_BITS = 62

_lock = threading.Lock()
# the timestamp part (ms << 12 | fraction) of the last id made in this process
_last_stamp = -1


def uuid7() -> uuid.UUID:
    """Return a new UUIDv7, greater than every one this process made before.

    When the clock has not moved on by a fraction step (about 244 ns) since the last id,
    or went backwards, the timestamp is advanced by one step instead.
    """
    global _last_stamp
    ms, sub_ms = divmod(time.time_ns(), _NS_PER_MS)
    stamp = (ms << 12) | (sub_ms * _FRACTION_STEPS // _NS_PER_MS)
    with _lock:
        if stamp <= _last_stamp:
            stamp = _last_stamp + 1
        _last_stamp = stamp
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << _RANDOM_BITS) - 1)
    value = (stamp >> 12) << 80  # unix milliseconds
    value |= 0x7 << 76  # version
    value |= (stamp & 0xFFF) << 64  # sub-millisecond fraction
    value |= 0b10 << 62  # variant
    value |= rand
    return uuid.UUID(int=value & ((1 << 128) - 1))
