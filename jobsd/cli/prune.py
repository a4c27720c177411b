"""The ``jobsd prune`` command: delete terminal jobs older than their retention policy.

Errors are one line on stderr
(``jobsd: error: ...``) and exit status 1, like every jobsd command; bad input is
refused before anything is read or deleted.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

import click

from jobsd.cli.common import operator_url, run_async
from jobsd.cli.errors import friendly_errors
from jobsd.errors import ConfigError

if TYPE_CHECKING:
    from jobsd.admin.retention import PruneReport

__all__ = ["parse_batch_size", "parse_type_retention", "prune"]

_DAYS = re.compile(r"^[0-9]{1,9}$")


def parse_type_retention(specs: tuple[str, ...]) -> dict[str, int]:
    """Read ``TYPE=DAYS`` pairs (DAYS a whole number >= 0); a type given twice is an error."""
    policies: dict[str, int] = {}
    for spec in specs:
        name, sep, days = spec.rpartition("=")
        name, days = name.strip(), days.strip()
        if not sep or not name:
            raise ConfigError(
                f"--type-retention {spec!r}: use TYPE=DAYS, e.g. --type-retention report=7"
            )
        if not _DAYS.match(days):
            raise ConfigError(f"--type-retention {spec!r}: DAYS must be a whole number >= 0")
        if name in policies and policies[name] != int(days):
            raise ConfigError(f"--type-retention: type {name!r} is given twice")
        policies[name] = int(days)
    return policies


def parse_batch_size(text: str) -> int:
    """Read ``--batch-size``: a whole number between 1 and the maximum."""
    from jobsd.admin.retention import MAX_BATCH_SIZE

    if not text.strip().isdigit() or not 1 <= int(text) <= MAX_BATCH_SIZE:
        raise ConfigError(f"--batch-size {text!r}: use a whole number from 1 to {MAX_BATCH_SIZE}")
    return int(text)


@click.command()
@click.option(
    "--spare-type",
    "spare_types",
    multiple=True,
    metavar="TYPE",
    help="Never delete jobs of this type (repeatable); wins over every policy.",
)
@click.option(
    "--type-retention",
    "type_retention",
    multiple=True,
    metavar="TYPE=DAYS",
    help="Keep jobs of TYPE for DAYS, whatever their queue's policy says (repeatable).",
)
@click.option(
    "--retention",
    "default_retention",
    envvar="JOBSD_RETENTION",
    metavar="DAYS",
    help="Keep the jobs whose type and queue have no retention for DAYS (90 or 90d; "
    "forever, the default, keeps them) (JOBSD_RETENTION).",
)
@click.option(
    "--dry-run", is_flag=True, help="Count what would be deleted, per queue; delete nothing."
)
@click.option(
    "--batch-size",
    default="5000",
    show_default=True,
    metavar="N",
    help="Jobs per batch; each batch is one short transaction.",
)
@click.option(
    "--full-scan",
    is_flag=True,
    help="Read every job id, also those of jobs created after the newest cutoff "
    "(jobs imported with new ids); reads the whole table once.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option(
    "--database-url",
    envvar="JOBSD_DATABASE_URL",
    help="libpq URL of the database, as the owner role (JOBSD_DATABASE_URL).",
)
@friendly_errors
def prune(
    spare_types: tuple[str, ...],
    type_retention: tuple[str, ...],
    default_retention: str | None,
    dry_run: bool,
    batch_size: str,
    full_scan: bool,
    as_json: bool,
    database_url: str | None,
) -> None:
    """Delete terminal jobs older than their retention (docs/retention.md).

    A job goes when it succeeded, failed or was cancelled more than its policy's days
    ago, with its history. Policy, first match wins: a spared type is never deleted;
    else the type's --type-retention; else its queue's retention (`jobsd queue create
    NAME --retention DAYS`); else --retention; else the job is kept forever. A month
    of the archive whose every job is due is dropped whole. Safe to repeat and to run
    while daemons work.
    """
    from jobsd.admin.retention import prune as run_prune
    from jobsd.settings import parse_retention_days

    try:
        default_days = parse_retention_days(default_retention or "")
    except ValueError as exc:
        raise ConfigError(f"--retention: {exc}") from None
    for name in spare_types:
        if not name.strip():
            raise ConfigError("--spare-type needs a type name")
    policies = parse_type_retention(type_retention)
    size = parse_batch_size(batch_size)
    url = operator_url(database_url)
    report = run_async(
        url,
        "prune",
        lambda conn: run_prune(
            conn,
            spare_types=[s.strip() for s in spare_types],
            type_retention=policies,
            default_days=default_days,
            dry_run=dry_run,
            batch_size=size,
            full_scan=full_scan,
        ),
        command="prune",
    )
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        _print_report(report)


def _print_report(report: PruneReport) -> None:
    verb = "would delete" if report.dry_run else "deleted"
    rows = [(queue, _queue_days(report, queue), str(n)) for queue, n in report.deleted.items()]
    head = ("queue", "retention", verb)
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(2)]
    for queue, days, n in [head, *rows]:
        click.echo(f"{queue:<{widths[0]}}  {days:<{widths[1]}}  {n}")
    if report.type_retention:
        types = ", ".join(f"{t} {_days(d)}" for t, d in report.type_retention.items())
        click.echo(f"type retention: {types}")
    if report.spare_types:
        click.echo(f"spared types: {', '.join(report.spare_types)}")
    if report.months_dropped:
        months = ", ".join(f"{m:%Y-%m}" for m in report.months_dropped)
        verb_months = "would drop" if report.dry_run else "dropped"
        click.echo(f"archive months {verb_months} whole: {months}")
    cost = f"{report.seconds:.2f} s, {report.batches} batches, {report.scanned} rows read"
    if report.dry_run:
        click.echo(f"would delete {report.total} jobs (dry run: nothing deleted; {cost})")
    else:
        click.echo(f"deleted {report.total} jobs ({cost})")


def _days(days: int | None) -> str:
    if days is None:
        return "forever"
    return "1 day" if days == 1 else f"{days} days"


def _queue_days(report: PruneReport, queue: str) -> str:
    days = report.queue_retention.get(queue)
    if days is None and report.default_retention is not None:
        return f"{_days(report.default_retention)} (default)"
    return _days(days)
