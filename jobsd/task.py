"""The handle ``@jobsd.handler`` returns: enqueue a job type through its handler.

``Task[P]`` is generic in the payload: the handler's pydantic model, or
``dict[str, Any]`` for a handler that reads ``ctx.payload`` itself. ``enqueue`` and
``enqueue_sync`` take the payload, ``org_id`` (else ``JOBSD_DEFAULT_ORG``), ``conn``
(the caller's transaction), ``client`` and the options of every enqueue
(``EnqueueOptions``), and return what ``jobsd.enqueue`` returns. Without ``client``
they use the default clients of ``jobsd.enqueue`` and ``jobsd.enqueue_sync``.
"""

from __future__ import annotations

import builtins
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar, Unpack

from pydantic import BaseModel

from jobsd.jobspec import EnqueueOptions
from jobsd.payloads import encode_payload

if TYPE_CHECKING:
    from jobsd.client import Client, SyncClient
    from jobsd.context import JobContext
    from jobsd.models import Job
    from jobsd.store.db import AsyncConn, SyncConn

__all__ = ["RUN_ATTRIBUTE", "Task"]

P = TypeVar("P")

RUN_ATTRIBUTE = "_run"
"""the attribute of a Task that a handler process calls (``HandlerSpec.import_ref``)"""


class Task(Generic[P]):
    """A job type and its handler: ``await import_csv.enqueue(ImportCsv(...))``.

    Calling it calls the decorated function, unchanged (tests may). ``model`` is the
    handler's pydantic model, None when it takes only the context.
    """

    type: str
    func: Callable[..., Any]
    model: builtins.type[BaseModel] | None

    def __init__(
        self,
        type: str,
        func: Callable[..., Any],
        run: Callable[[JobContext], Any],
        model: builtins.type[BaseModel] | None = None,
    ) -> None:
        functools.update_wrapper(self, func)  # name, doc, module of the function
        self.type = type
        self.func = func
        self.model = model
        # what the daemon calls with the context: the payload decoded, then ``func``
        self._run = run

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def __repr__(self) -> str:
        model = f" model={self.model.__name__}" if self.model is not None else ""
        return f"<jobsd.Task {self.type!r}{model}>"

    def payload(self, payload: P | dict[str, Any] | None = None) -> dict[str, Any] | None:
        """Return the payload as it is stored: for a typed handler, validated and dumped
        through its model (PayloadMismatch naming the fields); else as given."""
        if self.model is None:
            return payload  # type: ignore[return-value]  # P is dict[str, Any] here
        return encode_payload(self.type, self.model, payload)

    async def enqueue(
        self,
        payload: P | dict[str, Any] | None = None,
        *,
        org_id: str | None = None,
        conn: AsyncConn | None = None,
        client: Client | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> Job:
        """Enqueue a job of this type; see ``jobsd.enqueue`` (``client``: instead of
        the default one; ``conn``: in the caller's transaction)."""
        data = self.payload(payload)
        if client is None:
            import jobsd  # the package imports this module: at call time, not before

            return await jobsd.enqueue(self.type, data, org_id=org_id, conn=conn, **options)
        return await client.enqueue(self.type, data, org_id=org_id, conn=conn, **options)

    def enqueue_sync(
        self,
        payload: P | dict[str, Any] | None = None,
        *,
        org_id: str | None = None,
        conn: SyncConn | None = None,
        client: SyncClient | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> Job:
        """Enqueue a job of this type from synchronous code; see ``jobsd.enqueue_sync``."""
        data = self.payload(payload)
        if client is None:
            import jobsd

            return jobsd.enqueue_sync(self.type, data, org_id=org_id, conn=conn, **options)
        return client.enqueue(self.type, data, org_id=org_id, conn=conn, **options)
