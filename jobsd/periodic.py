"""Periodic jobs: schedules declared next to their handler or in a TOML file, and their ticks.

A schedule is a cron expression (5 fields, or 6 with seconds first; ``cronsim``) read
in its timezone (``zoneinfo``; DST as Debian cron: a time that does not exist runs at
the first minute after the jump, a time that exists twice runs once), or a fixed
interval (``every="30s"``, the duration syntax of the settings) whose ticks are the
multiples of the interval since the Unix epoch. Either way every daemon computes the
same ticks, so the database can make each one fire once (``jobsd.worker.scheduler``).

This module is pure: the ticks, the checks and the declarations. Semantics in
docs/periodic.md.
"""

from __future__ import annotations

import math
import re
import tomllib
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, Required, TypedDict, TypeVar, Unpack
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from jobsd.errors import ConfigError
from jobsd.jsonsafe import encode_object
from jobsd.settings import parse_duration

__all__ = [
    "CATCH_UP",
    "TICK_KEY",
    "CatchUp",
    "Schedule",
    "ScheduleInfo",
    "ScheduleOptions",
    "ScheduleRegistry",
    "TickPlan",
    "default_schedules",
    "load_schedules_file",
    "periodic",
    "plan_ticks",
]

CatchUp = Literal["latest", "all", "none"]
CATCH_UP: tuple[CatchUp, ...] = ("latest", "all", "none")
TICK_KEY = "_schedule"
"""the payload key under which a periodic job carries ``{"id": ..., "tick": ...}``"""

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,199}$")
_ONE_US = timedelta(microseconds=1)
_QUARTER = timedelta(minutes=15)
# missed ticks counted at most per pass (a per-second schedule after a month away)
_COUNT_CAP = 10_000

F = TypeVar("F", bound=Callable[..., Any])


class ScheduleOptions(TypedDict, total=False):
    """What ``periodic`` (and a ``[[schedules]]`` table) declares besides ``cron``."""

    type: Required[str]
    """The type of each job."""
    org_id: Required[str]
    """The org each job belongs to."""
    id: str | None
    """The schedule's name (default: the type); one per schedule of a type."""
    every: str | float | None
    """A fixed interval (``"30s"``, or seconds) instead of ``cron``."""
    timezone: str
    """The zone ``cron`` is read in (``UTC``)."""
    payload: Mapping[str, Any] | None
    """Each job's payload, plus ``"_schedule": {"id": ..., "tick": ...}``."""
    queue: str
    """Each job's queue (``default``)."""
    catch_up: str
    """``latest`` (default), ``all`` (up to ``catch_up_max``) or ``none``."""
    catch_up_max: int | None
    """How many missed ticks ``catch_up="all"`` fires at most; None: the setting."""
    priority: int
    """Each job's priority (0)."""
    dedup_key: str | None
    """Each job's dedup key."""
    concurrency_key: str | None
    """Each job's concurrency key."""


@dataclass(frozen=True, slots=True)
class Schedule:
    """One schedule: when (cron or every), what (a job) and how to catch up."""

    id: str
    type: str
    org_id: str
    cron: str | None = None
    every_ms: int | None = None
    timezone: str = "UTC"
    payload: Mapping[str, Any] = field(default_factory=dict)
    queue: str = "default"
    catch_up: CatchUp = "latest"
    catch_up_max: int | None = None
    """how many missed ticks ``catch_up="all"`` fires at most; None: the setting"""
    priority: int = 0
    dedup_key: str | None = None
    concurrency_key: str | None = None

    @classmethod
    def build(
        cls,
        cron: str | None = None,
        *,
        id: str | None = None,
        type: str,
        org_id: str,
        every: str | float | None = None,
        timezone: str = "UTC",
        payload: Mapping[str, Any] | None = None,
        queue: str = "default",
        catch_up: str = "latest",
        catch_up_max: int | None = None,
        priority: int = 0,
        dedup_key: str | None = None,
        concurrency_key: str | None = None,
    ) -> Schedule:
        """Check a declaration; raise ConfigError naming the schedule and what is wrong."""
        if not isinstance(type, str) or not type:
            raise ConfigError("schedule: type must be a non-empty string")
        name = id if id is not None else type
        where = f"schedule {name!r}"
        if not isinstance(name, str) or not _ID.match(name):
            raise ConfigError(
                f"{where}: id must be 1 to 200 letters, digits and _ . : @ - (not first)"
            )
        if not isinstance(org_id, str) or not org_id:
            raise ConfigError(f"{where}: org_id must be a non-empty string")
        if not isinstance(queue, str) or not queue:
            raise ConfigError(f"{where}: queue must be a non-empty string")
        if (cron is None) == (every is None):
            raise ConfigError(f"{where}: give either a cron expression or every=, not both")
        every_ms = None
        if every is not None:
            try:
                seconds = parse_duration(every)
            except ValueError as exc:
                raise ConfigError(f"{where}: every: {exc}") from None
            if not math.isfinite(seconds) or seconds < 1:
                raise ConfigError(f"{where}: every must be at least 1s, not {every!r}")
            every_ms = round(seconds * 1000)
        try:
            zone = ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise ConfigError(f"{where}: unknown timezone {timezone!r}") from None
        if cron is not None:
            if not isinstance(cron, str):
                raise ConfigError(f"{where}: cron must be a string")
            try:
                from cronsim import CronSim, CronSimError
            except ImportError:
                raise ConfigError(
                    f"{where}: cron schedules run in the daemon, which needs the server "
                    "extra: pip install 'jobsd[server]'"
                ) from None
            try:
                CronSim(cron, datetime(2000, 1, 1, tzinfo=zone))
            except (CronSimError, ValueError, IndexError) as exc:
                raise ConfigError(f"{where}: bad cron expression {cron!r}: {exc}") from None
        if catch_up not in CATCH_UP:
            raise ConfigError(
                f"{where}: catch_up must be 'latest', 'all' or 'none', not {catch_up!r}"
            )
        if catch_up_max is not None and (
            not isinstance(catch_up_max, int) or isinstance(catch_up_max, bool) or catch_up_max < 1
        ):
            raise ConfigError(f"{where}: catch_up_max must be a positive integer")
        for key, value in (("dedup_key", dedup_key), ("concurrency_key", concurrency_key)):
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"{where}: {key} must be a non-empty string")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ConfigError(f"{where}: priority must be an integer")
        body = dict(payload or {})
        if TICK_KEY in body:
            raise ConfigError(f"{where}: payload key {TICK_KEY!r} is jobsd's (the tick)")
        try:
            encode_object(body, what="payload", max_bytes=None)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        return cls(
            id=name,
            type=type,
            org_id=org_id,
            cron=cron,
            every_ms=every_ms,
            timezone=timezone,
            payload=body,
            queue=queue,
            catch_up=catch_up,
            catch_up_max=catch_up_max,
            priority=priority,
            dedup_key=dedup_key,
            concurrency_key=concurrency_key,
        )

    @property
    def spec(self) -> str:
        """Return the cron expression, or ``every 30s``."""
        if self.cron is not None:
            return self.cron
        assert self.every_ms is not None
        return f"every {_duration_text(self.every_ms)}"

    def ticks_down(self, until: datetime) -> Iterator[datetime]:
        """Yield the ticks at or before ``until``, newest first, in UTC."""
        if self.every_ms is not None:
            step = self.every_ms
            ms = math.floor(until.timestamp() * 1000)
            at_ms = ms - ms % step
            while True:
                yield datetime.fromtimestamp(at_ms / 1000, UTC)
                at_ms -= step
        assert self.cron is not None
        zone = ZoneInfo(self.timezone)
        # cronsim loses its way when it starts inside an hour that repeats (clocks
        # going back: the second 02:00-03:00, fold=1): start after it, drop the extra
        start = _unfolded(until, zone)
        local = start.astimezone(zone)
        # cronsim's reverse iteration starts at ``local`` itself only when it has
        # microseconds (they are dropped): so ``until`` is included
        local = local if local.microsecond else local + _ONE_US
        from cronsim import CronSim

        for tick in CronSim(self.cron, local, reverse=True):
            at = tick.astimezone(UTC)
            if at <= until:
                yield at

    def next_tick(self, after: datetime) -> datetime:
        """Return the first tick after ``after``, in UTC."""
        if self.every_ms is not None:
            ms = math.floor(after.timestamp() * 1000)
            return datetime.fromtimestamp((ms - ms % self.every_ms + self.every_ms) / 1000, UTC)
        assert self.cron is not None
        zone = ZoneInfo(self.timezone)
        local = _unfolded(after, zone).astimezone(zone)
        from cronsim import CronSim

        candidate = next(iter(CronSim(self.cron, local))).astimezone(UTC)
        # cronsim's forward steps pass over an hour that repeats when clocks go back
        # ("0 * * * *" at 02:00 CEST, then 02:00 CET), its reverse steps do not:
        # the ticks are the reverse ones, so the next tick is the oldest of them
        # between ``after`` and the forward answer
        earlier = None
        for tick in self.ticks_down(candidate - _ONE_US):
            if tick <= after:
                break
            earlier = tick
        return earlier or candidate

    def job_payload(self, tick: datetime) -> dict[str, Any]:
        """Return the payload of the job of ``tick``: the declared one plus the tick."""
        return {**self.payload, TICK_KEY: {"id": self.id, "tick": tick.isoformat()}}

    def row(self) -> dict[str, Any]:
        """Return the parameters of ``schedules_upsert`` (without ``now``): every field,
        the payload as JSON text."""
        payload = encode_object(dict(self.payload), what="payload", max_bytes=None)
        return {**{k: getattr(self, k) for k in self.__slots__}, "payload": payload}


def _unfolded(at: datetime, zone: ZoneInfo) -> datetime:
    """Return ``at``, or the first quarter hour after it outside a repeated local hour."""
    while at.astimezone(zone).fold:
        at += _QUARTER
    return at


def _duration_text(ms: int) -> str:
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


@dataclass(frozen=True, slots=True)
class TickPlan:
    """What a pass does with the ticks of one schedule after ``since`` up to ``now``."""

    fire: list[tuple[datetime, bool]]
    """ticks to fire, oldest first, each with whether it is late (missed)"""
    skipped: int
    """missed ticks the catch-up policy does not fire (counted up to 10,000)"""
    skipped_until: datetime | None
    """the newest skipped tick"""


def plan_ticks(
    schedule: Schedule,
    *,
    since: datetime,
    now: datetime,
    grace_s: float,
    catch_up_max: int,
) -> TickPlan:
    """Decide which ticks in (``since``, ``now``] fire.

    A tick at most ``grace_s`` old is on time: it always fires. An older one was
    missed (no scheduler ran then): ``latest`` fires the newest missed tick unless
    an on-time tick fires (one job either way), ``all`` the newest ``catch_up_max``
    (the schedule's own bound first), ``none`` none. The missed ticks not fired are
    skipped (counted, never fired later).
    """
    bound = schedule.catch_up_max or catch_up_max
    keep = {"latest": 1, "all": bound, "none": 0}[schedule.catch_up]
    latest = schedule.catch_up == "latest"
    on_time_after = now - timedelta(seconds=grace_s)
    fire: list[tuple[datetime, bool]] = []
    missed_kept = 0
    skipped = 0
    skipped_until: datetime | None = None
    for tick in schedule.ticks_down(now):
        if tick <= since:
            break
        if tick > on_time_after:
            fire.append((tick, False))
        elif missed_kept < keep and not (latest and fire):
            fire.append((tick, True))
            missed_kept += 1
        else:
            skipped += 1
            if skipped_until is None:
                skipped_until = tick
            if skipped >= _COUNT_CAP:
                break
    fire.reverse()
    return TickPlan(fire=fire, skipped=skipped, skipped_until=skipped_until)


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A schedule as the database knows it: its definition, state and last tick."""

    id: str
    type: str
    org_id: str
    queue: str
    cron: str | None
    every_ms: int | None
    timezone: str
    payload: dict[str, Any]
    priority: int
    dedup_key: str | None
    concurrency_key: str | None
    catch_up: str
    catch_up_max: int | None
    paused: bool
    paused_at: datetime | None
    resumed_at: datetime | None
    created_at: datetime
    updated_at: datetime
    last_tick: datetime | None
    last_job_id: uuid.UUID | None
    last_outcome: str | None
    """enqueued, existing (a job holding the dedup key) or refused"""
    last_reason: str | None
    last_job_status: str | None
    fired: int
    refused: int
    late: int
    skipped: int
    skipped_until: datetime | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ScheduleInfo:
        """Build from a row of ``jobsd.schedule_info()``."""
        return cls(**{k: row[k] for k in cls.__slots__})

    @property
    def schedule(self) -> Schedule:
        """Return the definition (to compute ticks)."""
        return Schedule(
            id=self.id,
            type=self.type,
            org_id=self.org_id,
            cron=self.cron,
            every_ms=self.every_ms,
            timezone=self.timezone,
            payload=self.payload,
            queue=self.queue,
            catch_up=self.catch_up if self.catch_up in CATCH_UP else "latest",
            catch_up_max=self.catch_up_max,
        )

    def next_tick(self, now: datetime) -> datetime | None:
        """Return the next tick that may fire after ``now``: None while paused."""
        if self.paused:
            return None
        since = max(t for t in (self.created_at, self.resumed_at, self.last_tick, now) if t)
        return self.schedule.next_tick(since)

    @property
    def last_state(self) -> str | None:
        """Return the state of the last tick: its job's state, or ``refused``."""
        if self.last_outcome == "refused":
            return "refused"
        return self.last_job_status

    def to_json(self, now: datetime) -> dict[str, Any]:
        """Return a JSON-ready dict (times in ISO 8601), as ``jobsd schedule list --json``."""
        next_tick = self.next_tick(now)
        return {
            "id": self.id,
            "type": self.type,
            "org_id": self.org_id,
            "queue": self.queue,
            "cron": self.cron,
            "every_s": self.every_ms / 1000 if self.every_ms is not None else None,
            "spec": self.schedule.spec,
            "timezone": self.timezone,
            "catch_up": self.catch_up,
            "paused": self.paused,
            "next_tick": _iso(next_tick),
            "last_tick": _iso(self.last_tick),
            "last_job_id": str(self.last_job_id) if self.last_job_id else None,
            "last_state": self.last_state,
            "last_reason": self.last_reason,
            "fired": self.fired,
            "refused": self.refused,
            "late": self.late,
            "skipped": self.skipped,
        }


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


class ScheduleRegistry:
    """The schedules a daemon declares, by id."""

    def __init__(self) -> None:
        self._schedules: dict[str, Schedule] = {}

    def add(self, schedule: Schedule) -> None:
        """Declare a schedule; an id can be declared once (the same declaration again is fine)."""
        known = self._schedules.get(schedule.id)
        if known is not None and known != schedule:
            raise ConfigError(f"schedule {schedule.id!r} is declared twice, differently")
        self._schedules[schedule.id] = schedule

    def all(self) -> list[Schedule]:
        """Return the schedules, by id."""
        return [self._schedules[k] for k in sorted(self._schedules)]

    def merged(self, others: list[Schedule]) -> list[Schedule]:
        """Return these schedules and ``others`` (a file's), by id; a clash is a ConfigError."""
        combined = ScheduleRegistry()
        for schedule in [*self.all(), *others]:
            combined.add(schedule)
        return combined.all()

    def clear(self) -> None:
        """Forget every schedule (tests)."""
        self._schedules.clear()


default_schedules = ScheduleRegistry()


def periodic(
    cron: str | None = None,
    *,
    registry: ScheduleRegistry | None = None,
    **options: Unpack[ScheduleOptions],
) -> Callable[[F], F]:
    """Declare a schedule that enqueues a job of ``type`` at each tick; decorate anything.

    ``cron`` (``"*/5 * * * *"``, read in ``timezone``) or ``every`` (``"30s"``).
    ``id`` defaults to the type: give one per schedule when a type has several.
    The job's payload is ``payload`` plus ``"_schedule": {"id": ..., "tick": ...}``
    (the tick in ISO 8601, UTC): handlers can be idempotent per tick.
    ``catch_up``: ``latest`` (default), ``all`` (up to ``catch_up_max``) or ``none``.
    ``priority``, ``dedup_key``, ``concurrency_key``: the enqueue options of each job.
    """
    schedule = Schedule.build(cron, **options)
    (registry or default_schedules).add(schedule)

    def declare(func: F) -> F:
        return func

    return declare


# a [[schedules]] table holds the arguments of ``periodic``
_FILE_KEYS = frozenset({"cron", *ScheduleOptions.__annotations__})


def load_schedules_file(path: str | Path) -> list[Schedule]:
    """Read the ``[[schedules]]`` tables of a TOML file; raise ConfigError on one line.

    Each table takes the arguments of ``periodic`` (``cron`` or ``every``, ``type``,
    ``org_id``, ...).
    """
    where = f"JOBSD_SCHEDULES={str(path)!r}"
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML: {exc}") from None
    unknown_top = sorted(set(data) - {"schedules"})
    if unknown_top:
        raise ConfigError(f"{where}: unknown key {unknown_top[0]!r} (expected [[schedules]])")
    tables = data.get("schedules", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"{where}: 'schedules' must be an array of tables ([[schedules]])")
    found = ScheduleRegistry()
    for number, table in enumerate(tables, start=1):
        unknown = sorted(set(table) - _FILE_KEYS)
        if unknown:
            raise ConfigError(f"{where}: schedule #{number}: unknown key {unknown[0]!r}")
        for key in ("type", "org_id"):
            if key not in table:
                raise ConfigError(f"{where}: schedule #{number}: {key} is missing")
        args = {k: v for k, v in table.items() if k != "cron"}
        try:
            schedule = Schedule.build(table.get("cron"), **args)
            if schedule.id in {s.id for s in found.all()}:
                raise ConfigError(f"schedule {schedule.id!r} is declared twice")
            found.add(schedule)
        except ConfigError as exc:
            raise ConfigError(f"{where}: schedule #{number}: {exc}") from None
        except TypeError as exc:
            raise ConfigError(f"{where}: schedule #{number}: {exc}") from None
    return found.all()
