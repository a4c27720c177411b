"""jsonsafe.encode_object rules that need no database: the size cap counts UTF-8 bytes.

What Postgres stores faithfully is tested against the database in
tests/db/test_db_jsonsafe.py."""

from __future__ import annotations

import pytest

from jobsd.errors import InvalidPayload
from jobsd.jsonsafe import MAX_JSON_DEPTH, encode_object


def test_size_cap_counts_utf8_bytes() -> None:
    text = encode_object({"k": "é" * 10}, what="payload", max_bytes=None)
    size = len(text.encode())
    assert encode_object({"k": "é" * 10}, what="payload", max_bytes=size) == text
    with pytest.raises(InvalidPayload, match=f"{size} bytes, over the limit of {size - 1}"):
        encode_object({"k": "é" * 10}, what="payload", max_bytes=size - 1)


def _nested(depth: int) -> dict[str, object]:
    """Return an object whose containers nest ``depth`` deep (the object is level 1)."""
    value: object = []
    for _ in range(depth - 2):
        value = [value]
    return {"a": value}


def test_nesting_up_to_the_limit_is_accepted_and_beyond_refused() -> None:
    assert encode_object(_nested(MAX_JSON_DEPTH), what="payload", max_bytes=None)
    with pytest.raises(InvalidPayload, match="payload is nested more than 64 levels deep"):
        encode_object(_nested(MAX_JSON_DEPTH + 1), what="payload", max_bytes=None)


def test_nesting_past_the_recursion_limit_is_refused_not_crashed_on() -> None:
    with pytest.raises(InvalidPayload, match="nested more than"):
        encode_object(_nested(200_000), what="report", max_bytes=None)
    loop: dict[str, object] = {}
    loop["self"] = loop
    with pytest.raises(InvalidPayload, match="nested more than"):
        encode_object(loop, what="payload", max_bytes=None)
