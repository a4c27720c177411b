"""A database to demonstrate or measure on: the one given, else a throwaway embedded one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["dev_database"]


@contextmanager
def dev_database(url: str | None) -> Iterator[tuple[str, bool]]:
    """Yield ``(url, embedded)``: ``url`` itself, or a fresh embedded cluster's (trusted
    without TLS: local and throwaway), removed on exit. Not migrated."""
    if url:
        yield url, False
        return
    from jobsd.dev.embedded import EmbeddedPostgres
    from jobsd.store.connect import trust_local_cluster

    cluster = EmbeddedPostgres()
    cluster.start()
    try:
        trust_local_cluster(cluster.url())
        yield cluster.url(), True
    finally:
        cluster.cleanup()
