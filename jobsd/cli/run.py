"""``jobsd run``: the worker daemon."""

from __future__ import annotations

import logging
import os
import sys

import click

from jobsd.cli.common import check_url, load_settings, require_url
from jobsd.cli.errors import friendly_errors
from jobsd.errors import BackendUnavailable, ConfigError

__all__ = ["check_schema", "run"]


@click.command()
@click.argument("modules", nargs=-1, metavar="[MODULE]...")
@click.option("--slots", type=int, help="Jobs run at once (JOBSD_SLOTS).")
@click.option(
    "--allow-empty",
    is_flag=True,
    help="Start even with no handler registered (the daemon then claims nothing, "
    "unless JOBSD_UNKNOWN_TYPES=fail).",
)
@friendly_errors
def run(modules: tuple[str, ...], slots: int | None, allow_empty: bool) -> None:
    """Run the worker daemon until SIGTERM or SIGINT.

    The handler modules are imported first: those of JOBSD_HANDLERS and each MODULE
    given, as in: jobsd run myapp.jobs myapp.mail. The current directory is searched
    too, after the installed packages.
    """
    from jobsd.http.preflight import check_api
    from jobsd.http.settings import HttpSettings
    from jobsd.logs import setup_logging
    from jobsd.periodic import load_schedules_file
    from jobsd.registry import default_registry
    from jobsd.worker.supervisor import import_handlers, run_daemon

    settings = load_settings(slots=slots)
    url = require_url(settings)
    setup_logging(settings.log_level, settings.log_format)
    if settings.schedules:
        load_schedules_file(settings.schedules)  # a bad file is the first word too
    check_url(url)  # a refusal is the first word, before the daemon starts
    http = HttpSettings()  # the daemon reads them too: a bad one is refused here, first
    if http.http_addr:
        check_api(settings, http, check_url=check_url)  # the API it starts: URL, address
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())  # JOBSD_HANDLERS=myapp.jobs from the project's directory
    import_handlers(list(dict.fromkeys([*settings.handlers, *modules])))
    if not default_registry.types() and not allow_empty:
        raise ConfigError(
            "no handler registered: name the modules that define them (`jobsd run "
            "myapp.jobs`, or JOBSD_HANDLERS=myapp.jobs), or pass --allow-empty"
        )
    check_schema(url)
    run_daemon(settings)


def check_schema(url: str) -> None:
    """Refuse to start on a database whose schema is behind; tolerate one that is down."""

    from jobsd.cli.common import pending_migrations
    from jobsd.errors import MigrationError, NoWritableServer

    try:
        pending = pending_migrations(url)
    except NoWritableServer as exc:
        raise ConfigError(str(exc)) from exc  # a standby: waiting would not change it
    except BackendUnavailable as exc:
        logging.getLogger("jobsd.cli").warning("daemon.schema_unchecked", extra={"error": str(exc)})
        return
    if pending:
        raise MigrationError(
            f"database schema is behind ({', '.join(pending)} pending): run `jobsd migrate`"
        )
    from jobsd.admin.roles import check_sees_all_orgs

    try:
        check_sees_all_orgs(url)  # a role limited to one org would idle without a word
    except BackendUnavailable as exc:
        logging.getLogger("jobsd.cli").warning("daemon.role_unchecked", extra={"error": str(exc)})
