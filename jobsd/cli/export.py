"""The ``jobsd export`` command: a JSON snapshot of the queues and open jobs.

Errors are one line on stderr
(``jobsd: error: ...``) and exit status 1, like every jobsd command.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from jobsd.cli.common import load_settings, operator_url, replica_line
from jobsd.cli.errors import fail, friendly_errors

if TYPE_CHECKING:
    from jobsd.admin.snapshot import SnapshotSummary

__all__ = ["export"]


@click.command("export")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write to FILE atomically (a temporary file renamed over it); default: stdout.",
)
@click.option(
    "--check",
    "check_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Check that FILE is a valid snapshot instead (no database needed).",
)
@click.option("--database-url", envvar="JOBSD_DATABASE_URL", help="libpq URL of the database.")
@friendly_errors
def export(out: Path | None, check_path: Path | None, database_url: str | None) -> None:
    """Write a JSON snapshot of the queues and open jobs (contract jobsd.snapshot.v1).

    One consistent view of the database; see docs/snapshot.md. With
    JOBSD_READ_DATABASE_URL (and no --database-url given) it is read on that replica
    when it answers, and a line on stderr says so, with its delay.
    """
    if check_path is not None:
        if out is not None:
            fail("--check reads a snapshot, --out writes one: give only one of them")
        _check(check_path)
        return

    from jobsd.admin.snapshot import write_snapshot, write_snapshot_file

    url = operator_url(database_url)
    read_url = _read_url()
    if out is None:
        try:
            summary = write_snapshot(url, sys.stdout.buffer, read_url=read_url)
            sys.stdout.flush()
        except OSError as exc:
            # e.g. `jobsd export | head`: what is still buffered must not fail again at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            fail(f"cannot write the snapshot to stdout: {exc.strerror or exc}")
        _say_replica(summary)
        return
    # SIGTERM (systemd, timeout) unwinds like Ctrl-C: the temporary file is removed
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        summary = write_snapshot_file(url, out, read_url=read_url)
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror or exc}")
    click.echo(f"exported {summary.queues} queues and {summary.jobs} open jobs to {out}")
    _say_replica(summary)


def _read_url() -> str | None:
    """Return JOBSD_READ_DATABASE_URL, unless --database-url named another database."""
    source = click.get_current_context().get_parameter_source("database_url")
    if source is click.core.ParameterSource.COMMANDLINE:
        return None
    return load_settings().read_database_url


def _say_replica(summary: SnapshotSummary) -> None:
    """Say on stderr that the snapshot was read on the replica, and its delay."""
    line = replica_line(summary.replica, summary.lag_s)
    if line is not None:
        click.echo(f"jobsd: {line}", err=True)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _check(path: Path) -> None:
    """Validate a snapshot file against the v1 contract; exit 1 with the first problems."""
    from jobsd.admin.snapshot import CONTRACT, validate_snapshot

    try:
        with path.open("rb") as f:
            doc = json.load(f)
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror or exc}")
    except (ValueError, RecursionError) as exc:
        fail(f"{path} is not valid JSON: {exc}")
    problems = validate_snapshot(doc)
    if problems:
        shown = "; ".join(problems[:5])
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        fail(f"{path} is not a valid {CONTRACT} snapshot: {shown}{more}")
    click.echo(f"{path}: valid {CONTRACT} ({len(doc['queues'])} queues, {len(doc['jobs'])} jobs)")
