"""The ``jobsd`` command group: every command is a module of ``jobsd.cli``.

Errors are one line on stderr (``jobsd: error: ...``) and a non-zero exit, never a
traceback (``jobsd.cli.errors``). Command modules import what they run lazily, so
``jobsd --help`` and light commands start fast.
"""

from __future__ import annotations

import click

from jobsd.cli.api import api
from jobsd.cli.cancel import cancel
from jobsd.cli.demo import demo
from jobsd.cli.dev import dev
from jobsd.cli.enqueue import enqueue
from jobsd.cli.errors import quiet_libraries
from jobsd.cli.export import export
from jobsd.cli.migrate import migrate
from jobsd.cli.notify import notify
from jobsd.cli.prune import prune
from jobsd.cli.queue import queue
from jobsd.cli.resolve import resolve
from jobsd.cli.roles import roles
from jobsd.cli.run import run
from jobsd.cli.status import status
from jobsd.cli.token import token

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
    resolve,
    cancel,
    notify,
    export,
    api,
    token,
    queue,
    roles,
    prune,
):
    main.add_command(_command)
