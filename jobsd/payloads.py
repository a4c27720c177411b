"""Check payloads against a typed handler's pydantic model: at enqueue, and before a run.

At enqueue, a model instance or a dict is validated, written as the model's JSON-mode
dump (``datetime`` in ISO 8601, ``UUID`` and ``Decimal`` as strings), and that dump
is validated once more from JSON, as the daemon will read it: a payload accepted at
enqueue is one the handler accepts (strict models included). Before a run the job's
payload is validated from JSON the same way, without the scheduler's ``_schedule``
key (a model field cannot start with an underscore; ``ctx.payload`` keeps it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from jobsd.errors import InvalidPayload, PayloadMismatch
from jobsd.jsonsafe import dump_model

__all__ = ["SCHEDULE_KEY", "decode_payload", "encode_payload"]

M = TypeVar("M", bound=BaseModel)

SCHEDULE_KEY = "_schedule"
"""the key the scheduler adds to a periodic job's payload (``jobsd.periodic``)"""

# the most problems one message lists; ``errors`` keeps them all
_LISTED = 5


def encode_payload(type: str, model: type[BaseModel], payload: object) -> dict[str, Any]:
    """Return ``payload`` (a ``model``, a dict, or None for ``{}``) as it is stored.

    Raises PayloadMismatch naming the fields that do not validate, InvalidPayload for
    another kind of value.
    """
    try:
        if isinstance(payload, model):
            data = dump_model(payload)
        elif payload is None or isinstance(payload, Mapping):
            data = dump_model(model.model_validate(dict(payload or {})))
        else:
            raise InvalidPayload(
                f"payload for {type} must be a {model.__name__} or a dict, "
                f"not {payload.__class__.__name__}"
            )
        model.model_validate_json(json.dumps(data))  # what the daemon will do
    except ValidationError as exc:
        raise _mismatch(type, exc) from None
    return data


def decode_payload(type: str, model: type[M], payload: Mapping[str, Any]) -> M:
    """Return a job's payload validated through ``model``; raise PayloadMismatch."""
    if SCHEDULE_KEY in payload:
        payload = {k: v for k, v in payload.items() if k != SCHEDULE_KEY}
    try:
        return model.model_validate_json(json.dumps(payload))
    except ValidationError as exc:
        raise _mismatch(type, exc) from None


def _mismatch(type: str, exc: ValidationError) -> PayloadMismatch:
    """Say which fields failed and why, without their values (a payload may hold secrets)."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    problems = [_problem(error["loc"], error["msg"]) for error in errors[:_LISTED]]
    if len(errors) > _LISTED:
        problems.append(f"and {len(errors) - _LISTED} more")
    return PayloadMismatch(
        f"invalid payload for {type}: {'; '.join(problems)}",
        type=type,
        errors=[dict(error) for error in errors],
    )


def _problem(loc: tuple[int | str, ...], message: str) -> str:
    if not loc:
        return message
    path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc)
    return f"field {path.removeprefix('.')!r}: {message}"
