"""``manage.py jobsd ...``: jobsd's command line on the project's database and tasks.

``manage.py jobsd run`` runs the daemon with Django set up and every task of the
project registered; ``manage.py jobsd migrate`` applies jobsd's schema; any other jobsd
command (``status``, ``jobs``, ``retry``, ``top``, ...) works on the same database. The
database is the one the jobsd task backend writes to (``TASKS``), read from
``DATABASES``: ``JOBSD_DATABASE_URL`` is set from it.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from jobsd.contrib.django.connection import connection_string
from jobsd.contrib.django.options import jobsd_backends

HANDLERS_MODULE = "jobsd.contrib.django.handlers"


class Command(BaseCommand):  # type: ignore[misc]
    help = (
        "Run jobsd's commands on this project's database: `run` (the daemon, with the "
        "project's tasks), `migrate`, `status ID`, `jobs`, ... (`manage.py jobsd --help`)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--backend",
            default=None,
            help="The TASKS alias of the jobsd backend whose database to use "
            "(default: the only one).",
        )
        parser.add_argument("command", nargs=argparse.REMAINDER, help="A jobsd command.")

    def handle(self, *args: Any, **options: Any) -> None:
        backend = _jobsd_backend(options["backend"])
        # the backend's database, unless JOBSD_DATABASE_URL names one (the same
        # database as another role, say the daemon's own)
        if not os.environ.get("JOBSD_DATABASE_URL"):
            os.environ["JOBSD_DATABASE_URL"] = connection_string(backend.config.database)
        os.environ["JOBSD_DEFAULT_ORG"] = backend.config.org_id
        argv = list(options["command"]) or ["--help"]
        if argv[0] == "run":
            argv.append(HANDLERS_MODULE)
        # the jobsd command replaces this process (same pid: systemd's signals reach
        # the daemon), finding the project's modules where this process found them
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, "-m", "jobsd", *argv])


def _jobsd_backend(alias: str | None) -> Any:
    """Return the jobsd backend named, or the only one of TASKS (CommandError)."""
    from jobsd.contrib.django.tasksapi import task_backends

    names = list(jobsd_backends())
    if alias is not None:
        if alias not in names:
            raise CommandError(f"TASKS has no jobsd backend {alias!r} (jobsd backends: {names})")
        return task_backends[alias]
    if len(names) != 1:
        found = "none" if not names else ", ".join(names)
        raise CommandError(
            "manage.py jobsd needs exactly one jobsd backend in TASKS, or --backend "
            f"ALIAS (found: {found})"
        )
    return task_backends[names[0]]
