"""jsonsafe.encode_object rules that need no database: the size cap counts UTF-8 bytes.

What Postgres stores faithfully is tested against the database in
tests/db/test_db_jsonsafe.py."""

from __future__ import annotations

import pytest

from jobsd.errors import InvalidPayload
from jobsd.jsonsafe import encode_object


def test_size_cap_counts_utf8_bytes() -> None:
    text = encode_object({"k": "é" * 10}, what="payload", max_bytes=None)
    size = len(text.encode())
    assert encode_object({"k": "é" * 10}, what="payload", max_bytes=size) == text
    with pytest.raises(InvalidPayload, match=f"{size} bytes, over the limit of {size - 1}"):
        encode_object({"k": "é" * 10}, what="payload", max_bytes=size - 1)
