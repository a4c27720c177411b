"""Tell systemd how the daemon is doing: READY, STOPPING, STATUS and watchdog pings.

The sd_notify protocol is one datagram per message on the unix socket named by
``$NOTIFY_SOCKET`` (a path, or ``@name`` for the abstract namespace). Outside systemd
the variable is unset and every function here does nothing and returns False.

``Watchdog`` pings ``WATCHDOG=1`` about every third of the interval systemd asks for
(``WatchdogSec=`` in the unit, seen here as ``$WATCHDOG_USEC``; jittered, never later
than 4/9 of it), and only while the
``health`` callable says the daemon is useful, so systemd restarts a daemon that is
alive but stuck. A blocked event loop stops the pings by itself.
"""

from __future__ import annotations

import inspect
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import anyio
from anyio.abc import TaskStatus

from jobsd.worker.clock import Clock
from jobsd.worker.loop import pause, run_loop

__all__ = [
    "Watchdog",
    "WatchdogSettings",
    "notify",
    "ready",
    "status",
    "stopping",
    "watchdog",
    "watchdog_interval_s",
]

log = logging.getLogger(__name__)

# a datagram to a listening systemd is never slow; do not hang if it is not read
_SEND_TIMEOUT_S = 1.0


def notify(message: str) -> bool:
    """Send one sd_notify message (``KEY=value`` lines); return whether it was sent.

    Never raises: a missing or broken socket is logged at DEBUG and gives False.
    """
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    elif not address.startswith("/"):
        log.debug("sdnotify.unsupported_socket", extra={"notify_socket": address})
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(_SEND_TIMEOUT_S)
            sock.connect(address)
            sock.sendall(message.encode("utf-8"))
    except OSError as exc:
        log.debug("sdnotify.send_failed", extra={"error": str(exc)})
        return False
    return True


def ready(status_text: str | None = None) -> bool:
    """Say the daemon is up (``READY=1``), with an optional status line."""
    return notify("READY=1" + (f"\nSTATUS={status_text}" if status_text else ""))


def stopping(status_text: str | None = None) -> bool:
    """Say the daemon is shutting down (``STOPPING=1``)."""
    return notify("STOPPING=1" + (f"\nSTATUS={status_text}" if status_text else ""))


def status(text: str) -> bool:
    """Set the one-line status shown by ``systemctl status``."""
    return notify(f"STATUS={text}")


def watchdog() -> bool:
    """Ping the watchdog (``WATCHDOG=1``)."""
    return notify("WATCHDOG=1")


def watchdog_interval_s(environ: Mapping[str, str] | None = None) -> float | None:
    """Return the watchdog timeout systemd set for this process, in seconds, or None.

    None when ``WATCHDOG_USEC`` is unset or invalid, or when ``WATCHDOG_PID`` names
    another process (the variables were inherited from a parent).
    """
    env = os.environ if environ is None else environ
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if usec <= 0:
        return None
    pid = env.get("WATCHDOG_PID", "")
    if pid:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            return None
    return usec / 1_000_000


@dataclass(frozen=True, slots=True)
class WatchdogSettings:
    """The watchdog timeout systemd set, in seconds; None when there is no watchdog."""

    interval_s: float | None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> WatchdogSettings:
        """Read ``$WATCHDOG_USEC`` (see ``watchdog_interval_s``)."""
        return cls(watchdog_interval_s(environ))


class Watchdog:
    """Ping the systemd watchdog while ``health()`` says the daemon is useful.

    ``health`` is a plain function or a coroutine function (which may do I/O, such as a
    ``SELECT 1`` on the pool). An exception, a false answer, or an answer slower than a
    quarter of the interval counts as unhealthy: no ping that round.
    """

    def __init__(
        self,
        cfg: WatchdogSettings,
        clock: Clock,
        health: Callable[[], bool | Awaitable[bool]],
    ) -> None:
        self.cfg = cfg
        self.clock = clock
        self.health = health
        self.interval_s = cfg.interval_s
        self.healthy = True
        self.pings = 0
        self.last_problem: str | None = None

    async def check(self) -> bool:
        """Ask ``health``, within a quarter of the interval."""
        timeout_s = self.interval_s / 4 if self.interval_s else None
        self.last_problem = "health check said no"
        try:
            with anyio.move_on_after(timeout_s):
                answer = self.health()
                if inspect.isawaitable(answer):
                    answer = await answer
                return bool(answer)
            self.last_problem = f"health check slower than {timeout_s} s"
        except Exception as exc:
            self.last_problem = f"health check failed: {type(exc).__name__}: {exc}"
            log.debug("watchdog.health_check_failed", exc_info=True)
        return False

    async def run_once(self) -> bool:
        """Ping if healthy; return whether a ping was sent. Safe to repeat; tests call this."""
        healthy = await self.check()
        if healthy != self.healthy:
            self.healthy = healthy
            if healthy:
                log.info("watchdog.healthy")
            else:
                log.warning(
                    "watchdog.unhealthy",
                    extra={"interval_s": self.interval_s, "problem": self.last_problem},
                )
        if not healthy:
            return False
        sent = watchdog()
        self.pings += sent
        return sent

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Ping about every third of the interval until cancelled; return at once when
        there is no watchdog."""
        if self.interval_s is None:
            task_status.started()
            return
        await run_loop(
            "watchdog",
            self.run_once,
            pause(self.interval_s / 3, self.clock),
            self.clock,
            task_status=task_status,
        )
