"""One-line errors for every ``jobsd`` command: ``jobsd: error: ...`` and a non-zero exit.

Shared by ``jobsd.cli`` and the command groups it attaches (``http_cli``, ``roles_cli``),
so every command fails the same way, never with a traceback.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import NoReturn, ParamSpec, TypeVar

import click
import pydantic

from jobsd.errors import BackendUnavailable, JobsdError

__all__ = ["EXIT_ERROR", "fail", "friendly_errors", "quiet_libraries"]

P = ParamSpec("P")
R = TypeVar("R")

EXIT_ERROR = 1


def fail(message: str, code: int = EXIT_ERROR) -> NoReturn:
    """Print one error line on stderr and exit with ``code``."""
    # one line, even for libpq's multi-line messages
    line = " ".join(part.strip() for part in message.splitlines() if part.strip())
    click.echo(f"jobsd: error: {line}", err=True)
    sys.exit(code)


class _LastConnectError(logging.Handler):
    """Remember the pool's last connection error: a pool timeout alone does not say why."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.message: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        first = record.getMessage().splitlines()[0]
        if first.startswith("error connecting in "):  # "error connecting in 'client': ..."
            self.message = first.split(": ", 1)[-1]


_last_connect_error = _LastConnectError()


def quiet_libraries() -> None:
    """Keep library warnings (pool reconnects) off stderr: a command's error is one line.

    Commands that log (``run``, ``dev``) replace the root handlers with their own.
    """
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.NullHandler())
    pool_log = logging.getLogger("psycopg.pool")
    if _last_connect_error not in pool_log.handlers:
        pool_log.addHandler(_last_connect_error)


def _error_line(exc: JobsdError) -> str:
    message = str(exc)
    cause = _last_connect_error.message
    if isinstance(exc, BackendUnavailable) and cause and cause not in message:
        message = f"{message}: {cause}"
    return message


def friendly_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn jobsd and settings errors into one line on stderr and exit status 1."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except JobsdError as exc:
            fail(_error_line(exc))
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "settings"
            fail(f"invalid setting JOBSD_{where.upper()}: {first['msg']}")

    return wrapper
