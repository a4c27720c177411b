"""The ``jobsd schedule`` commands: list the periodic schedules, pause and resume one.

Schedules are declared by the daemons that run them (``@jobsd.periodic``, or the
TOML file of ``JOBSD_SCHEDULES``); these commands see and steer them through the
database: a pause holds for every daemon and survives restarts. They connect like
``jobsd queue``. Semantics in docs/periodic.md.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import click

from jobsd.cli.common import database_url_option, on_named, operator, operator_url, run_async
from jobsd.cli.errors import fail, friendly_errors
from jobsd.errors import UnknownSchedule

if TYPE_CHECKING:
    from jobsd.periodic import ScheduleInfo

__all__ = ["schedule"]

T = TypeVar("T")

_HEADER = ["ID", "SCHEDULE", "TIMEZONE", "STATE", "NEXT TICK", "LAST TICK", "LAST JOB", "JOB STATE"]
_COUNTERS = ["FIRED", "REFUSED", "LATE", "SKIPPED"]


def _run(database_url: str | None, operation: str, work: Callable[[Any], Awaitable[T]]) -> T:
    try:
        return run_async(operator_url(database_url), operation, work, command="schedule")
    except UnknownSchedule as exc:
        fail(f"unknown schedule {exc.schedule_id!r} (see `jobsd schedule list`)")


def _time(value: datetime | None) -> str:
    return value.astimezone(UTC).isoformat(timespec="seconds") if value is not None else "-"


def _row(info: ScheduleInfo, now: datetime) -> list[str]:
    return [
        info.id,
        info.schedule.spec,
        info.timezone,
        "paused" if info.paused else "active",
        _time(info.next_tick(now)),
        _time(info.last_tick),
        str(info.last_job_id) if info.last_job_id else "-",
        info.last_state or "-",
        str(info.fired),
        str(info.refused),
        str(info.late),
        str(info.skipped),
    ]


@click.group()
def schedule() -> None:
    """See and steer periodic jobs: list, pause, resume."""


@schedule.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per schedule.")
@database_url_option
@friendly_errors
def schedule_list(as_json: bool, database_url: str | None) -> None:
    """List the schedules: next tick, last tick with its job and state, counters."""
    from jobsd.ops.schedules import list_schedules

    infos = _run(database_url, "listing of the schedules", lambda c: list_schedules(c, operator()))
    now = datetime.now(UTC)
    if as_json:
        for item in infos:
            click.echo(json.dumps(item.to_json(now)))
        return
    if not infos:
        click.echo("no schedules (daemons declare them: see docs/periodic.md)")
        return
    rows = [_HEADER + _COUNTERS, *(_row(item, now) for item in infos)]
    widths = [max(len(cell) for cell in column) for column in zip(*rows, strict=True)]
    for row in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _switch(database_url: str | None, verb: str, schedule_id: str) -> ScheduleInfo:
    """Pause or resume (``verb``) schedule ``schedule_id`` as the operator."""
    from jobsd.ops import schedules

    change = schedules.pause_schedule if verb == "pause" else schedules.resume_schedule
    return _run(
        database_url,
        f"{verb} of schedule {schedule_id!r}",
        lambda c: change(c, operator(), schedule_id),
    )


@on_named(schedule, "pause", "schedule_id", metavar="ID")
def schedule_pause(schedule_id: str, database_url: str | None) -> None:
    """Stop schedule ID firing, for every daemon, until resumed. Idempotent."""
    found = _switch(database_url, "pause", schedule_id)
    click.echo(f"schedule {found.id!r} paused since {_time(found.paused_at)}: no tick fires")


@on_named(schedule, "resume", "schedule_id", metavar="ID")
def schedule_resume(schedule_id: str, database_url: str | None) -> None:
    """Let schedule ID fire again from its next tick (missed ticks never fire). Idempotent."""
    found = _switch(database_url, "resume", schedule_id)
    click.echo(
        f"schedule {found.id!r} resumed: next tick {_time(found.next_tick(datetime.now(UTC)))}"
    )
