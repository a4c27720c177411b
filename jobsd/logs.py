"""Log to stderr, one line per event: ``level event key=value ...`` or one JSON object.

journald adds the time to text lines; JSON lines carry their own ``ts`` (UTC, ISO 8601
with milliseconds), since they usually go to a log shipper rather than journald. The
message is a stable event name and the details come from ``extra``.

Every line logged during a run, by jobsd or by the handler's own loggers, also carries
the run's job: ``job_id``, ``type``, ``attempt``, ``queue`` and ``org_id``. The
executor sets them in a context variable (``job_fields``) for exactly the run, in the
run's own task (a sync handler's thread and a handler process get them too), and
``JobContextFilter``, on the handler ``setup_logging`` installs, copies them onto each
record that does not already carry them.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "JOB_FIELDS",
    "JobContextFilter",
    "JsonFormatter",
    "TextFormatter",
    "current_job_fields",
    "installed",
    "job_fields",
    "setup_logging",
    "tag_job",
    "untag_job",
]

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}

JOB_FIELDS = ("job_id", "type", "attempt", "queue", "org_id")
"""the fields of the running job that every log record of its run carries"""

_job: ContextVar[Mapping[str, Any] | None] = ContextVar("jobsd_log_job", default=None)

_installed: tuple[str, str] | None = None
"""the level and format of the last ``setup_logging`` in this process"""


def tag_job(job_id: object, type: str, attempt: int, queue: str, org_id: str) -> Token[Any]:
    """Tag every log record of the current context with this job; return the token
    that ``untag_job`` takes, in the same context, to end it (``job_fields`` does both).

    The value lives in a context variable: set in a run's own task, it reaches that
    task's awaits and the tasks it starts, never another run's.
    """
    return _job.set(
        {"job_id": str(job_id), "type": type, "attempt": attempt, "queue": queue, "org_id": org_id}
    )


def untag_job(token: Token[Any]) -> None:
    """End the tagging that ``tag_job`` began (the value before it is back)."""
    _job.reset(token)


@contextmanager
def job_fields(job_id: object, type: str, attempt: int, queue: str, org_id: str) -> Iterator[None]:
    """Tag every log record of the current context with this job until the block ends,
    whatever ends it."""
    token = tag_job(job_id, type, attempt, queue, org_id)
    try:
        yield
    finally:
        untag_job(token)


def current_job_fields() -> Mapping[str, Any] | None:
    """Return the fields of the job whose run this code is part of (None: no run)."""
    return _job.get()


class JobContextFilter(logging.Filter):
    """Add the running job's fields (``JOB_FIELDS``) to each record logged in its run.

    A field the record already has (a call's own ``extra={"job_id": ...}``) is kept.
    Attach it to a handler, not a logger: a handler's filters see the records of
    every logger that propagates to it, the application's included.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        fields = _job.get()
        if fields is not None:
            attrs = record.__dict__
            for key, value in fields.items():
                if key not in attrs:
                    attrs[key] = value
        return True


def _details(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class TextFormatter(logging.Formatter):
    """Format ``LEVEL event k=v k=v``."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [record.levelname, record.getMessage()]
        parts += [f"{k}={_text(v)}" for k, v in _details(record).items()]
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """Format one JSON object per line, starting with its time (``ts``)."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "event": record.getMessage(),
            "logger": record.name,
            **_details(record),
        }
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


def _text(value: Any) -> str:
    text = str(value)
    return json.dumps(text) if (" " in text or not text) else text


def setup_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Send jobsd's logs to stderr in the chosen format, each record of a run tagged
    with its job (``JobContextFilter``)."""
    global _installed
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(JobContextFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    _installed = (level.upper(), fmt)
    # psycopg_pool logs every reconnect attempt at INFO/WARNING; keep them, they matter.


def installed() -> tuple[str, str] | None:
    """Return the level and format ``setup_logging`` last set in this process (None:
    never called: the application configures logging itself). A handler process of
    the daemon sets up the same."""
    return _installed
