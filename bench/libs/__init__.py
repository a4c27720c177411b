"""One adapter per queue library, so bench/side_by_side.py runs the same cases on each.

An adapter module (``libs.<name>``) provides:

- ``SETTINGS``: ``{"default": Setting, "best": Setting}``, the worker settings of the two
  drain cases, each with the text the report prints;
- ``install(url)``: the library's documented schema install, in an empty database
  (jobsd's cases get a clone of the migrated template instead, so it does nothing);
- ``producer(url)``: an async context manager yielding an object with ``enqueue_one(i)``
  and ``enqueue_many(numbers)``, the library's one-job and bulk calls (payload: one
  integer), on one connection (one producer);
- ``OPEN_JOBS_SQL``: a cheap query that is true while a job is not finished;
- ``serve(url, setting, on_start)``: run a worker in this process (the child started by
  bench/worker_process.py) until SIGTERM, calling ``on_start(i)`` first thing in each
  job's handler.

Importing an adapter imports its library, so a run without ``--peers`` needs none of them.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

__all__ = ["LIBRARIES", "PEER_ADAPTERS", "Setting", "adapter"]

LIBRARIES = ("jobsd", "pgqueuer", "pgqueuer_psycopg", "procrastinate")
# a peer named on the command line and the adapters it stands for: pgqueuer runs on
# both of its drivers, so that each ratio reads against the same driver as jobsd too
PEER_ADAPTERS = {"pgqueuer": ("pgqueuer", "pgqueuer_psycopg"), "procrastinate": ("procrastinate",)}


@dataclass(frozen=True, slots=True)
class Setting:
    """A worker setting: what the report says, and the keyword arguments it stands for."""

    label: str
    options: dict[str, Any] = field(default_factory=dict)


def adapter(name: str) -> ModuleType:
    """Import and return the adapter of library ``name``."""
    if name not in LIBRARIES:
        raise ValueError(f"unknown library {name!r}; known: {', '.join(LIBRARIES)}")
    return importlib.import_module(f"libs.{name}_lib")
