"""A mailbox: items handed over without blocking, taken in order by one service.

The completer receives outcomes in one, the fail hooks receive failed jobs in another.
An item stays in the mailbox until its taker drops it, so a write that failed can be
tried again and ``len()`` counts what is not done yet.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import anyio

__all__ = ["Mailbox"]

T = TypeVar("T")


class Mailbox(Generic[T]):
    """A FIFO with a wake-up; ``put`` never blocks. Only the event loop thread uses it."""

    def __init__(self) -> None:
        self._items: list[T] = []
        self._arrived = anyio.Event()

    def put(self, item: T) -> None:
        """Add an item and wake the taker."""
        self._items.append(item)
        self._arrived.set()

    def __len__(self) -> int:
        return len(self._items)

    def peek(self, limit: int) -> list[T]:
        """Return up to ``limit`` items, oldest first, without taking them."""
        return self._items[:limit]

    def drop(self, count: int) -> None:
        """Remove the ``count`` oldest items (those a ``peek`` returned and that are done)."""
        del self._items[:count]

    def take(self) -> T:
        """Remove and return the oldest item; IndexError when empty."""
        return self._items.pop(0)

    async def wait(self) -> None:
        """Return once an item waits: at once if one does."""
        while not self._items:
            if self._arrived.is_set():
                self._arrived = anyio.Event()
            await self._arrived.wait()
