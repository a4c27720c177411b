"""jsonsafe.encode_object accepts exactly the objects Postgres jsonb stores faithfully.

The oracle is the database itself: the value is sent as plain JSON (ASCII escapes,
NaN allowed) to ``SELECT %s::jsonb``; it counts as storable when Postgres accepts it
and gives back an equal value.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobsd.errors import InvalidPayload
from jobsd.jsonsafe import encode_object, storable_json, storable_text

# Characters of every category, lone surrogates included, plus the usual suspects.
_chars = st.one_of(
    st.characters(exclude_categories=()),
    st.sampled_from(["\x00", "\ud800", "\udbff", "\udc00", "\udfff", "\\", '"', "é", "😀"]),
)
_text = st.text(_chars, max_size=8) | st.sampled_from(["\\u0000", "\\\\u0000", "\ud83d\ude00"])
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | _text
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12,
)
_objects = st.dictionaries(_text, _values, max_size=5)


@pytest.fixture(scope="module")
def pg(admin_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection for jsonb round trips; no jobsd schema needed."""
    with psycopg.connect(admin_url, autocommit=True) as c:
        yield c


def _same(stored: Any, original: Any) -> bool:
    """Compare a value read back from jsonb with the one sent (jsonb normalizes numbers)."""
    if isinstance(original, bool) or original is None:
        return stored is original
    if isinstance(original, float):
        return (
            not isinstance(stored, bool)
            and isinstance(stored, int | float)
            and (float(stored) == original)
        )
    if isinstance(original, int):
        return type(stored) is int and stored == original
    if isinstance(original, str):
        return stored == original
    if isinstance(original, list):
        return (
            isinstance(stored, list)
            and len(stored) == len(original)
            and all(_same(s, o) for s, o in zip(stored, original, strict=True))
        )
    assert isinstance(original, dict)
    return (
        isinstance(stored, dict)
        and stored.keys() == original.keys()
        and all(_same(stored[k], v) for k, v in original.items())
    )


def _jsonb(pg: psycopg.Connection[Any], text: str) -> tuple[bool, Any]:
    try:
        row = pg.execute("SELECT %s::jsonb", (text,)).fetchone()
    except psycopg.DataError:
        return False, None
    assert row is not None
    return True, row[0]


def _postgres_stores(pg: psycopg.Connection[Any], value: dict[str, Any]) -> bool:
    accepted, stored = _jsonb(pg, json.dumps(value, ensure_ascii=True, allow_nan=True))
    return accepted and _same(stored, value)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(value=_objects)
def test_encode_object_accepts_exactly_what_jsonb_stores(
    pg: psycopg.Connection[Any], value: dict[str, Any]
) -> None:
    expected = _postgres_stores(pg, value)
    try:
        text = encode_object(value, what="payload", max_bytes=None)
    except InvalidPayload:
        assert not expected, f"refused a value Postgres stores: {value!r}"
        return
    assert expected, f"accepted a value Postgres rejects or alters: {value!r}"
    accepted, stored = _jsonb(pg, text)
    assert accepted and _same(stored, value)


@pytest.mark.parametrize(
    "value",
    [
        {"x": math.nan},
        {"x": -math.inf},
        {"x": "\x00"},
        {"\x00": 1},
        {"x": "\ud800"},
        {"x": "\ud83d\ude00"},  # a surrogate pair as two code points: jsonb would merge it
    ],
)
def test_known_rejects_agree_with_postgres(pg: psycopg.Connection[Any], value: Any) -> None:
    assert not _postgres_stores(pg, value)
    with pytest.raises(InvalidPayload):
        encode_object(value, what="payload", max_bytes=None)


def test_non_objects_are_refused_whatever_jsonb_thinks(pg: psycopg.Connection[Any]) -> None:
    for value in ([1], "x", 3, None, True):
        assert _jsonb(pg, json.dumps(value))[0]
        with pytest.raises(InvalidPayload, match="must be a JSON object"):
            encode_object(value, what="report", max_bytes=None)


_finite = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12,
)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(value=_finite)
def test_storable_json_is_always_accepted_and_keeps_clean_values(
    pg: psycopg.Connection[Any], value: Any
) -> None:
    text = storable_json(value)
    accepted, stored = _jsonb(pg, text)
    assert accepted, f"Postgres refused {text!r}"
    if _postgres_stores(pg, {"v": value}):
        assert _same(stored, value)  # nothing to replace: unchanged


def test_storable_text_replaces_only_what_postgres_cannot_store(
    pg: psycopg.Connection[Any],
) -> None:
    odd = "a\x00b\ud800c\udfffd\\u0000é😀"
    clean = storable_text(odd)
    assert clean == "a\ufffdb\ufffdc\ufffdd\\u0000é😀"
    row = pg.execute("SELECT %s::text", (clean,)).fetchone()
    assert row == (clean,)
    with pytest.raises(InvalidPayload):
        storable_json({"x": math.nan})
