"""``jobsd run``: the worker daemon."""

from __future__ import annotations

import logging

import click

from jobsd.cli.common import load_settings, require_url
from jobsd.cli.errors import friendly_errors
from jobsd.errors import BackendUnavailable

__all__ = ["check_schema", "run"]


@click.command()
@click.option("--slots", type=int, help="Jobs run at once (JOBSD_SLOTS).")
@friendly_errors
def run(slots: int | None) -> None:
    """Run the worker daemon until SIGTERM or SIGINT."""
    from jobsd.logs import setup_logging
    from jobsd.periodic import load_schedules_file
    from jobsd.store.connect import check_url
    from jobsd.worker.supervisor import run_daemon

    settings = load_settings(slots=slots)
    url = require_url(settings)
    setup_logging(settings.log_level, settings.log_format)
    if settings.schedules:
        load_schedules_file(settings.schedules)  # a bad file is the first word too
    check_url(url)  # a refusal is the first word, before the daemon starts
    check_schema(url)
    run_daemon(settings)


def check_schema(url: str) -> None:
    """Refuse to start on a database whose schema is behind; tolerate one that is down."""

    from jobsd.errors import MigrationError
    from jobsd.store.migrate import migration_status_sync

    try:
        pending = [m.name for m in migration_status_sync(url) if not m.applied]
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
