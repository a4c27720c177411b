"""``jobsd status``: a job's state, progress, report, error, the errors of its attempts
and its history."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import click

from jobsd.cli.common import on_job, token_option
from jobsd.cli.errors import friendly_errors
from jobsd.models import ErrorRecord, Job, JobEvent, split_traceback

__all__ = ["status"]


@click.command()
@click.argument("job_id")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the job, the errors of its attempts and its history as JSON.",
)
@token_option
@friendly_errors
def status(job_id: str, as_json: bool, token: str | None) -> None:
    """Show a job's state, progress, report, error, the errors of its attempts (most
    recent first, tracebacks as they were printed) and its history."""
    from jobsd.ops.get import get_job

    view = on_job(job_id, token, "read", get_job, command="status")
    job, events = view.job, view.history
    if as_json:
        click.echo(
            json.dumps({**job.to_json(), "history": [e.to_json() for e in events]}, indent=2)
        )
        return
    _print_job(job, events)


def _print_job(job: Job, events: list[JobEvent]) -> None:
    fields = [
        ("id", str(job.id)),
        ("type", job.type),
        ("org", job.org_id),
        ("queue", job.queue),
        ("status", str(job.status) + (f" ({job.reason})" if job.reason else "")),
        *(
            [("reserved", f"by {job.worker_id} until {_when(job.reservation)}")]
            if job.reservation is not None
            else []
        ),
        ("attempts", str(job.attempts)),
        ("created", _when(job.created_at)),
        ("started", _when(job.started_at)),
        ("finished", _when(job.finished_at)),
    ]
    silent = job.silence_s(datetime.now(UTC))
    if silent is not None:
        fields.append(("silent", f"{silent:.1f} s since its last progress (or start)"))
    if job.dedup_key:
        fields.append(("dedup key", job.dedup_key))
    if job.priority:
        fields.append(("priority", str(job.priority)))
    if job.concurrency_key:
        fields.append(("key", job.concurrency_key))
    if job.retry_of:
        fields.append(("retry of", str(job.retry_of)))
    if job.retried_as:
        fields.append(("retried as", str(job.retried_as)))
    if job.progress:
        fields.append(("progress", json.dumps(job.progress)))
    if job.error:
        fields.append(("error", job.error))
    report, traceback = split_traceback(job.report)
    if report:
        fields.append(("report", json.dumps(report)[:2000]))
    if job.errors:
        many = len(job.errors)
        fields.append(("errors", f"{many} attempt{'s' if many > 1 else ''}, most recent first"))
    width = max(len(k) for k, _ in fields)
    for key, value in fields:
        click.echo(f"{key:<{width}}  {value}")
    if traceback is not None and not job.errors:
        # a job that failed before error records were kept: the report's alone
        click.echo("traceback")
        _echo_lines(traceback, "  ")
    for record in job.errors:
        _print_record(record)
    click.echo("history")
    for e in events:
        move = f"{e.from_status or '-'} -> {e.to_status}"
        extra = " ".join(
            part
            for part in (
                f"attempt={e.attempt}",
                f"worker={e.worker_id}" if e.worker_id else "",
                f"reason={e.reason!r}" if e.reason else "",
            )
            if part
        )
        click.echo(f"  {_when(e.at)}  {move:<24} {extra}")


def _when(value: datetime | None) -> str:
    return value.isoformat(timespec="milliseconds") if value else "-"


def _print_record(record: ErrorRecord) -> None:
    """Print one attempt's error: a heading line, then its message and traceback as
    they were written, indented."""
    head = f"  attempt {record.attempt}  {_when(record.at)}  {record.cause}"
    click.echo(head + (f"  {record.type}" if record.type else ""))
    _echo_lines(record.message, "    ")
    if record.traceback:
        _echo_lines(record.traceback, "    ")


def _echo_lines(text: str, indent: str) -> None:
    for line in text.rstrip("\n").splitlines():
        click.echo(f"{indent}{line}".rstrip())
