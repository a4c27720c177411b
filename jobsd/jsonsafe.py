"""Turn payloads and reports into JSON text that Postgres will store, or refuse them clearly.

Python's json accepts things jsonb rejects (NaN, Infinity, the NUL character, lone
surrogates); finding out at INSERT time would abort the caller's transaction, so they
are refused here, before any SQL is sent.

Beyond json's own types, the values a payload commonly holds are written as pydantic's
JSON mode writes them, so a dict and a model give the same text: ``datetime``, ``date``
and ``time`` in ISO 8601, ``UUID`` and ``Decimal`` as strings, a pydantic model as its
JSON-mode dump. Anything else is refused, naming where it is.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Sequence
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError, to_jsonable_python

from jobsd.errors import InvalidPayload, PayloadTooLarge

# an escaped NUL: \u0000 preceded by an even number of backslashes
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# a surrogate code point: never storable on its own (a pair in a str is two of them)
_SURROGATE = re.compile("[\ud800-\udfff]")
_REPLACEMENT = "\ufffd"

__all__ = [
    "ERROR_LABEL_MAX_BYTES",
    "ERROR_MAX_BYTES",
    "ERROR_RECORDS_KEPT",
    "MAX_JSON_DEPTH",
    "TRACEBACK_MAX_BYTES",
    "cap_error",
    "cap_traceback",
    "check_depth",
    "dump_model",
    "encode_object",
    "encode_objects",
    "error_record",
    "storable_json",
    "storable_text",
]

# Nesting deeper than this is refused before any SQL: jobsd must be able to read back
# and serialize whatever it stores (the API's serializer stops far sooner than
# Postgres's own limits). The top-level object counts as one level.
MAX_JSON_DEPTH = 64

# the types written as pydantic's JSON mode writes them; a model is dumped whole
_ENCODED_TYPES = (datetime, date, time, uuid.UUID, Decimal, BaseModel)


def _jsonable(value: Any) -> Any:
    """Return the JSON form of a value of ``_ENCODED_TYPES`` (the encoder's ``default``)."""
    if isinstance(value, _ENCODED_TYPES):
        try:
            return to_jsonable_python(value)
        except PydanticSerializationError as exc:  # a model with a field pydantic cannot dump
            raise TypeError(str(exc)) from exc
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# json.dumps with these options builds an encoder per call (a third of an encode of a
# small payload): one, shared; an encoder keeps no state between calls
_ENCODER = json.JSONEncoder(
    allow_nan=False, ensure_ascii=False, separators=(",", ":"), default=_jsonable
)


def _one_encoder() -> Callable[[Any], str]:
    """Return ``_ENCODER.encode`` for encode_object, without its per-call set-up.

    ``JSONEncoder.encode`` makes a C encoder (``json.encoder.c_make_encoder``) on every
    call: two thirds of the encode of a small payload. The same C encoder, made once,
    is shared: without ``check_circular``, whose markers dict an error would leave
    dirty. A value that contains itself then ends in RecursionError, not in the
    "Circular reference" ValueError, and encode_object refuses both alike (its
    nesting walk names the cycle). ``_ENCODER.encode`` where the C encoder is missing.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _ENCODER.encode
    c_encode = make(
        None,  # no markers: no check for cycles
        _ENCODER.default,
        json.encoder.encode_basestring,  # ensure_ascii=False
        None,  # indent
        ":",
        ",",
        False,  # sort_keys
        False,  # skipkeys
        False,  # allow_nan
    )

    def encode(value: Any) -> str:
        return "".join(c_encode(value, 0))

    return encode


_encode = _one_encoder()

# the CHECK on jobsd.jobs.error: longer text goes into the report
ERROR_MAX_BYTES = 2048
_TRUNCATED = " [truncated]"


def encode_object(value: Any, *, what: str, max_bytes: int | None) -> str:
    """Serialize a JSON object (a dict) for a jsonb column.

    Raises InvalidPayload naming ``what`` when the value is not a JSON object, holds
    something jsonb cannot store, or is larger than ``max_bytes`` bytes of UTF-8.
    """
    if not isinstance(value, dict):
        raise InvalidPayload(f"{what} must be a JSON object, not {type(value).__name__}")
    try:
        text = _encode(value)
    except RecursionError as exc:
        check_depth(value, what=what)
        raise InvalidPayload(f"{what} is nested too deeply to serialize") from exc
    except ValueError as exc:
        check_depth(value, what=what)  # a value that contains itself: nested without end
        raise InvalidPayload(f"{what} is not valid JSON: {exc}") from exc
    except TypeError as exc:
        raise InvalidPayload(f"{what} is not JSON-serializable: {_unencodable(value)}") from exc
    # nesting needs an opening bracket per level: the walk (a Python loop over every
    # value) only when the text holds more of them than the limit allows
    if text.count("{") + text.count("[") > MAX_JSON_DEPTH:
        check_depth(value, what=what)
    if "\\u0000" in text and _ESCAPED_NUL.search(text):
        raise InvalidPayload(f"{what} contains a NUL character (\\u0000), which Postgres rejects")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidPayload(f"{what} contains a lone surrogate, which Postgres rejects") from exc
    if max_bytes is not None and size > max_bytes:
        raise PayloadTooLarge(f"{what} is {size} bytes, over the limit of {max_bytes} bytes")
    return text


def encode_objects(values: Sequence[Any], *, what: str, max_bytes: int | None) -> list[str]:
    """``encode_object`` for many values at once, for a bulk enqueue.

    Each value is written by the same C encoder; the checks (depth, NUL, lone
    surrogates, size) run over the whole batch in a few passes, not a Python loop of
    checks per value. A batch that fails one is checked again value by value, so the
    error names the first bad value: ``payload 3 contains a NUL character ...``.
    """
    texts: list[str] | None = None
    if all(type(v) is dict for v in values):
        try:
            texts = [_encode(v) for v in values]
        except (RecursionError, ValueError, TypeError):
            texts = None
    if texts is not None and _batch_passes(texts, max_bytes):
        return texts
    return [encode_object(v, what=f"{what} {k}", max_bytes=max_bytes) for k, v in enumerate(values)]


def _batch_passes(texts: list[str], max_bytes: int | None) -> bool:
    """Say whether every text of a batch passes encode_object's checks."""
    joined = "".join(texts)
    if "\\u0000" in joined and _ESCAPED_NUL.search(joined):
        return False
    if joined.count("{") + joined.count("[") > MAX_JSON_DEPTH and any(
        t.count("{") + t.count("[") > MAX_JSON_DEPTH for t in texts
    ):
        return False
    try:
        joined.encode("utf-8")
    except UnicodeEncodeError:
        return False
    if max_bytes is None:
        return True
    # a code point is at most 4 bytes of UTF-8: only a text that long can be over
    return all(len(t) * 4 <= max_bytes or len(t.encode("utf-8")) <= max_bytes for t in texts)


def dump_model(model: BaseModel, *, what: str = "payload") -> dict[str, Any]:
    """Return a pydantic model's JSON-mode dump (InvalidPayload if pydantic cannot make one)."""
    try:
        return model.model_dump(mode="json")
    except PydanticSerializationError as exc:
        raise InvalidPayload(f"{what} is not JSON-serializable: {exc}") from exc


def _unencodable(value: Any) -> str:
    """Say where the first value json cannot write is, and what it is."""
    stack: list[tuple[Any, str]] = [(value, "")]
    seen: set[int] = set()  # a value that contains itself is walked once
    while stack:
        item, path = stack.pop()
        if isinstance(item, dict | list | tuple):
            if id(item) in seen:
                continue
            seen.add(id(item))
        if isinstance(item, dict):
            for key in item:
                if key is not None and not isinstance(key, str | int | float | bool):
                    return f"{_where(path)} has a key of type {type(key).__name__}"
            children = [(v, f"{path}.{k}" if path else str(k)) for k, v in item.items()]
            stack.extend(reversed(children))
        elif isinstance(item, list | tuple):
            stack.extend(reversed([(v, f"{path}[{i}]") for i, v in enumerate(item)]))
        elif item is not None and not isinstance(item, (str, int, float, bool, *_ENCODED_TYPES)):
            return (
                f"{_where(path)} is of type {type(item).__name__} (jobsd writes datetime, "
                "date, time, UUID, Decimal and pydantic models; convert the others first)"
            )
    return "a value json cannot write"


def _where(path: str) -> str:
    return f"field {path!r}" if path else "it"


def check_depth(value: Any, *, what: str, limit: int = MAX_JSON_DEPTH) -> None:
    """Raise InvalidPayload naming ``what`` when containers nest more than ``limit`` deep.

    Iterative, so a value nested past the recursion limit is refused, not crashed on.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            raise InvalidPayload(f"{what} is nested more than {limit} levels deep")
        stack.extend((child, depth + 1) for child in children)


def storable_text(text: str) -> str:
    """Return ``text`` with what Postgres cannot store (NUL, lone surrogates) replaced by U+FFFD.

    For diagnostics (error messages, reasons) that must be written whatever they hold.
    """
    return _SURROGATE.sub(_REPLACEMENT, text.replace("\x00", _REPLACEMENT))


def cap_error(text: str, *, mark: bool = True) -> str:
    """Make an error message fit the error column: storable characters, at most 2 KiB.

    A longer message is cut on a character boundary and, with ``mark``, ends with
    `` [truncated]`` (the full text goes into the report). The store cuts again
    without a mark whatever it writes, as the last guard of the column's CHECK.
    """
    clean = storable_text(text)
    data = clean.encode("utf-8")
    if len(data) <= ERROR_MAX_BYTES:
        return clean
    marker = _TRUNCATED if mark else ""
    return data[: ERROR_MAX_BYTES - len(marker)].decode("utf-8", "ignore") + marker


# An attempt's error record (jobsd.jobs.errors, migration 0028): its message has the
# error column's cap, its traceback keeps its end, its type and cause are short; the
# records of the last ERROR_RECORDS_KEPT attempts are kept. The caps of records live
# here, and only here: the daemon applies them, the SQL that stores records is told
# how many to keep. (jobs_errors_size bounds the column far above these.)
ERROR_RECORDS_KEPT = 10
TRACEBACK_MAX_BYTES = 16384
ERROR_LABEL_MAX_BYTES = 512
"""the cap of a record's ``type`` and ``cause``"""
_TRACEBACK_CUT = "[traceback cut: its first {cut} bytes are not kept]\n"
# a cut traceback starts at a line's start when one begins this close to the cut
_LINE_START_WITHIN = 1024


def _cap_bytes(text: str, max_bytes: int) -> str:
    """Return storable ``text`` cut to at most ``max_bytes`` of UTF-8, on a character
    boundary."""
    clean = storable_text(text)
    data = clean.encode("utf-8")
    if len(data) <= max_bytes:
        return clean
    return data[:max_bytes].decode("utf-8", "ignore")


def cap_traceback(text: str) -> str:
    """Make a traceback fit a record: storable characters, at most 16 KiB of UTF-8.

    A longer one keeps its end (where the exception and the innermost frames are),
    from the start of a line when one is near, after a first line saying how many
    bytes were cut: ``[traceback cut: its first 83712 bytes are not kept]``.
    """
    clean = storable_text(text)
    data = clean.encode("utf-8")
    if len(data) <= TRACEBACK_MAX_BYTES:
        return clean
    # the header's room with the most digits the count can have (it is < len(data))
    room = TRACEBACK_MAX_BYTES - len(_TRACEBACK_CUT.format(cut=len(data)).encode("utf-8"))
    kept = data[len(data) - room :].decode("utf-8", "ignore")
    line = kept.find("\n", 0, _LINE_START_WITHIN)
    if line >= 0:
        kept = kept[line + 1 :]
    cut = len(data) - len(kept.encode("utf-8"))
    return _TRACEBACK_CUT.format(cut=cut) + kept


def error_record(
    message: str, *, cause: str, type: str | None = None, traceback: str | None = None
) -> dict[str, Any]:
    """Return an attempt's error record as the daemon writes it, every text storable
    and within its cap; the database adds ``attempt`` and ``at``.

    ``cause`` is why the attempt ended (``handler error``, ``timeout``, ``worker
    lost``...); ``type`` the exception's ``module.Qualname``, if one was raised.
    """
    return {
        "type": _cap_bytes(type, ERROR_LABEL_MAX_BYTES) if type is not None else None,
        "message": cap_error(message),
        "traceback": cap_traceback(traceback) if traceback is not None else None,
        "cause": _cap_bytes(cause, ERROR_LABEL_MAX_BYTES),
    }


def storable_json(value: Any) -> str:
    """Serialize ``value`` for a jsonb or text column, replacing what Postgres cannot store.

    Strings (keys too) lose NUL and lone surrogates as in ``storable_text``, so one odd
    value cannot fail a statement that writes many jobs. Raises InvalidPayload for NaN,
    infinities and values json cannot serialize.
    """
    try:
        text = _ENCODER.encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidPayload(f"value is not storable as JSON: {exc}") from exc
    # each pass only where it can match (twice per finished job otherwise)
    if not text.isascii():
        text = _SURROGATE.sub(_REPLACEMENT, text)
    if "\\u0000" in text:
        text = _ESCAPED_NUL.sub(lambda m: m.group(0)[:-6] + "\\ufffd", text)
    return text
