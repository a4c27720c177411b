"""Log to stderr, one line per event: ``level event key=value ...`` or one JSON object.

journald adds the time to text lines; JSON lines carry their own ``ts`` (UTC, ISO 8601
with milliseconds), since they usually go to a log shipper rather than journald. The
message is a stable event name and the details come from ``extra``.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

__all__ = ["setup_logging"]

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


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
    """Send jobsd's logs to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # psycopg_pool logs every reconnect attempt at INFO/WARNING; keep them, they matter.
