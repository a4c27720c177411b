"""Plain payloads: the values pydantic's JSON mode writes are written as it writes them
(so a dict and a model give the same JSON); the others are refused, naming their field."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from decimal import Decimal
from typing import Any

import pytest
from pydantic import BaseModel

from jobsd.errors import InvalidPayload
from jobsd.jobspec import JobSpec
from jobsd.jsonsafe import encode_object

DUE = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
REF = uuid.UUID("0190a5b4-0000-7000-8000-000000000001")


class Other(BaseModel):
    name: str


class Order(BaseModel):
    due: dt.datetime
    ref: uuid.UUID


@pytest.mark.parametrize(
    ("value", "written"),
    [
        (DUE, '"2030-01-02T03:04:05Z"'),
        (dt.date(2030, 1, 2), '"2030-01-02"'),
        (dt.time(3, 4, 5), '"03:04:05"'),
        (REF, f'"{REF}"'),
        (Decimal("1.10"), '"1.10"'),
        (Other(name="x"), '{"name":"x"}'),
    ],
    ids=["datetime", "date", "time", "uuid", "decimal", "model"],
)
def test_a_plain_payload_writes_what_pydantic_json_mode_writes(value: Any, written: str) -> None:
    assert encode_object({"v": value}, what="payload", max_bytes=None) == f'{{"v":{written}}}'


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"tags": {"a"}}, "field 'tags' is of type set"),
        ({"a": [1, {"b": b"x"}]}, r"field 'a\[1\].b' is of type bytes"),
        ({"a": {(1, 2): 3}}, "field 'a' has a key of type tuple"),
    ],
)
def test_other_values_are_refused_naming_their_field(payload: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidPayload, match=f"payload is not JSON-serializable: {message}"):
        encode_object(payload, what="payload", max_bytes=None)


def test_a_model_is_a_payload_of_every_enqueue() -> None:
    spec = JobSpec.build("t", Order(due=DUE, ref=REF), org_id="acme")
    assert json.loads(spec.payload_json) == {"due": "2030-01-02T03:04:05Z", "ref": str(REF)}
