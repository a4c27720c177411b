"""Build, write and check a JSON snapshot of the queues and open jobs (docs/snapshot.md).

Everything is read in one read-only REPEATABLE READ transaction, so the document
shows one moment of the database: each queue's depth counts exactly the jobs listed.
Jobs stream from a server-side cursor to the output, one line each, so a large table
is never one list in memory.

``write_snapshot_file`` writes a temporary file beside the target, fsyncs it, renames
it over the target and fsyncs the directory: whoever reads the target, even after a
crash or a ``kill -9`` in the middle of an export, finds the old snapshot or the new
one, never part of one.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO

from jobsd.errors import ConfigError, MigrationError
from jobsd.models import OPEN_STATES
from jobsd.store import snapshot as store

__all__ = [
    "CONTRACT",
    "OPEN_STATES",
    "SnapshotSummary",
    "validate_snapshot",
    "write_snapshot",
    "write_snapshot_file",
]

CONTRACT = "jobsd.snapshot.v1"


@dataclass(frozen=True, slots=True)
class SnapshotSummary:
    """What one export wrote."""

    generated_at: datetime
    queues: int
    jobs: int
    replica: bool = False
    """True: read on the read replica (``JOBSD_READ_DATABASE_URL``)."""
    lag_s: float | None = None
    """The replica's delay behind the primary, in seconds (None: unknown, or primary)."""


def write_snapshot(url: str, out: BinaryIO, *, read_url: str | None = None) -> SnapshotSummary:
    """Write a snapshot of the database at ``url`` to ``out`` (UTF-8), as it streams;
    read on ``read_url`` (a replica) when it answers."""
    with _consistent_view(url, read_url) as view:
        return _write(view, out)


def write_snapshot_file(url: str, path: Path, *, read_url: str | None = None) -> SnapshotSummary:
    """Write a snapshot to ``path`` atomically: the old file stays until the new is whole.

    The temporary file is ``.<name>.tmp-<pid>-<random>`` in the target's directory
    (a rename is atomic only within one file system), created readable by its owner
    only; the target gets that mode. On any error the temporary file is removed and
    the target is left as it was; only a killed process leaves its temporary file.
    """
    target = Path(path)
    directory = target.absolute().parent
    temporary: Path | None = None
    try:
        with _consistent_view(url, read_url) as view:
            fd, name = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.tmp-{os.getpid()}-")
            temporary = Path(name)
            with os.fdopen(fd, "wb") as out:
                summary = _write(view, out)
                out.flush()
                os.fsync(out.fileno())
        os.replace(temporary, target)
    except BaseException:
        if temporary is not None:
            temporary.unlink(missing_ok=True)
        raise
    _fsync_directory(directory)
    return summary


@dataclass(frozen=True, slots=True)
class _View:
    """The open read transaction, with the small parts of the snapshot already read."""

    reader: store.SnapshotReader
    header: dict[str, Any]
    queues: list[dict[str, Any]]


SCHEMA_VERSION_NEEDED = 8
"""The migration that added the columns a snapshot reads (0008_flow_control)."""


@contextmanager
def _consistent_view(url: str, read_url: str | None) -> Iterator[_View]:
    """Open the read-only REPEATABLE READ transaction and read the header and queues."""
    with store.consistent_view(url, read_url=read_url) as reader:
        meta = reader.meta()
        if not meta["migrated"]:
            raise MigrationError(
                f"database {meta['database_name']!r} has no jobsd schema: run `jobsd migrate`"
            )
        schema = reader.schema()
        version = schema["schema_version"] or 0
        if version < SCHEMA_VERSION_NEEDED:
            raise MigrationError(
                f"database schema is at version {version}, export needs "
                f"{SCHEMA_VERSION_NEEDED}: run `jobsd migrate`"
            )
        if not schema["sees_all_orgs"]:
            raise ConfigError(
                f"database role {reader.user!r} sees only the jobs of the org in "
                "jobsd.org_id (row-level security): export as the owner role or a superuser"
            )
        header = {
            "contract": CONTRACT,
            "generated_at": _iso(meta["generated_at"]),
            "database": {
                "name": meta["database_name"],
                "server_version": meta["server_version"],
                "schema_version": schema["schema_version"],
            },
        }
        queues = [_queue(row) for row in reader.queues()]
        yield _View(reader, header, queues)


def _queue(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "name": row["name"],
        "capacity": row["capacity"],
        "concurrency_limit": row["concurrency_limit"],
        "retention_days": row["retention_days"],
        "paused": row["paused_at"] is not None,
        "paused_at": _iso(row["paused_at"]),
        "created_at": _iso(row["created_at"]),
        "depth": {state: row[state] for state in OPEN_STATES},
    }


def _write(view: _View, out: BinaryIO) -> SnapshotSummary:
    """Write the document: the header, one line per queue, then one line per job."""
    out.write(b"{\n")
    for key, value in view.header.items():
        out.write(f"  {_dump(key)}: {_dump(value)},\n".encode())
    out.write(b'  "queues": [')
    for i, queue in enumerate(view.queues):
        out.write(f"{',' if i else ''}\n    {_dump(queue)}".encode())
    out.write(b'\n  ],\n  "jobs": [')
    count = 0
    for row in view.reader.jobs():
        out.write(f"{',' if count else ''}\n    {_job_line(row)}".encode())
        count += 1
    out.write(b"\n  ]\n}\n")
    reader = view.reader
    return SnapshotSummary(
        generated_at=datetime.fromisoformat(view.header["generated_at"]),
        queues=len(view.queues),
        jobs=count,
        replica=reader.replica,
        lag_s=reader.lag_s() if reader.replica else None,
    )


def _job_line(row: Mapping[str, Any]) -> str:
    """Encode one job; ``payload`` and ``progress`` are Postgres' JSON text, kept as is."""
    fields = {k: v for k, v in row.items() if k not in ("payload", "progress")}
    head = _dump(fields)[:-1]  # without the closing brace
    progress = row["progress"] if row["progress"] is not None else "null"
    return f'{head}, "progress": {progress}, "payload": {row["payload"]}}}'


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=_json_default)


def _json_default(value: object) -> str:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} in a snapshot")


def _iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat() if value is not None else None


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable; some file systems cannot fsync a directory."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


# -- checking a document -------------------------------------------------------------

_QUEUE_FIELDS: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "capacity": (int, type(None)),
    "concurrency_limit": (int, type(None)),
    "retention_days": (int, type(None)),
    "paused": (bool,),
    "paused_at": (str, type(None)),
    "created_at": (str,),
    "depth": (dict,),
}

_JOB_FIELDS: dict[str, tuple[type, ...]] = {
    "id": (str,),
    "org_id": (str,),
    "queue": (str,),
    "type": (str,),
    "status": (str,),
    "priority": (int,),
    "concurrency_key": (str, type(None)),
    "dedup_key": (str, type(None)),
    "attempts": (int,),
    "run_after": (str,),
    "created_at": (str,),
    "started_at": (str, type(None)),
    "worker_id": (str, type(None)),
    "cancel_requested_at": (str, type(None)),
    "reason": (str, type(None)),
    "depends_on": (list,),
    "progress": (object,),  # any JSON value, as stored
    "payload": (object,),
}

_TIME_FIELDS = ("paused_at", "created_at", "run_after", "started_at", "cancel_requested_at")


def validate_snapshot(doc: object) -> list[str]:
    """Check a parsed document against the v1 contract; return the problems (none: valid).

    Checks what the JSON Schema (docs/snapshot.v1.schema.json) says of the key fields,
    and what a schema cannot: each queue's depth counts exactly the jobs listed.
    Unknown fields are accepted (v1 only ever adds fields).
    """
    if not isinstance(doc, dict):
        return ["the document is not a JSON object"]
    problems: list[str] = []
    if doc.get("contract") != CONTRACT:
        problems.append(f"contract is {doc.get('contract')!r}, not {CONTRACT!r}")
    if not _is_time(doc.get("generated_at")):
        problems.append("generated_at is not an ISO 8601 UTC time")
    if not isinstance(doc.get("database"), dict):
        problems.append("database is not an object")
    queues, jobs = doc.get("queues"), doc.get("jobs")
    if not isinstance(queues, list) or not isinstance(jobs, list):
        return [*problems, "queues and jobs must both be arrays"]
    depths: dict[tuple[str, str], int] = {}
    for i, queue in enumerate(queues):
        where = f"queues[{i}]"
        if not _check_fields(queue, _QUEUE_FIELDS, where, problems):
            continue
        if queue["paused"] != (queue["paused_at"] is not None):
            problems.append(f"{where}: paused disagrees with paused_at")
        depth = queue["depth"]
        for state in OPEN_STATES:
            n = depth.get(state)
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                problems.append(f"{where}.depth.{state} is not a count")
            else:
                depths[(queue["name"], state)] = n
    listed: Counter[tuple[str, str]] = Counter()
    for i, job in enumerate(jobs):
        where = f"jobs[{i}]"
        if not _check_fields(job, _JOB_FIELDS, where, problems):
            continue
        if job["status"] not in OPEN_STATES:
            problems.append(f"{where}.status {job['status']!r} is not an open state")
        if not _is_uuid(job["id"]):
            problems.append(f"{where}.id is not a UUID")
        if not all(_is_uuid(d) for d in job["depends_on"]):
            problems.append(f"{where}.depends_on holds something other than job ids")
        listed[(job["queue"], job["status"])] += 1
    for key in sorted(set(depths) | set(listed)):
        if depths.get(key, 0) != listed[key]:
            problems.append(
                f"queue {key[0]!r} counts {depths.get(key, 0)} {key[1]} jobs, "
                f"the snapshot lists {listed[key]}"
            )
    return problems


def _check_fields(
    item: object, fields: Mapping[str, tuple[type, ...]], where: str, problems: list[str]
) -> bool:
    """Check presence and JSON types of ``fields``; say whether ``item`` can be read on."""
    if not isinstance(item, dict):
        problems.append(f"{where} is not an object")
        return False
    ok = True
    for key, types in fields.items():
        if key not in item:
            problems.append(f"{where}.{key} is missing")
            ok = False
            continue
        value = item[key]
        wrong_bool = isinstance(value, bool) and int in types and bool not in types
        if wrong_bool or not isinstance(value, types):
            problems.append(f"{where}.{key} has the wrong type ({type(value).__name__})")
            ok = False
        elif key in _TIME_FIELDS and value is not None and not _is_time(value):
            problems.append(f"{where}.{key} is not an ISO 8601 UTC time")
    return ok


def _is_time(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return False
    return parsed.utcoffset() == timedelta(0)


def _is_uuid(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True
