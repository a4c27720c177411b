"""A job to create: the options every enqueue entry point takes, checked and serialized once.

``EnqueueOptions`` is the one list of enqueue options: ``jobsd.enqueue``,
``Client.enqueue``, ``SyncClient.enqueue``, ``jobsd.contrib.sqlalchemy.enqueue``,
the HTTP submit and ``jobsd enqueue`` all take it (``**options``) and hand it to
``JobSpec.build``, which checks it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict, Unpack

from pydantic import BaseModel

from jobsd.ids import uuid7, uuid7_ints
from jobsd.jsonsafe import dump_model, encode_object, encode_objects
from jobsd.tracing import current_trace_context

__all__ = [
    "MAX_DEPENDENCIES",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "BatchSpec",
    "EnqueueOptions",
    "JobSpec",
]

# Bounds of a job's priority (lower runs first) and of its dependency list.
PRIORITY_MIN, PRIORITY_MAX = -1_000_000, 1_000_000
MAX_DEPENDENCIES = 1_000


class EnqueueOptions(TypedDict, total=False):
    """The options of an enqueue, all optional (the type, payload and org are arguments)."""

    queue: str
    """A declared queue (``default`` when left out)."""
    dedup_key: str | None
    """At most one pending job of the org holds it: a hit returns that job."""
    run_after: datetime | None
    """Not before this time (timezone-aware)."""
    job_id: uuid.UUID | str | None
    """The job's id, chosen by the caller: a retried enqueue can never make two jobs."""
    priority: int
    """Lower runs first, FIFO within a priority (-1,000,000 to 1,000,000; 0)."""
    concurrency_key: str | None
    """Jobs sharing it run at most their limit at once (1 unless the type or queue says)."""
    depends_on: Iterable[uuid.UUID | str]
    """Job ids that must all succeed first (``blocked`` until then; fails if one fails)."""


_TEXT_OPTIONS = ("queue", "dedup_key", "concurrency_key")


def _check_storable(field: str, text: str) -> None:
    """Refuse text that no Postgres text column can hold: NUL, and lone surrogates
    (which have no UTF-8 form), naming the field (the driver would raise a bare
    UnicodeEncodeError, the database a DatabaseError)."""
    if "\x00" not in text and (text.isascii() or _has_utf8_form(text)):
        return
    raise ValueError(f"{field} must not contain NUL or a lone surrogate: Postgres cannot store it")


def _has_utf8_form(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_type_and_org(type: str, org_id: str) -> None:
    """Refuse a type or org_id the database's CHECKs would refuse, before any SQL."""
    if not type or len(type) > 200:
        raise ValueError("job type must be a non-empty string of at most 200 characters")
    # 63 characters are at most 252 bytes: only a longer org_id needs encoding
    if not org_id or (len(org_id) > 63 and len(org_id.encode("utf-8", "surrogatepass")) > 255):
        raise ValueError("org_id must be a non-empty string of at most 255 bytes")
    _check_storable("type", type)
    _check_storable("org_id", org_id)


def _check_run_after_and_priority(run_after: datetime | None, priority: Any) -> None:
    if run_after is not None and run_after.tzinfo is None:
        raise ValueError("run_after must be timezone-aware")
    if (
        not isinstance(priority, int)
        or isinstance(priority, bool)
        or not PRIORITY_MIN <= priority <= PRIORITY_MAX
    ):
        raise ValueError(
            f"priority must be an integer from {PRIORITY_MIN} to {PRIORITY_MAX}, got {priority!r}"
        )


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A job to create, checked and serialized."""

    id: uuid.UUID
    type: str
    org_id: str
    queue: str
    payload_json: str
    dedup_key: str | None
    run_after: datetime | None
    # the id was given by the caller, or an earlier attempt may have committed it
    id_may_exist: bool
    priority: int = 0
    concurrency_key: str | None = None
    depends_on: tuple[uuid.UUID, ...] = ()
    trace_context: str | None = None
    """the caller's W3C trace context as JSON (jobsd.tracing), None without OpenTelemetry"""

    @classmethod
    def build(
        cls,
        type: str,
        payload: dict[str, Any] | BaseModel | None,
        *,
        org_id: str,
        max_payload_bytes: int | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> JobSpec:
        """Check and serialize the arguments of an enqueue (raises InvalidPayload, ValueError).

        A pydantic model is stored as its JSON-mode dump (``jobsd.jsonsafe``). An
        option that is not one of ``EnqueueOptions`` is a TypeError, as a misspelt
        keyword argument would be.
        """
        if isinstance(payload, BaseModel):
            payload = dump_model(payload)
        if options:
            unknown = sorted(set(options) - EnqueueOptions.__optional_keys__)
            if unknown:
                raise TypeError(f"unknown enqueue option {unknown[0]!r}")
        _check_type_and_org(type, org_id)
        if not options:
            # every option at its default, which passes every check below (a bulk
            # enqueue builds a thousand of these): positional, in field order
            text = encode_object(
                {} if payload is None else payload, what="payload", max_bytes=max_payload_bytes
            )
            return cls(
                uuid7(),
                type,
                org_id,
                "default",  # queue
                text,
                None,  # dedup_key
                None,  # run_after
                False,  # id_may_exist
                0,  # priority
                None,  # concurrency_key
                (),  # depends_on
                current_trace_context(),
            )
        for field in _TEXT_OPTIONS:
            value = options.get(field)
            if value is not None:
                _check_storable(field, value)  # type: ignore[arg-type]
        dedup_key = options.get("dedup_key")
        if dedup_key is not None and len(dedup_key) > 512:
            raise ValueError("dedup_key must be at most 512 characters")
        run_after = options.get("run_after")
        priority = options.get("priority", 0)
        _check_run_after_and_priority(run_after, priority)
        concurrency_key = options.get("concurrency_key")
        if concurrency_key is not None and (
            not concurrency_key or len(concurrency_key.encode("utf-8", "surrogatepass")) > 255
        ):
            raise ValueError("concurrency_key must be a non-empty string of at most 255 bytes")
        text = encode_object(
            {} if payload is None else payload, what="payload", max_bytes=max_payload_bytes
        )
        job_id = options.get("job_id")
        given = uuid.UUID(str(job_id)) if job_id is not None else None
        depends_on = options.get("depends_on")
        deps = _dependency_ids(depends_on) if depends_on is not None else ()
        if given is not None and given in deps:
            raise ValueError(f"job {given} cannot depend on itself")
        return cls(
            id=given or uuid7(),
            type=type,
            org_id=org_id,
            queue=options.get("queue", "default"),
            payload_json=text,
            dedup_key=options.get("dedup_key"),
            run_after=run_after,
            id_may_exist=given is not None,
            priority=priority,
            concurrency_key=concurrency_key,
            depends_on=deps,
            trace_context=current_trace_context(),
        )

    @property
    def operation(self) -> str:
        """Name the enqueue in error messages."""
        return f"enqueue of {self.type!r} into queue {self.queue!r}"

    def insert_params(self, *, blocked: bool = False) -> dict[str, Any]:
        """Return the parameters of ``jobs_insert``."""
        return {
            "id": self.id,
            "org_id": self.org_id,
            "type": self.type,
            "queue": self.queue,
            "dedup_key": self.dedup_key,
            "payload": self.payload_json,
            "run_after": self.run_after,
            "priority": self.priority,
            "concurrency_key": self.concurrency_key,
            "trace_context": self.trace_context,
            "blocked": blocked,
        }


def _dependency_ids(depends_on: Iterable[uuid.UUID | str]) -> tuple[uuid.UUID, ...]:
    if isinstance(depends_on, (str, uuid.UUID)):
        depends_on = [depends_on]
    ids: list[uuid.UUID] = []
    for value in depends_on:
        try:
            key = value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
        except ValueError:
            raise ValueError(f"depends_on: {value!r} is not a job id") from None
        if key not in ids:
            ids.append(key)
    if len(ids) > MAX_DEPENDENCIES:
        raise ValueError(f"depends_on: at most {MAX_DEPENDENCIES} jobs, got {len(ids)}")
    return tuple(ids)


@dataclass(frozen=True, slots=True)
class BatchSpec:
    """Many jobs of one type, org, queue, priority and start time, checked and
    serialized: one id (a UUIDv7, as an integer) and one payload text per job."""

    ids: list[int]
    type: str
    org_id: str
    queue: str
    payload_texts: list[str]
    priority: int
    run_after: datetime | None
    trace_context: str | None

    @classmethod
    def build(
        cls,
        type: str,
        payloads: Iterable[dict[str, Any] | BaseModel | None],
        *,
        org_id: str,
        queue: str = "default",
        priority: int = 0,
        run_after: datetime | None = None,
        max_payload_bytes: int | None = None,
    ) -> BatchSpec:
        """Check and serialize a batch (raises InvalidPayload naming the payload's
        position, PayloadTooLarge, ValueError); the same checks as ``JobSpec.build``."""
        _check_type_and_org(type, org_id)
        _check_storable("queue", queue)
        _check_run_after_and_priority(run_after, priority)
        values = [
            {} if p is None else dump_model(p) if isinstance(p, BaseModel) else p for p in payloads
        ]
        texts = encode_objects(values, what="payload", max_bytes=max_payload_bytes)
        return cls(
            uuid7_ints(len(texts)),
            type,
            org_id,
            queue,
            texts,
            priority,
            run_after,
            current_trace_context(),
        )

    @property
    def operation(self) -> str:
        """Name the enqueue in error messages."""
        return f"bulk enqueue of {len(self.ids)} {self.type!r} jobs into queue {self.queue!r}"
