"""Reading UUIDv7 ids back: their clock and their version, for the id tests of two tiers."""

from __future__ import annotations

import uuid


def unix_ms(u: uuid.UUID) -> int:
    """Return the Unix time in milliseconds a UUIDv7 carries."""
    return u.int >> 80


def assert_v7(ids: list[uuid.UUID]) -> None:
    """Fail unless every id is an RFC 4122 UUID of version 7."""
    assert {u.version for u in ids} == {7}
    assert {u.variant for u in ids} == {uuid.RFC_4122}
