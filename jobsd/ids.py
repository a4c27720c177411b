"""Make UUIDv7 job ids on the client, so a submission can be retried without a duplicate.

The layout is Postgres 18's ``uuidv7()``, which ``jobsd.uuidv7()`` also builds on older
servers: 48 bits of Unix milliseconds, the version, 12 bits of sub-millisecond fraction,
the variant, then 62 random bits. Ids made in one process are strictly increasing, so
jobs enqueued in one transaction (same ``created_at``) are claimed in enqueue order.
"""

from __future__ import annotations

import os
import struct
import threading
import time
import uuid

__all__ = ["uuid7", "uuid7_ints", "uuid_of_int"]

_NS_PER_MS = 1_000_000
_FRACTION_STEPS = 4096  # 12 bits of sub-millisecond fraction
_MS_MASK = (1 << 48) - 1
_VERSION = 0x7 << 12  # in the high 64 bits, above the fraction
_VARIANT = 0b10 << 62  # in the low 64 bits, above the random bits
_RANDOM_MASK = (1 << 62) - 1

# Random bits are drawn for this many ids per os.urandom call: one syscall per id
# was a sixth of an id's cost. The same quality of randomness, only fetched ahead.
_RANDOM_BATCH = 512
_unpack_random = struct.Struct(f">{_RANDOM_BATCH}Q").unpack

_lock = threading.Lock()
# the timestamp part (ms << 12 | fraction) of the last id made in this process
_last_stamp = -1
# random 64-bit values drawn ahead, used from the end; never shared with a forked child
_randoms: list[int] = []


def _forget_randoms() -> None:
    """In a forked child: drop the values drawn ahead, which the parent uses too (the
    same stamp and random part would make the same id in both)."""
    _randoms.clear()


os.register_at_fork(after_in_child=_forget_randoms)

_new_object = object.__new__
_set_slot = object.__setattr__
_SAFE_UNKNOWN = uuid.SafeUUID.unknown


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
        if not _randoms:
            _randoms.extend(_unpack_random(os.urandom(8 * _RANDOM_BATCH)))
        rand = _randoms.pop()
    high = ((stamp >> 12) & _MS_MASK) << 16 | _VERSION | (stamp & 0xFFF)
    return _uuid_from_int((high << 64) | _VARIANT | (rand & _RANDOM_MASK))


def _uuid_from_int(value: int) -> uuid.UUID:
    """Return ``uuid.UUID(int=value)`` for a value known to fit in 128 bits.

    ``UUID.__init__`` checks its five ways of being called (half the cost of an id);
    this sets the two slots it would set, as Python 3.14's ``UUID._from_int`` does.
    """
    made: uuid.UUID = _new_object(uuid.UUID)
    _set_slot(made, "int", value)
    _set_slot(made, "is_safe", _SAFE_UNKNOWN)
    return made


def uuid7_ints(n: int) -> list[int]:
    """Return ``n`` new UUIDv7 as integers, increasing, greater than every id this process
    made before: ``uuid7`` for a batch, the lock taken and the clock read once (a batch
    of a thousand ids takes a quarter of a millisecond of fraction steps)."""
    global _last_stamp
    if n <= 0:
        return []
    ms, sub_ms = divmod(time.time_ns(), _NS_PER_MS)
    stamp = (ms << 12) | (sub_ms * _FRACTION_STEPS // _NS_PER_MS)
    randoms = struct.unpack(f">{n}Q", os.urandom(8 * n))
    with _lock:
        first = max(stamp, _last_stamp + 1)
        _last_stamp = first + n - 1
    ids = []
    for k in range(n):
        s = first + k
        high = ((s >> 12) & _MS_MASK) << 16 | _VERSION | (s & 0xFFF)
        ids.append((high << 64) | _VARIANT | (randoms[k] & _RANDOM_MASK))
    return ids


def uuid_of_int(value: int) -> uuid.UUID:
    """Return the ``uuid.UUID`` of a 128-bit integer made by ``uuid7_ints``."""
    return _uuid_from_int(value)
