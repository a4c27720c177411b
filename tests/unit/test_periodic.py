"""Periodic schedules without a database: ticks, catch-up plans, declarations, the TOML file."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from jobsd.errors import ConfigError
from jobsd.periodic import (
    TICK_KEY,
    Schedule,
    ScheduleRegistry,
    load_schedules_file,
    periodic,
    plan_ticks,
)

PARIS = ZoneInfo("Europe/Paris")
SPRING = datetime(2026, 3, 27, 12, tzinfo=UTC)
AUTUMN = datetime(2026, 10, 23, 12, tzinfo=UTC)


def fired(schedule: Schedule, start: datetime, end: datetime, step: timedelta) -> list[datetime]:
    """Simulate passes every ``step`` from ``start`` to ``end``: the ticks fired, in order."""
    since, now, out = start, start, []
    while now <= end:
        plan = plan_ticks(schedule, since=since, now=now, grace_s=3600, catch_up_max=100)
        out += [tick for tick, _ in plan.fire]
        since = max([since, *(t for t, _ in plan.fire)])
        now += step
    return out


@pytest.mark.parametrize("step_min", [1, 7, 25])
@pytest.mark.parametrize(
    ("start", "expected"),
    [
        (SPRING, ["03-28T02:30+01", "03-29T03:00+02", "03-30T02:30+02"]),
        (AUTUMN, ["10-24T02:30+02", "10-25T02:30+02", "10-26T02:30+01"]),
    ],
)
def test_a_daily_paris_tick_fires_once_a_day_whatever_the_pass_interval(
    start: datetime, expected: list[str], step_min: int
) -> None:
    daily = Schedule.build("30 2 * * *", type="t", org_id="a", timezone="Europe/Paris")
    ticks = fired(daily, start, start + timedelta(days=3), timedelta(minutes=step_min))
    assert [t.astimezone(PARIS).strftime("%m-%dT%H:%M%z")[:-2] for t in ticks] == expected


def test_an_hourly_paris_tick_fires_every_real_hour_across_both_dst_changes() -> None:
    hourly = Schedule.build("0 * * * *", type="t", org_id="a", timezone="Europe/Paris")
    for night in (datetime(2026, 3, 28, 22, tzinfo=UTC), datetime(2026, 10, 24, 22, tzinfo=UTC)):
        ticks = fired(hourly, night, night + timedelta(hours=6), timedelta(minutes=10))
        assert ticks == [night + timedelta(hours=h) for h in range(1, 7)]
        for after in ticks:  # the next tick agrees with the ticks, across the change
            assert hourly.next_tick(after - timedelta(seconds=1)) == after


def test_interval_ticks_are_multiples_of_the_interval_since_the_epoch() -> None:
    every = Schedule.build(type="t", org_id="a", every="90s")
    now = datetime(2026, 6, 1, 12, 0, 40, 500_000, tzinfo=UTC)
    down = list(itertools.islice(every.ticks_down(now), 3))
    assert [t.timestamp() % 90 for t in down] == [0, 0, 0]
    assert down == [
        datetime(2026, 6, 1, 12, 0, tzinfo=UTC) - timedelta(seconds=90 * n) for n in range(3)
    ]
    assert every.next_tick(now) == datetime(2026, 6, 1, 12, 1, 30, tzinfo=UTC)
    assert every.next_tick(down[0]) == datetime(2026, 6, 1, 12, 1, 30, tzinfo=UTC)
    assert every.spec == "every 90s"
    assert Schedule.build(type="t", org_id="a", every="1h").spec == "every 1h"


def test_catch_up_plans_after_a_gap() -> None:
    since = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)
    now = since + timedelta(minutes=10)  # ticks 12:01 .. 12:10, all older than the grace

    def plan(catch_up: str, **kw: int) -> tuple[list[int], int]:
        s = Schedule.build(type="t", org_id="a", every="60s", catch_up=catch_up, **kw)
        p = plan_ticks(s, since=since, now=now, grace_s=10, catch_up_max=3)
        assert all(late for _, late in p.fire)
        return [t.minute for t, _ in p.fire], p.skipped

    assert plan("latest") == ([10], 9)
    assert plan("all") == ([8, 9, 10], 7)  # the setting's bound
    assert plan("all", catch_up_max=5) == ([6, 7, 8, 9, 10], 5)  # the schedule's own
    assert plan("none") == ([], 10)
    # an on-time tick fires whatever the policy; `latest` then fires nothing missed
    latest = Schedule.build(type="t", org_id="a", every="60s")
    p = plan_ticks(latest, since=since, now=now + timedelta(seconds=35), grace_s=60, catch_up_max=3)
    assert [(t.minute, late) for t, late in p.fire] == [(11, False)] and p.skipped == 10


def test_declarations_are_checked_with_the_schedule_named() -> None:
    cases = [
        (dict(cron="61 * * * *"), "schedule 'x': bad cron expression '61 * * * *'"),
        (dict(cron="* * *"), "bad cron expression"),
        (dict(), "give either a cron expression or every="),
        (dict(cron="* * * * *", every="1m"), "not both"),
        (dict(every="soon"), "every: not a duration"),
        (dict(every="500ms"), "every must be at least 1s"),
        (dict(every="1m", timezone="Mars/Base"), "unknown timezone 'Mars/Base'"),
        (dict(every="1m", catch_up="some"), "catch_up must be 'latest', 'all' or 'none'"),
        (dict(every="1m", catch_up_max=0), "catch_up_max must be a positive integer"),
        (dict(every="1m", payload={TICK_KEY: 1}), "payload key '_schedule' is jobsd's"),
        (dict(every="1m", payload={"x": float("nan")}), "payload is not valid JSON"),
        (dict(every="1m", org_id=""), "org_id must be a non-empty string"),
        (dict(every="1m", id="bad id"), "id must be 1 to 200 letters"),
    ]
    for kwargs, message in cases:
        args = {"id": "x", "type": "t", "org_id": "a", **kwargs}
        cron = args.pop("cron", None)
        with pytest.raises(ConfigError, match=message.replace("*", r"\*").replace("(", r"\(")):
            Schedule.build(cron, **args)  # type: ignore[arg-type]


def test_periodic_declares_next_to_the_handler() -> None:
    registry = ScheduleRegistry()

    @periodic("*/5 * * * *", type="map_reconcile", org_id="acme", id="a", registry=registry)
    @periodic(every="30s", type="map_reconcile", org_id="acme", id="b", registry=registry)
    def handler() -> None: ...

    assert [s.id for s in registry.all()] == ["a", "b"]
    assert handler.__name__ == "handler"
    with pytest.raises(ConfigError, match="'a' is declared twice, differently"):
        periodic(every="1m", type="other", org_id="acme", id="a", registry=registry)
    tick = datetime(2026, 6, 1, tzinfo=UTC)
    assert registry.all()[0].job_payload(tick) == {
        TICK_KEY: {"id": "a", "tick": "2026-06-01T00:00:00+00:00"}
    }


def test_the_schedules_file(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text(
        '[[schedules]]\nid = "nightly"\ncron = "30 2 * * *"\ntimezone = "Europe/Paris"\n'
        'type = "purge"\norg_id = "acme"\npayload = { days = 30 }\ncatch_up = "none"\n\n'
        '[[schedules]]\nevery = "30s"\ntype = "beat"\norg_id = "acme"\nqueue = "ops"\n'
    )
    beat, nightly = load_schedules_file(good)
    assert (nightly.id, nightly.cron, nightly.payload, nightly.catch_up) == (
        "nightly", "30 2 * * *", {"days": 30}, "none",
    )  # fmt: skip
    assert (beat.id, beat.every_ms, beat.queue) == ("beat", 30_000, "ops")

    bad = {
        "missing.toml": None,
        "syntax.toml": "[[schedules]\n",
        "top.toml": "[jobs]\n",
        "notarray.toml": 'schedules = "x"\n',
        "key.toml": '[[schedules]]\ntype = "t"\norg_id = "a"\nevery = "1m"\ncolour = 1\n',
        "type.toml": '[[schedules]]\norg_id = "a"\nevery = "1m"\n',
        "twice.toml": '[[schedules]]\ntype = "t"\norg_id = "a"\nevery = "1m"\n' * 2,
    }
    messages = {
        "missing.toml": "cannot read it",
        "syntax.toml": "not valid TOML",
        "top.toml": "unknown key 'jobs' (expected [[schedules]])",
        "notarray.toml": "'schedules' must be an array of tables",
        "key.toml": "schedule #1: unknown key 'colour'",
        "type.toml": "schedule #1: type is missing",
        "twice.toml": "schedule #2: schedule 't' is declared twice",
    }
    for name, text in bad.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        with pytest.raises(ConfigError) as info:
            load_schedules_file(path)
        message = str(info.value)
        assert message.startswith(f"JOBSD_SCHEDULES='{path}': "), message
        assert messages[name] in message, message
        assert "\n" not in message
