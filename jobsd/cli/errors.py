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

from jobsd.errors import JobsdError

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


def quiet_libraries() -> None:
    """Keep library warnings (pool reconnects) off stderr: a command's error is one line.

    Commands that log (``run``, ``dev``) replace the root handlers with their own.
    """
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.NullHandler())


def friendly_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn jobsd and settings errors into one line on stderr and exit status 1."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except JobsdError as exc:
            fail(str(exc))
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "settings"
            fail(f"invalid setting JOBSD_{where.upper()}: {first['msg']}")

    return wrapper
