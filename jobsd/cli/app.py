"""The ``jobsd`` command group: every command is a module of ``jobsd.cli``.

Errors are one line on stderr (``jobsd: error: ...``) and a non-zero exit, never a
traceback (``jobsd.cli.errors``). Command modules import what they run lazily, so
``jobsd --help`` and light commands start fast.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import click

from jobsd.cli.api import api
from jobsd.cli.cancel import cancel
from jobsd.cli.demo import demo
from jobsd.cli.dev import dev
from jobsd.cli.enqueue import enqueue
from jobsd.cli.errors import quiet_libraries
from jobsd.cli.export import export
from jobsd.cli.jobs import jobs
from jobsd.cli.migrate import migrate
from jobsd.cli.notify import notify
from jobsd.cli.prune import prune
from jobsd.cli.queue import queue
from jobsd.cli.resolve import resolve
from jobsd.cli.retry import retry
from jobsd.cli.roles import roles
from jobsd.cli.run import run
from jobsd.cli.schedule import schedule
from jobsd.cli.status import status
from jobsd.cli.token import token
from jobsd.cli.top import top

__all__ = ["main"]


class _OneLineErrors(click.Group):
    """The ``jobsd`` group: click's own errors (a bad option, a missing argument) are one
    line too, ``jobsd: error: ... (see 'jobsd X --help')``, with click's exit status 2."""

    def main(  # type: ignore[override]
        self, args: Sequence[str] | None = None, standalone_mode: bool = True, **kwargs: Any
    ) -> Any:
        if not standalone_mode:
            return super().main(args, standalone_mode=False, **kwargs)
        try:
            code = super().main(args, standalone_mode=False, **kwargs)
        except click.exceptions.Abort:
            click.echo("jobsd: error: aborted", err=True)
            sys.exit(1)
        except click.ClickException as exc:
            hint = ""
            if isinstance(exc, click.UsageError) and exc.ctx is not None:
                hint = f" (see '{exc.ctx.command_path} --help')"
            message = " ".join(exc.format_message().split())
            click.echo(f"jobsd: error: {message}{hint}", err=True)
            sys.exit(exc.exit_code)
        sys.exit(code if isinstance(code, int) else 0)


@click.group(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="jobsd")
def main() -> None:
    """jobsd: a Postgres-backed job queue."""
    quiet_libraries()


for _command in (
    migrate,
    run,
    dev,
    demo,
    enqueue,
    status,
    jobs,
    retry,
    resolve,
    cancel,
    notify,
    export,
    api,
    token,
    queue,
    schedule,
    roles,
    prune,
    top,
):
    main.add_command(_command)
