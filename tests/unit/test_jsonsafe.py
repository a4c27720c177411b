"""jsonsafe.encode_object rules that need no database: the size cap counts UTF-8 bytes.

What Postgres stores faithfully is tested against the database in
tests/db/test_db_jsonsafe.py."""

from __future__ import annotations

import enum

import pytest

from jobsd import jsonsafe
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


class _Level(enum.IntEnum):
    HIGH = 2


class _Text(str):
    pass


def _cases() -> list[object]:
    shared = {"x": 1}
    loop: dict[str, object] = {}
    loop["self"] = loop
    deep_loop: dict[str, object] = {"a": [{"b": []}]}
    deep_loop["a"][0]["b"].append(deep_loop)  # type: ignore[index]
    return [
        {},
        {"i": 1, "f": 1.5, "b": True, "n": None, "s": 'é\u2028"\\', "l": [1, (2, 3)]},
        {1: "int key", 2.5: "float key", False: "bool key", None: "none key"},
        {"big": 10**30, "neg": -0.0, "e": 1e300, "enum": _Level.HIGH, "sub": _Text("t")},
        {"twice": [shared, shared]},
        {"nan": float("nan")},
        {"inf": [float("-inf")]},
        {"set": {1}},
        {"bytes": b"x"},
        {("tuple", "key"): 1},
        {"nul": "a\x00b"},
        {"surrogate": "\ud800"},
        loop,
        deep_loop,
        _nested(MAX_JSON_DEPTH),
        _nested(MAX_JSON_DEPTH + 1),
        _nested(5_000),
        [1],
    ]


def _outcome(value: object) -> tuple[str, str]:
    try:
        return ("ok", encode_object(value, what="payload", max_bytes=None))
    except Exception as exc:  # the outcome compared is any exception
        return (type(exc).__name__, str(exc))


def test_the_shared_encoder_gives_what_json_encoder_encode_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the one C encoder (made once, without the check for cycles) against a
    # JSONEncoder.encode per call: the same text, or the same refusal, for each value
    cases = _cases()
    fast = [_outcome(value) for value in cases]
    monkeypatch.setattr(jsonsafe, "_encode", jsonsafe._ENCODER.encode)
    reference = [_outcome(value) for value in cases]

    assert fast == reference
    assert {kind for kind, _ in fast} == {"ok", "InvalidPayload"}


def test_a_batch_is_encoded_as_each_value_alone() -> None:
    from jobsd.jsonsafe import encode_object, encode_objects

    values = [{"i": i, "s": "é\\"} for i in range(5)]
    assert encode_objects(values, what="payload", max_bytes=100) == [
        encode_object(v, what="payload", max_bytes=100) for v in values
    ]


def test_a_bad_value_in_a_batch_is_named_by_its_position() -> None:
    import pytest

    from jobsd.errors import InvalidPayload, PayloadTooLarge
    from jobsd.jsonsafe import encode_objects

    deep: dict[str, object] = {}
    node = deep
    for _ in range(100):
        node["a"] = {}
        node = node["a"]  # type: ignore[assignment]
    with pytest.raises(InvalidPayload, match="payload 1 is nested"):
        encode_objects([{}, deep], what="payload", max_bytes=None)
    with pytest.raises(PayloadTooLarge, match="payload 0 is 14 bytes, over the limit of 12"):
        encode_objects([{"s": "ééé"}, {}], what="payload", max_bytes=12)
