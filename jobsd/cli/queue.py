"""The ``jobsd queue`` commands: create, list, set, pause, resume and drop queues.

They connect like ``jobsd roles``: ``--database-url`` or ``JOBSD_DATABASE_URL``,
refused over plaintext TCP unless ``JOBSD_ALLOW_INSECURE`` is set (then a warning
line). Errors are one line on stderr (``jobsd: error: ...``) and exit status 1, like
every jobsd command. The work itself is ``jobsd.admin.queues``; semantics in
docs/queues.md.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from jobsd.cli.common import database_url_option, on_named, operator, operator_url, run_async
from jobsd.cli.errors import fail, friendly_errors
from jobsd.errors import UnknownQueue

if TYPE_CHECKING:
    from jobsd.admin.queues import QueueInfo
    from jobsd.ops import AsyncConn

__all__ = ["queue"]

T = TypeVar("T")

_NONE = "none"


def _limit_option(flag: str, metavar: str, what: str) -> Callable[[Any], Any]:
    return click.option(flag, default=None, metavar=metavar, help=f"{what}; 'none' for no limit.")


_capacity = _limit_option("--capacity", "N|none", "Open jobs at most (enqueues beyond: refused)")
_concurrency = _limit_option(
    "--concurrency-limit",
    "N|none",
    "Running jobs of one concurrency key at most ('none': the default)",
)
_retention = _limit_option("--retention", "DAYS|none", "Days `jobsd prune` keeps finished jobs")
_org_running = _limit_option(
    "--org-running-limit", "N|none", "Running jobs of one org at most (claims skip it beyond)"
)
_org_open = _limit_option(
    "--org-open-limit", "N|none", "Open jobs of one org at most (its enqueues beyond: refused)"
)


def _parse_limit(flag: str, field: str, text: str | None) -> int | None:
    """Read ``N`` or ``none`` given to ``flag``; fail with one line when it is neither."""
    from jobsd.admin.queues import check_limit

    if text is None or text.strip().lower() == _NONE:
        return None
    minimum = "a positive integer" if field != "retention_days" else "an integer >= 0"
    try:
        return check_limit(field, int(text.strip()))
    except ValueError:
        fail(f"{flag} must be {minimum} (at most 2147483647) or 'none', not {text!r}")


def _check_name(name: str) -> str:
    from jobsd.admin.queues import check_queue_name

    try:
        return check_queue_name(name)
    except ValueError as exc:
        fail(str(exc))


def _run(database_url: str | None, operation: str, work: Callable[[Any], Awaitable[T]]) -> T:
    """Check the URL like every command that connects, then run ``work(conn)`` once.

    ``conn`` is an autocommit async connection; ``work`` opens its own transaction
    where it needs one (``jobsd.admin.queues`` does).
    """
    try:
        return run_async(operator_url(database_url), operation, work, command="queue")
    except UnknownQueue as exc:
        fail(f"unknown queue {exc.queue!r} (see `jobsd queue list`)")
    except ValueError as exc:  # e.g. dropping 'default'
        fail(str(exc))


def _change(
    database_url: str | None, verb: str, name: str, change: Callable[[Any, str], Awaitable[T]]
) -> T:
    """Check the name, then run ``change(conn, name)`` (the ``verb`` of queue NAME)."""
    _check_name(name)
    return _run(database_url, f"{verb} of queue {name!r}", lambda conn: change(conn, name))


def _limits(info: QueueInfo) -> list[str]:
    """Return ``capacity=...``, ``concurrency_limit=...``, ``retention=...`` of a queue."""
    capacity = _NONE if info.capacity is None else str(info.capacity)
    limit = "default" if info.concurrency_limit is None else str(info.concurrency_limit)
    retention = _NONE if info.retention_days is None else f"{info.retention_days}d"
    return [f"capacity={capacity}", f"concurrency_limit={limit}", f"retention={retention}"]


def _limits_text(info: QueueInfo) -> str:
    return "  ".join(_limits(info))


def _warn_if_full(info: QueueInfo) -> None:
    if info.capacity is not None and info.open_jobs >= info.capacity:
        click.echo(
            f"jobsd: warning: queue {info.name!r} holds {info.open_jobs} open jobs, its "
            f"capacity is {info.capacity}: enqueues are refused until fewer than "
            f"{info.capacity} are open",
            err=True,
        )


@click.group()
def queue() -> None:
    """Declare and administer queues: create, list, set, pause, resume, drop."""


@queue.command("create")
@click.argument("name")
@_capacity
@_concurrency
@_retention
@database_url_option
@friendly_errors
def queue_create(
    name: str,
    capacity: str | None,
    concurrency_limit: str | None,
    retention: str | None,
    database_url: str | None,
) -> None:
    """Declare queue NAME (an existing name is an error: see `jobsd queue set`)."""
    from jobsd.admin.queues import create_queue

    _check_name(name)
    cap = _parse_limit("--capacity", "capacity", capacity)
    limit = _parse_limit("--concurrency-limit", "concurrency_limit", concurrency_limit)
    days = _parse_limit("--retention", "retention_days", retention)
    info = _run(
        database_url,
        f"creation of queue {name!r}",
        lambda conn: create_queue(
            conn, name, capacity=cap, concurrency_limit=limit, retention_days=days
        ),
    )
    click.echo(f"queue {info.name!r} created  {_limits_text(info)}")


@queue.command("set")
@click.argument("name")
@_capacity
@_concurrency
@_retention
@_org_running
@_org_open
@database_url_option
@friendly_errors
def queue_set(
    name: str,
    capacity: str | None,
    concurrency_limit: str | None,
    retention: str | None,
    org_running_limit: str | None,
    org_open_limit: str | None,
    database_url: str | None,
) -> None:
    """Change the limits of queue NAME; those not given stay as they are.

    A capacity below the queue's open jobs is accepted: enqueues are refused until
    fewer jobs than the capacity are open. The per-org limits apply to every org.
    """
    from jobsd.admin.queues import set_org_limits, set_queue_limits

    _check_name(name)
    org_changes: dict[str, Any] = {
        field: _parse_limit(flag, field, text)
        for flag, field, text in (
            ("--org-running-limit", "org_running_limit", org_running_limit),
            ("--org-open-limit", "org_open_limit", org_open_limit),
        )
        if text is not None
    }
    if org_changes:
        _run(
            database_url,
            f"change of the per-org limits of queue {name!r}",
            lambda conn: set_org_limits(conn, name, **org_changes),
        )
        shown = "  ".join(f"{k}={'none' if v is None else v}" for k, v in org_changes.items())
        click.echo(f"queue {name!r} updated  {shown}")
        if capacity is None and concurrency_limit is None and retention is None:
            return
    if capacity is None and concurrency_limit is None and retention is None:
        fail(
            "nothing to change: give --capacity, --concurrency-limit, --retention, "
            "--org-running-limit and/or --org-open-limit"
        )
    changes: dict[str, Any] = {
        field: _parse_limit(flag, field, text)
        for flag, field, text in (
            ("--capacity", "capacity", capacity),
            ("--concurrency-limit", "concurrency_limit", concurrency_limit),
            ("--retention", "retention_days", retention),
        )
        if text is not None
    }
    info = _run(
        database_url,
        f"change of the limits of queue {name!r}",
        lambda conn: set_queue_limits(conn, name, **changes),
    )
    click.echo(f"queue {info.name!r} updated  {_limits_text(info)}")
    _warn_if_full(info)


@queue.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per queue.")
@database_url_option
@friendly_errors
def queue_list(as_json: bool, database_url: str | None) -> None:
    """List the queues: paused or active, limits, and open jobs by state (every org's).

    ``unhandled=N``: queued jobs of types that no live daemon handles (they wait for a
    daemon with their handler; ``--json`` names their types).
    """
    from jobsd.admin.queues import list_queues, unhandled_jobs

    async def both(conn: AsyncConn) -> tuple[list[QueueInfo], dict[str, dict[str, int]]]:
        return await list_queues(conn), await unhandled_jobs(conn)

    infos, unhandled = _run(database_url, "listing of the queues", both)
    if as_json:
        for info in infos:
            types = unhandled.get(info.name, {})
            extra = {"unhandled": sum(types.values()), "unhandled_types": types}
            click.echo(json.dumps(info.to_json() | extra))
        return
    rows = [
        [
            info.name,
            "paused" if info.paused else "active",
            *_limits(info),
            *(f"{state}={count}" for state, count in info.depth.items()),
            f"unhandled={sum(unhandled.get(info.name, {}).values())}",
        ]
        for info in infos
    ]
    widths = [max(len(cell) for cell in column) for column in zip(*rows, strict=True)]
    for row in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


@on_named(queue, "pause", "name")
def queue_pause(name: str, database_url: str | None) -> None:
    """Stop claims from queue NAME at once; running jobs finish. Idempotent."""
    from jobsd.ops.queues import pause_queue

    info = _change(database_url, "pause", name, lambda c, n: pause_queue(c, operator(), n))
    assert info.paused_at is not None
    since = info.paused_at.isoformat(timespec="seconds")
    click.echo(f"queue {info.name!r} paused since {since}: no new claims; running jobs finish")


@on_named(queue, "resume", "name")
def queue_resume(name: str, database_url: str | None) -> None:
    """Let daemons claim from queue NAME again, and wake them now. Idempotent."""
    from jobsd.ops.queues import resume_queue

    info = _change(database_url, "resume", name, lambda c, n: resume_queue(c, operator(), n))
    jobs = "job" if info.queued == 1 else "jobs"
    click.echo(f"queue {info.name!r} resumed: {info.queued} queued {jobs} to claim")


@on_named(queue, "drop", "name")
def queue_drop(name: str, database_url: str | None) -> None:
    """Delete queue NAME and its finished jobs; refused while it holds open jobs.

    The queue 'default' is never dropped.
    """
    from jobsd.admin.queues import drop_queue

    deleted = _change(database_url, "drop", name, drop_queue)
    jobs = "job" if deleted == 1 else "jobs"
    click.echo(f"queue {name!r} dropped, with its {deleted} finished {jobs}")
