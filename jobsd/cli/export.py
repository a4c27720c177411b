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

import click

from jobsd.cli.common import operator_url
from jobsd.cli.errors import fail, friendly_errors

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

    One consistent view of the database; see docs/snapshot.md.
    """
    if check_path is not None:
        if out is not None:
            fail("--check reads a snapshot, --out writes one: give only one of them")
        _check(check_path)
        return

    from jobsd.admin.snapshot import write_snapshot, write_snapshot_file

    url = operator_url(database_url)
    if out is None:
        try:
            write_snapshot(url, sys.stdout.buffer)
            sys.stdout.flush()
        except OSError as exc:
            # e.g. `jobsd export | head`: what is still buffered must not fail again at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            fail(f"cannot write the snapshot to stdout: {exc.strerror or exc}")
        return
    # SIGTERM (systemd, timeout) unwinds like Ctrl-C: the temporary file is removed
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        summary = write_snapshot_file(url, out)
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror or exc}")
    click.echo(f"exported {summary.queues} queues and {summary.jobs} open jobs to {out}")


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
