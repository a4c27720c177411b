"""Typed tasks without a database: what a handler's signature declares, how payloads
are checked and written through its model, and what a retry policy makes of a
payload that does not validate."""

from __future__ import annotations

import datetime as dt
import inspect
import json
import uuid
from decimal import Decimal
from typing import TYPE_CHECKING, Annotated, Any

import pytest
from pydantic import BaseModel, ConfigDict

import jobsd
from jobsd.context import JobContext
from jobsd.errors import ConfigError, InvalidPayload, PayloadMismatch
from jobsd.payloads import decode_payload, encode_payload
from jobsd.registry import Registry
from jobsd.worker.child import resolve

DUE = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
REF = uuid.UUID("0190a5b4-0000-7000-8000-000000000001")


class ImportCsv(BaseModel):
    file: str
    due: dt.datetime
    ref: uuid.UUID
    amount: Decimal = Decimal("0")


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    due: dt.datetime
    ref: uuid.UUID


class Other(BaseModel):
    name: str


def _ctx(payload: dict[str, Any], type: str = "import_csv") -> JobContext:
    return JobContext(
        id=uuid.uuid4(),
        type=type,
        org_id="acme",
        queue="default",
        payload=payload,
        attempt=1,
        checkpoint=None,
    )


async def typed_async(ctx: JobContext, order: ImportCsv) -> dict[str, str]:
    """A module-level typed handler: a handler process can import its task."""
    return {"due": type(order.due).__name__, "ref": type(order.ref).__name__}


def typed_sync(ctx: JobContext, order: ImportCsv) -> dict[str, str]:
    return {"amount": str(order.amount)}


def untyped(ctx: JobContext) -> dict[str, Any]:
    return {"payload": ctx.payload}


MODULE_REGISTRY = Registry()


# Tasks the module holds under their functions' names, as ``@jobsd.handler`` leaves them
@jobsd.handler("typed_task", registry=MODULE_REGISTRY)
def typed_task(ctx: JobContext, order: ImportCsv) -> None: ...


@jobsd.handler("untyped_task", registry=MODULE_REGISTRY)
async def untyped_task(ctx: JobContext) -> None: ...


def test_the_second_parameter_makes_a_handler_typed() -> None:
    registry = Registry()
    typed = jobsd.handler("import_csv", registry=registry)(typed_async)
    plain = jobsd.handler("plain", max_attempts=3, registry=registry)(untyped)

    assert isinstance(typed, jobsd.Task) and typed.model is ImportCsv
    assert typed.type == "import_csv" and typed.__name__ == "typed_async"
    assert plain.model is None and plain.type == "plain"
    spec = registry.get("import_csv")
    assert spec is not None and spec.payload_model is ImportCsv and spec.is_async
    assert spec.target is typed_async and spec.func is not typed_async
    plain_spec = registry.get("plain")
    assert plain_spec is not None and plain_spec.func is untyped
    assert plain_spec.max_attempts == 3


@pytest.mark.anyio
async def test_a_task_calls_its_function_and_the_daemon_calls_it_decoded() -> None:
    registry = Registry()
    typed = jobsd.handler("import_csv", registry=registry)(typed_async)
    plain = jobsd.handler("plain", registry=registry)(untyped)
    order = ImportCsv(file="a.csv", due=DUE, ref=REF)

    # called directly, a task is its function
    assert await typed(_ctx({}), order) == {"due": "datetime", "ref": "UUID"}
    assert plain(_ctx({"x": 1})) == {"payload": {"x": 1}}
    # the daemon calls the registered function with the context alone
    spec = registry.get("import_csv")
    assert spec is not None
    stored = typed.payload(order)
    assert stored == {
        "file": "a.csv",
        "due": "2030-01-02T03:04:05Z",
        "ref": str(REF),
        "amount": "0",
    }
    assert await spec.func(_ctx(stored)) == {"due": "datetime", "ref": "UUID"}


def test_a_sync_typed_handler_stays_sync() -> None:
    registry = Registry()
    jobsd.handler("sum", registry=registry)(typed_sync)
    spec = registry.get("sum")
    assert spec is not None and not spec.is_async
    payload = {"file": "f", "due": "2030-01-02T03:04:05Z", "ref": str(REF), "amount": "1.10"}
    assert spec.func(_ctx(payload, "sum")) == {"amount": "1.10"}


def test_signatures_that_cannot_be_handlers_are_refused_at_import() -> None:
    def three(ctx: JobContext, order: ImportCsv, extra: int) -> None: ...

    def not_a_model(ctx: JobContext, order: dict[str, Any]) -> None: ...

    def unannotated(ctx, order):  # type: ignore[no-untyped-def]
        ...

    with pytest.raises(ConfigError, match="handler of 'x' takes 3 arguments"):
        jobsd.handler("x", registry=Registry())(three)
    with pytest.raises(ConfigError, match="'order' must be annotated with a pydantic model"):
        jobsd.handler("x", registry=Registry())(not_a_model)
    with pytest.raises(ConfigError, match="'order' must be annotated with a pydantic model"):
        jobsd.handler("x", registry=Registry())(unannotated)


def test_a_local_model_the_annotation_cannot_reach_is_refused_clearly() -> None:
    class Local(BaseModel):
        n: int

    def handler(ctx: JobContext, order: Local) -> None: ...

    # ``from __future__ import annotations``: "Local" is a string only a module-level
    # model resolves from
    with pytest.raises(ConfigError, match="cannot resolve the annotation of 'order'"):
        jobsd.handler("x", registry=Registry())(handler)


if TYPE_CHECKING:
    from collections import OrderedDict as OnlyForTypeCheckers


def typed_with_names_of_type_checkers(
    ctx: OnlyForTypeCheckers[str, int], order: Annotated[ImportCsv, "doc"]
) -> OnlyForTypeCheckers[str, int]: ...


def test_only_the_payloads_annotation_needs_to_resolve() -> None:
    task = jobsd.handler("x", registry=Registry())(typed_with_names_of_type_checkers)  # type: ignore[arg-type]
    assert task.model is ImportCsv


def test_extra_parameters_with_defaults_keep_a_handler_untyped() -> None:
    def with_default(ctx: JobContext, verbose: bool = False) -> None: ...

    assert jobsd.handler("x", registry=Registry())(with_default).model is None


def test_stacked_decorators_register_one_function_under_two_types() -> None:
    registry = Registry()
    both = jobsd.handler("a", registry=registry)(jobsd.handler("b", registry=registry)(typed_async))
    assert both.type == "a" and both.func is typed_async and both.model is ImportCsv
    assert registry.types() == ["a", "b"]
    # the same function again under its type is no conflict; another function is
    jobsd.handler("a", registry=registry)(typed_async)
    with pytest.raises(ConfigError, match="job type 'a' already has a handler"):
        jobsd.handler("a", registry=registry)(typed_sync)


def test_a_handler_process_finds_the_tasks_wrapper_by_name() -> None:
    typed_spec = MODULE_REGISTRY.get("typed_task")
    plain_spec = MODULE_REGISTRY.get("untyped_task")
    assert typed_spec is not None and plain_spec is not None
    assert typed_spec.import_ref == f"{__name__}:typed_task._run"
    assert plain_spec.import_ref == f"{__name__}:untyped_task._run"
    assert resolve(typed_spec.import_ref) is typed_spec.func
    assert resolve(plain_spec.import_ref) is untyped_task.func
    assert inspect.iscoroutinefunction(resolve(plain_spec.import_ref))
    # a typed function registered without keeping its task: a child would call the bare
    # function without its payload, so it cannot run in one
    registry = Registry()
    jobsd.handler("bare", registry=registry)(typed_sync)
    bare = registry.get("bare")
    assert bare is not None and bare.import_ref is None


def test_enqueue_validates_and_writes_through_the_model() -> None:
    order = ImportCsv(file="a.csv", due=DUE, ref=REF, amount=Decimal("12.50"))
    written = encode_payload("import_csv", ImportCsv, order)
    assert written == {
        "file": "a.csv",
        "due": "2030-01-02T03:04:05Z",
        "ref": str(REF),
        "amount": "12.50",
    }
    # a dict goes through the model: the same text
    as_dict = {"file": "a.csv", "due": DUE, "ref": str(REF), "amount": "12.50"}
    assert encode_payload("import_csv", ImportCsv, as_dict) == written
    decoded = decode_payload("import_csv", ImportCsv, json.loads(json.dumps(written)))
    assert decoded == order


def test_a_wrong_field_fails_at_enqueue_naming_it() -> None:
    with pytest.raises(PayloadMismatch) as caught:
        encode_payload("import_csv", ImportCsv, {"file": "a", "due": 12.5e20, "ref": str(REF)})
    error = caught.value
    assert isinstance(error, InvalidPayload)
    assert str(error).startswith(
        "invalid payload for import_csv: field 'due': Input should be a valid datetime"
    )
    assert error.type == "import_csv" and [e["loc"] for e in error.errors] == [("due",)]
    with pytest.raises(PayloadMismatch, match="field 'ref': Field required"):
        encode_payload("import_csv", ImportCsv, {"file": "a", "due": DUE})


def test_the_message_never_holds_the_value() -> None:
    with pytest.raises(PayloadMismatch) as caught:
        encode_payload("t", ImportCsv, {"file": "a", "due": "s3cr3t-token", "ref": str(REF)})
    assert "s3cr3t" not in str(caught.value) and "s3cr3t" not in repr(caught.value.errors)


def test_nested_fields_are_named_by_path() -> None:
    class Line(BaseModel):
        sku: str
        qty: int

    class Order(BaseModel):
        lines: list[Line]

    with pytest.raises(PayloadMismatch, match=r"field 'lines\[1\].qty': Input should be"):
        encode_payload("o", Order, {"lines": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": "x"}]})


def test_another_kind_of_payload_is_refused() -> None:
    with pytest.raises(InvalidPayload, match="must be a ImportCsv or a dict, not Other"):
        encode_payload("import_csv", ImportCsv, Other(name="x"))
    with pytest.raises(InvalidPayload, match="not list"):
        encode_payload("import_csv", ImportCsv, [1, 2])


def test_a_strict_model_reads_its_payload_from_json() -> None:
    # strict: a datetime or UUID only from their own type in Python, from text in JSON;
    # what enqueue writes is what the daemon accepts
    written = encode_payload("s", Strict, Strict(due=DUE, ref=REF))
    assert decode_payload("s", Strict, written) == Strict(due=DUE, ref=REF)


def test_the_schedulers_key_is_left_out_of_the_model() -> None:
    payload = {"due": DUE.isoformat(), "ref": str(REF), "_schedule": {"id": "s", "tick": "t"}}
    assert decode_payload("s", Strict, payload) == Strict(due=DUE, ref=REF)
    assert "_schedule" in payload


def test_a_payload_mismatch_is_never_retried() -> None:
    policy = jobsd.RetryPolicy(5, retry_on=(Exception,))
    mismatch = PayloadMismatch("invalid payload for t: field 'x': nope", type="t")
    assert not policy.matches(mismatch)
    assert policy.matches(InvalidPayload("another invalid payload"))
    names = [f"{c.__module__}.{c.__qualname__}" for c in type(mismatch).__mro__]
    assert not policy.matches_names(names)
    assert policy.matches_names(["builtins.ValueError", "builtins.Exception"])
