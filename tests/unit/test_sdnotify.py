"""sd_notify against a fake systemd: a datagram socket the test binds."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from jobsd.worker import sdnotify
from jobsd.worker.clock import SYSTEM_CLOCK
from jobsd.worker.sdnotify import Watchdog, WatchdogSettings, watchdog_interval_s


class FakeSystemd:
    """A bound unix datagram socket that collects the messages sent to it."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)

    def receive(self, timeout_s: float = 2.0) -> str:
        self.sock.settimeout(timeout_s)
        return self.sock.recv(4096).decode()

    def pending(self) -> list[str]:
        """Return every message already queued, without waiting."""
        self.sock.setblocking(False)
        messages = []
        try:
            while True:
                messages.append(self.sock.recv(4096).decode())
        except BlockingIOError:
            return messages
        finally:
            self.sock.setblocking(True)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def fake_systemd(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSystemd]:
    """Bind a notify socket in a temporary directory and point NOTIFY_SOCKET at it."""
    with tempfile.TemporaryDirectory(prefix="jobsd-notify-") as tmp:
        path = str(Path(tmp) / "notify")
        fake = FakeSystemd(path)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        try:
            yield fake
        finally:
            fake.close()


def test_ready_stopping_watchdog_status(fake_systemd: FakeSystemd) -> None:
    assert sdnotify.ready("claiming from 2 queues") is True
    assert fake_systemd.receive() == "READY=1\nSTATUS=claiming from 2 queues"
    assert sdnotify.ready() is True
    assert fake_systemd.receive() == "READY=1"
    assert sdnotify.watchdog() is True
    assert fake_systemd.receive() == "WATCHDOG=1"
    assert sdnotify.status("draining 3 jobs") is True
    assert fake_systemd.receive() == "STATUS=draining 3 jobs"
    assert sdnotify.stopping() is True
    assert fake_systemd.receive() == "STOPPING=1"


def test_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"jobsd-test-{os.getpid()}-{os.urandom(4).hex()}"
    fake = FakeSystemd("\0" + name)
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert sdnotify.ready() is True
        assert fake.receive() == "READY=1"
    finally:
        fake.close()


def test_no_op_outside_systemd(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sdnotify.ready() is False
    assert sdnotify.watchdog() is False
    # a socket that is gone, or an address kind we do not speak: False, never an exception
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens"))
    assert sdnotify.stopping() is False
    monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:1234")
    assert sdnotify.notify("READY=1") is False


def test_watchdog_interval_from_environment() -> None:
    me = str(os.getpid())
    assert watchdog_interval_s({}) is None
    assert watchdog_interval_s({"WATCHDOG_USEC": "30000000"}) == 30.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "500000", "WATCHDOG_PID": me}) == 0.5
    # inherited from a parent process: not ours to ping
    assert watchdog_interval_s({"WATCHDOG_USEC": "500000", "WATCHDOG_PID": "1"}) is None
    assert watchdog_interval_s({"WATCHDOG_USEC": "soon"}) is None
    assert watchdog_interval_s({"WATCHDOG_USEC": "0"}) is None


@pytest.mark.anyio
async def test_watchdog_run_once_pings_only_while_healthy(fake_systemd: FakeSystemd) -> None:
    healthy = [True]
    dog = Watchdog(WatchdogSettings(10), SYSTEM_CLOCK, lambda: healthy[0])
    assert await dog.run_once() is True
    assert fake_systemd.receive() == "WATCHDOG=1"
    healthy[0] = False
    assert await dog.run_once() is False
    assert dog.healthy is False
    healthy[0] = True
    assert await dog.run_once() is True
    assert fake_systemd.pending() == ["WATCHDOG=1"]
    assert dog.pings == 2


@pytest.mark.anyio
async def test_watchdog_async_health_crash_or_slowness_is_unhealthy(
    fake_systemd: FakeSystemd,
) -> None:
    async def database_answers() -> bool:
        await anyio.lowlevel.checkpoint()
        return True

    async def database_hangs() -> bool:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    def crashes() -> bool:
        raise RuntimeError("health check crashed")

    assert await Watchdog(WatchdogSettings(10), SYSTEM_CLOCK, database_answers).run_once() is True
    crashing = Watchdog(WatchdogSettings(10), SYSTEM_CLOCK, crashes)
    assert await crashing.run_once() is False
    assert crashing.last_problem == "health check failed: RuntimeError: health check crashed"
    hanging = Watchdog(WatchdogSettings(0.4), SYSTEM_CLOCK, database_hangs)
    with anyio.fail_after(2):  # cut at a quarter of the interval
        assert await hanging.run_once() is False
    assert hanging.last_problem == "health check slower than 0.1 s"
    assert fake_systemd.pending() == ["WATCHDOG=1"]


@pytest.mark.anyio
async def test_watchdog_service_stops_pinging_when_unhealthy(
    fake_systemd: FakeSystemd, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "100000")  # 0.1 s: a ping every 0.05 s
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    healthy = True
    checks_while_sick = 0
    sick_checks_seen = anyio.Event()

    def health() -> bool:
        nonlocal checks_while_sick
        if not healthy:
            checks_while_sick += 1
            if checks_while_sick == 3:
                sick_checks_seen.set()
        return healthy

    dog = Watchdog(WatchdogSettings.from_environment(), SYSTEM_CLOCK, health)
    assert dog.interval_s == 0.1
    async with anyio.create_task_group() as tg:
        await tg.start(dog.run)
        with anyio.fail_after(5):
            for _ in range(3):  # three pings while healthy
                assert await anyio.to_thread.run_sync(fake_systemd.receive) == "WATCHDOG=1"
        healthy = False
        fake_systemd.pending()  # a ping may have left between the receive and the flip
        with anyio.fail_after(5):
            await sick_checks_seen.wait()  # three more rounds of the loop, all sick
        assert fake_systemd.pending() == []
        healthy = True
        with anyio.fail_after(5):
            assert await anyio.to_thread.run_sync(fake_systemd.receive) == "WATCHDOG=1"
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_watchdog_service_returns_without_systemd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    with anyio.fail_after(1):
        no_watchdog = WatchdogSettings.from_environment()
        await Watchdog(no_watchdog, SYSTEM_CLOCK, lambda: True).run()  # nothing to do: returns
