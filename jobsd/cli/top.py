"""``jobsd top``: a live view of the queues, the daemons and the recent failures.

It reads what the dashboard's overview reads (``jobsd.ops.overview``, shaped by
``jobsd.http.ui.views``),
for every org, and redraws every ``--interval`` until Ctrl-C. While the database is
away it says so and keeps trying. With JOBSD_READ_DATABASE_URL it reads that replica
while it answers (a line under the title gives its delay), else the primary.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import click

from jobsd.cli.common import lagging_reader, load_settings, operator, replica_line, require_url
from jobsd.cli.errors import friendly_errors
from jobsd.settings import parse_duration

if TYPE_CHECKING:
    from rich.console import RenderableType

    from jobsd.http.ui.views import QueueRow
    from jobsd.ops import AsyncConn

__all__ = ["top"]

_SPARK = " ▁▂▃▄▅▆▇█"
SPARK_MINUTES = 20
# terminals at least this wide show the per-minute chart of each queue
WIDE = 110


def _span(seconds: float | None) -> str:
    from jobsd.http.ui.views import span

    return span(seconds, compact=True)


def _sparkline(row: QueueRow) -> str:
    """Return the jobs finished per minute over the last SPARK_MINUTES, oldest first."""
    from jobsd.http.ui.views import BAR_WIDTH, CHART_HEIGHT, CHART_MINUTES

    heights = [0] * SPARK_MINUTES
    for bar in row.bars:
        minutes_ago = CHART_MINUTES - 1 - bar.x // BAR_WIDTH
        if minutes_ago < SPARK_MINUTES:
            heights[SPARK_MINUTES - 1 - minutes_ago] = bar.ok_h + bar.fail_h
    top_level = len(_SPARK) - 1
    return "".join(
        _SPARK[min(top_level, -(-h * top_level // CHART_HEIGHT))] if h else "·" for h in heights
    )


async def _snapshot(conn: AsyncConn) -> dict[str, Any]:
    from jobsd.http.ui import views
    from jobsd.ops.overview import read_overview

    seen = await read_overview(conn, operator(), minutes=views.CHART_MINUTES, failures=8)
    return {"queues": views.queue_rows(seen), "workers": seen.workers, "failures": seen.failures}


def _table(title: str) -> Any:
    from rich import box
    from rich.table import Table

    return Table(
        title=title,
        title_justify="left",
        title_style="bold",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1),
        collapse_padding=True,
    )


def render(
    data: dict[str, Any],
    *,
    now: str,
    width: int = 120,
    error: str | None = None,
    replica: str | None = None,
) -> RenderableType:
    """Build the screen: queues, daemons, recent failures (and an error line, if any;
    ``replica``: the line saying the screen was read from a replica)."""
    from rich.console import Group
    from rich.text import Text

    parts: list[RenderableType] = [Text(f"jobsd top   {now}   (Ctrl-C to quit)", style="bold")]
    if replica:
        parts.append(Text(replica, style="yellow"))
    if error:
        parts.append(Text(f"database unavailable: {error} (retrying)", style="bold red"))
    queues = _table("queues")
    spark = width >= WIDE
    queues.add_column(
        "queue", overflow="ellipsis", no_wrap=True, max_width=None if width >= WIDE else 14
    )
    for name in ("queued", "sched", "block", "run", "recov", "ok/1h", "fail/1h"):
        queues.add_column(name, justify="right", no_wrap=True, min_width=len(name))
    queues.add_column("lag", justify="right", no_wrap=True, min_width=3)
    queues.add_column("flags", no_wrap=True)
    if spark:  # a narrow terminal goes without the chart
        queues.add_column(f"last {SPARK_MINUTES} min", no_wrap=True)
    for q in data.get("queues", []):
        flags = " ".join(
            f
            for f in (
                "paused" if q.paused else "",
                "full" if q.full else "",
                f"cap {q.open_jobs}/{q.capacity}" if q.capacity is not None else "",
            )
            if f
        )
        c = q.counts
        queues.add_row(
            q.name,
            *(
                str(c[s])
                for s in ("queued", "scheduled", "blocked", "running", "recovery_required")
            ),
            str(q.succeeded_1h),
            Text(str(q.failed_1h), style="red" if q.failed_1h else ""),
            _span(q.lag_s),
            Text(flags, style="magenta"),
            *([_sparkline(q)] if spark else []),
        )
    parts.append(queues)
    daemons = _table("daemons")
    for name in ("worker", "host", "pid", "up", "heartbeat", "held"):
        daemons.add_column(name, justify="right" if name in ("pid", "held") else "left")
    now_ts = data.get("now_ts")
    for w in data.get("workers") or []:
        up = (now_ts - w["started_at"]).total_seconds() if now_ts else None
        beat = (now_ts - w["last_seen_at"]).total_seconds() if now_ts else None
        daemons.add_row(
            w["worker_id"],
            w["hostname"],
            str(w["pid"]),
            _span(up),
            _span(beat) + " ago",
            str(w["jobs_held"]),
        )
    if data.get("workers") is None and "queues" in data:
        daemons.add_row("(this role may not read jobsd.workers)", "", "", "", "", "")
    elif not data.get("workers"):
        daemons.add_row("(no daemon registered)", "", "", "", "", "")
    parts.append(daemons)
    failures = _table("recent failures")
    for name in ("job", "type", "queue", "org", "when"):
        failures.add_column(name, no_wrap=True)
    failures.add_column("error", overflow="ellipsis", no_wrap=True, ratio=1)
    for f in data.get("failures", []):
        ago = (now_ts - f["finished_at"]).total_seconds() if now_ts else None
        failures.add_row(
            str(f["id"])[:13],
            f["type"],
            f["queue"],
            f["org_id"],
            _span(ago) + " ago",
            Text((f["error"] or f["reason"] or "").splitlines()[0][:80], style="red"),
        )
    if not data.get("failures"):
        failures.add_row("(none)", "", "", "", "", "")
    parts.append(failures)
    return Group(*parts)


@click.command()
@click.option(
    "--interval", default="2s", show_default=True, help="Time between refreshes (e.g. 500ms, 5s)."
)
@click.option("--once", is_flag=True, help="Print one screen and exit (no refresh).")
@friendly_errors
def top(interval: str, once: bool) -> None:
    """Show queues, daemons and recent failures, refreshing until Ctrl-C (every org)."""
    import anyio
    from rich.console import Console
    from rich.live import Live

    from jobsd.errors import BackendUnavailable

    try:
        every_s = parse_duration(interval)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--interval") from exc
    if every_s <= 0:
        raise click.BadParameter("must be positive", param_hint="--interval")
    settings = load_settings()
    # the connections (to the replica, to the primary) are kept between screens; one
    # that failed is reopened at the next
    reader = lagging_reader(
        require_url(settings), settings.read_database_url, command="top", operation="jobsd top"
    )
    console = Console()

    async def screen() -> RenderableType:
        from datetime import UTC, datetime

        now = datetime.now(UTC)
        stamp = now.strftime("%Y-%m-%d %H:%M:%S UTC")
        try:
            served = await reader.read(_snapshot)
        except BackendUnavailable as exc:
            if once:
                raise
            error = " ".join(str(exc).split())  # one line
            return render({}, now=stamp, width=console.width, error=error)
        data = served.value
        data["now_ts"] = now
        return render(
            data, now=stamp, width=console.width, replica=replica_line(served.replica, served.lag_s)
        )

    async def main() -> None:
        try:
            if once:
                console.print(await screen())
                return
            with Live(console=console, auto_refresh=False, screen=False) as live:
                while True:
                    live.update(await screen(), refresh=True)
                    await anyio.sleep(every_s)
        finally:
            await reader.aclose()

    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: the normal way out
        anyio.run(main)
