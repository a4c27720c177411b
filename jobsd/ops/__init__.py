"""The one door to the operations on jobs and their administration.

One module per operation: ``get``, ``listing``, ``wait``, ``cancel``, ``retry``,
``resolve``, ``bulk`` (the last three on every job of a filter), ``queues`` (pause,
resume), ``tokens``, ``overview`` (what the dashboard and ``jobsd top`` show). Each
takes a ``Caller`` (for which org, operator or not, who to name in the history) and
returns a typed result or raises a typed refusal (``jobsd.errors``).
``Client``/``SyncClient``, every CLI command, every HTTP route and every dashboard
action call them: none composes store calls or decides authority itself. Who may do
what is ``authority.may``, and nothing else. The connection types are here too: a
front end names them without reaching into ``jobsd.store``.
"""

from __future__ import annotations

from jobsd.ops.authority import Act, may, require
from jobsd.ops.caller import Caller
from jobsd.store.db import AsyncConn, SyncConn

__all__ = ["Act", "AsyncConn", "Caller", "SyncConn", "may", "require"]
