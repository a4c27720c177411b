"""Pure pieces of the HTTP layer: cursors, addresses, tokens, watches, the metrics collector."""

from __future__ import annotations

import math
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from jobsd.http.backend import ApiBackend
from jobsd.http.health import threshold_warnings
from jobsd.http.metrics import JobsdCollector
from jobsd.http.routes import decode_cursor, encode_cursor
from jobsd.http.schemas import HealthReport
from jobsd.http.settings import HttpSettings, parse_addr
from jobsd.http.waiter import DoneWaiter
from jobsd.ops.tokens import hash_token, looks_like_token, new_token
from jobsd.settings import Settings
from jobsd.store.api import done_payload


@given(
    when=st.datetimes(
        min_value=datetime(1970, 1, 2),
        max_value=datetime(9998, 1, 1),
        timezones=st.sampled_from([UTC, None]).map(lambda tz: tz or UTC),
    ),
    job_id=st.uuids(),
)
def test_cursor_round_trips(when: datetime, job_id: uuid.UUID) -> None:
    cursor = decode_cursor(encode_cursor(when, job_id))
    assert (cursor.created_at, cursor.id) == (when, job_id)


@pytest.mark.parametrize("junk", ["", "x", "!!!!", "bm90IGEgY3Vyc29y", "MjAyNHw=", "w6k="])
def test_invalid_cursors_are_refused(junk: str) -> None:
    with pytest.raises(ValueError, match="invalid cursor"):
        decode_cursor(junk)


@pytest.mark.parametrize(
    ("addr", "expected"),
    [
        ("127.0.0.1:8080", ("127.0.0.1", 8080)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),
        ("[::1]:9000", ("::1", 9000)),
        (":8080", ("127.0.0.1", 8080)),
        ("localhost:80", ("localhost", 80)),
    ],
)
def test_parse_addr(addr: str, expected: tuple[str, int]) -> None:
    assert parse_addr(addr) == expected


@pytest.mark.parametrize("addr", ["8080", "host", "host:99999", "::1:80", "a:b"])
def test_bad_addresses_are_refused(addr: str) -> None:
    with pytest.raises(ValueError):
        parse_addr(addr)
    with pytest.raises(ValueError):
        HttpSettings(http_addr=addr)


def test_body_limit_follows_the_payload_cap() -> None:
    assert HttpSettings().body_limit(1000) == 2 * 1000 + 65_536
    assert HttpSettings(max_body_bytes=4096).body_limit(1000) == 4096


def test_tokens_are_random_and_only_their_hash_is_kept() -> None:
    tokens = {new_token() for _ in range(100)}
    assert len(tokens) == 100
    for token in tokens:
        assert looks_like_token(token)
        assert len(hash_token(token)) == 32
    assert not looks_like_token("jobsd_short")
    assert not looks_like_token("jobsd_" + "é" * 43)


async def _watch_semantics() -> None:
    waiter = DoneWaiter("postgresql://unused")
    waiter._key = "k"  # what the connection reads (migration 0012: payloads are hashed)
    job = uuid.uuid4()
    with waiter.watch(job) as watch:
        assert waiter.waiting == 1
        waiter._deliver(str(job))  # the bare id is no payload any more
        assert await watch.wait(0.01) is False
        waiter._deliver(done_payload("k", job))  # a notification before the wait is not lost
        with anyio.fail_after(1):
            assert await watch.wait(10) is True
        assert await watch.wait(0.01) is False  # re-armed
        waiter._deliver(done_payload("k", uuid.uuid4()))  # another job's notification
        assert await watch.wait(0.01) is False
        waiter._deliver("not a uuid")
        waiter.close()
        assert await watch.wait(10) is True
    assert waiter.waiting == 0
    with waiter.watch(job) as late:  # after close(), waits end at once
        assert await late.wait(10) is True


def test_watch_semantics() -> None:
    anyio.run(_watch_semantics)


@dataclass
class FakeRunTimes:
    bounds_s: tuple[float, ...] = (0.1, 1.0)
    counts: dict[str, list[int]] = field(default_factory=lambda: {"t": [2, 1, 1]})
    sums_s: dict[str, float] = field(default_factory=lambda: {"t": 3.5})


@dataclass
class FakeStats:
    claimed: Counter[str] = field(default_factory=lambda: Counter({"t": 4}))
    finished: Counter[tuple[str, str]] = field(
        default_factory=lambda: Counter({("t", "succeeded"): 3, ("t", "failed"): 1})
    )
    errors: Counter[tuple[str, str]] = field(default_factory=Counter)
    discarded: int = 0
    given_back: int = 2
    wakeups: Counter[str] = field(default_factory=lambda: Counter({"notify": 2, "poll": 5}))
    reconnects: int = 1
    swept: Counter[str] = field(default_factory=Counter)
    archived: int = 0
    archive_refused: int = 0
    last_notify_monotonic: float | None = None
    run_s: FakeRunTimes = field(default_factory=FakeRunTimes)


@dataclass
class FakeDaemon:
    settings: Settings = field(default_factory=lambda: Settings(database_url="x"))
    stats: FakeStats = field(default_factory=FakeStats)
    listener: object = field(default_factory=lambda: type("L", (), {"connected": True})())
    holdings: object = field(
        default_factory=lambda: type("H", (), {"slots": 10, "running": 3, "waiting": 7})()
    )


def test_collector_exports_daemon_counters_and_the_run_time_histogram() -> None:
    backend = ApiBackend(Settings(database_url="x"), HttpSettings(), daemon=FakeDaemon())  # type: ignore[arg-type]
    registry = CollectorRegistry()
    registry.register(JobsdCollector(backend))
    text = generate_latest(registry).decode()
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert values[("jobsd_jobs_claimed_total", (("type", "t"),))] == 4
    assert values[("jobsd_jobs_finished_total", (("status", "failed"), ("type", "t")))] == 1
    assert values[("jobsd_wakeups_total", (("cause", "poll"),))] == 5
    assert values[("jobsd_claimed_ahead_given_back_total", ())] == 2
    assert values[("jobsd_slots_busy", ())] == 3
    assert values[("jobsd_jobs_reserved", ())] == 7
    assert values[("jobsd_database_up", ())] == 0  # not started: no depth query ran
    assert math.isnan(values[("jobsd_seconds_since_last_notify", ())])
    buckets = {
        dict(labels)["le"]: v
        for (name, labels), v in values.items()
        if name == "jobsd_job_run_seconds_bucket"
    }
    assert buckets == {"0.1": 2, "1.0": 3, "+Inf": 4}  # cumulative
    assert values[("jobsd_job_run_seconds_count", (("type", "t"),))] == 4
    assert values[("jobsd_job_run_seconds_sum", (("type", "t"),))] == 3.5


def test_run_after_bounds() -> None:
    from pydantic import ValidationError

    from jobsd.http.schemas import JobIn

    soon = datetime.now(UTC) + timedelta(minutes=5)
    assert JobIn(type="t", run_after=soon).run_after == soon
    for bad in ("1969-12-31T23:00:00Z", "9999-12-31T23:00:00-05:00"):
        with pytest.raises(ValidationError):
            JobIn.model_validate({"type": "t", "run_after": bad})


def test_the_listening_socket_gives_connections_tcp_nodelay() -> None:
    """asyncio sets TCP_NODELAY only when proto is IPPROTO_TCP (else ~40 ms per request)."""
    import socket

    from jobsd.http.server import _bind

    sock = _bind("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
        client = socket.create_connection(sock.getsockname()[:2])
        sock.setblocking(True)
        accepted, _ = sock.accept()
        with client, accepted:
            assert accepted.proto == socket.IPPROTO_TCP
    finally:
        sock.close()


def test_health_figures_over_their_thresholds_warn_in_these_words() -> None:
    report = HealthReport.model_validate(
        {
            "status": "ok",
            "warnings": [],
            "database": True,
            "oldest_queued_age_s": 61.4,
            "live_tuples": 10,
            "dead_tuples": 100_001,
            "last_vacuum_at": None,
            "oldest_xact_age_s": 301.0,
            "oldest_prepared_xact_age_s": 299.0,  # under its threshold: no warning
            "notify_queue_usage": 0.75,
            "last_notify_age_s": None,
            "last_done_notify_age_s": None,
            "listen_connected": True,
            "slots": None,
            "slots_busy": None,
        }
    )
    assert threshold_warnings(report, HttpSettings()) == [
        "pickup lag: a queued job has waited 61 s (over 60 s): too few slots, or no daemon "
        "for its queue",
        "jobsd.jobs holds 100001 dead tuples (over 100000): vacuum is falling behind",
        "a transaction has been open 301 s (over 300 s): it holds back vacuum of the jobs table",
        "the NOTIFY queue is 75% full (over 50%): a session that LISTENs is stuck in a "
        "transaction; at 100 % enqueues fail",
    ]
    report.oldest_prepared_xact_age_s = 400.0
    report.oldest_queued_age_s = report.dead_tuples = report.notify_queue_usage = None
    report.oldest_xact_age_s = None
    assert threshold_warnings(report, HttpSettings()) == [
        "a prepared transaction has been open 400 s (over 300 s): it holds back vacuum of the "
        "jobs table"
    ]
