"""Wake the claimer: a NOTIFY, a reconnect, a freed slot, or nothing until a timeout."""

from __future__ import annotations

import anyio

__all__ = ["Waker"]


class Waker:
    """A resettable signal that remembers why it was set.

    Wake-ups that arrive while nobody waits are not lost: the next ``wait`` returns at
    once with the first cause recorded.
    """

    def __init__(self) -> None:
        self._event = anyio.Event()
        self._cause: str | None = None

    def wake(self, cause: str) -> None:
        """Wake the waiter (or the next one) with ``cause``."""
        if self._cause is None:
            self._cause = cause
        self._event.set()

    async def wait(self, timeout_s: float) -> str:
        """Wait for a wake-up; return its cause, or ``"poll"`` after ``timeout_s``."""
        with anyio.move_on_after(max(timeout_s, 0.0)):
            await self._event.wait()
        cause = self._cause or "poll"
        self._cause = None
        self._event = anyio.Event()
        return cause
