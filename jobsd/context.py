"""What a handler sees of its job, and how it reports progress."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Generator
from typing import Any

from jobsd.errors import InvalidPayload

__all__ = ["JobContext"]


class _Done:
    """An awaitable that is already complete: ``progress`` works with or without await."""

    __slots__ = ()

    def __await__(self) -> Generator[None, None, None]:
        return
        yield


_DONE = _Done()
_RESERVED = frozenset({"updated_at"})


class JobContext:
    """The one argument of a handler.

    ``checkpoint`` is the progress an earlier attempt saved (empty on a first run): a
    resumable handler reads where it stopped from it.
    """

    def __init__(
        self,
        *,
        id: uuid.UUID,
        type: str,
        org_id: str,
        queue: str,
        payload: dict[str, Any],
        attempt: int,
        checkpoint: dict[str, Any] | None,
    ) -> None:
        self.id = id
        self.type = type
        self.org_id = org_id
        self.queue = queue
        self.payload = payload
        self.attempt = attempt
        self.checkpoint: dict[str, Any] = dict(checkpoint or {})
        self._lock = threading.Lock()
        self._pending: dict[str, Any] = {}

    def progress(self, done: int | None = None, total: int | None = None, **fields: Any) -> _Done:
        """Record progress; jobsd writes it in the background, at most once a second.

        Call it per batch or step, not per row. Async handlers may ``await`` it; sync
        handlers call it plainly. The fields are merged into the job's ``progress``
        and become the ``checkpoint`` of a later attempt.
        """
        if done is not None:
            fields["done"] = done
        if total is not None:
            fields["total"] = total
        clash = _RESERVED.intersection(fields)
        if clash:
            raise ValueError(f"progress field {sorted(clash)[0]!r} is reserved for jobsd")
        try:
            json.dumps(fields, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidPayload(f"progress is not JSON-serializable: {exc}") from exc
        with self._lock:
            self._pending.update(fields)
            self.checkpoint.update(fields)
        return _DONE

    def take_pending(self) -> dict[str, Any] | None:
        """Return and clear the progress not yet written (the daemon calls this)."""
        with self._lock:
            if not self._pending:
                return None
            pending, self._pending = self._pending, {}
            return pending

    def restore_pending(self, fields: dict[str, Any]) -> None:
        """Put back progress whose write failed, under anything recorded since."""
        with self._lock:
            self._pending = {**fields, **self._pending}

    @property
    def has_pending(self) -> bool:
        """Say whether progress is waiting to be written."""
        return bool(self._pending)
