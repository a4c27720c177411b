"""The statements of the bulk actions: retry, cancel or resolve every job of a filter.

Each runs one function of migration 0031 (``sql/queries/bulk.sql``), which acts on
the jobs in one transaction and answers one summary row. ``jobsd.ops.bulk`` decides
(what a filter may hold, who may act on which org); this module only runs the
statements. ``scope`` is the caller's org (None: an operator, every org): the
functions limit the call to it, and it is set for row-level security as well.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from psycopg.types.json import Jsonb

from jobsd.store.api import run_for_org, run_for_org_sync
from jobsd.store.db import AsyncConn, SyncConn, db_errors
from jobsd.store.named import Row

__all__ = ["BulkAnswer", "BulkArgs", "run_bulk", "run_bulk_sync"]

Statement = Literal["bulk_retry", "bulk_cancel", "bulk_resolve"]


@dataclass(frozen=True, slots=True)
class BulkAnswer:
    """What a bulk function said (see ``sql/queries/bulk.sql``)."""

    bulk_id: int | None
    matched: int
    done: int
    requested: int
    refused: dict[str, int]
    remaining: int
    queue_found: bool


@dataclass(frozen=True, slots=True)
class BulkArgs:
    """One bulk call: who (``actor``, ``scope``), which jobs (``filter``: status,
    type, queue, org_id, since, until, as JSON values), how many (``limit``), and the
    action's own parameters (``extra``: force; reason; status, reason, error)."""

    actor: str
    scope: str | None
    filter: dict[str, Any]
    limit: int
    dry_run: bool
    extra: dict[str, Any]

    def params(self) -> dict[str, Any]:
        """Return the statement's parameters."""
        return {
            "actor": self.actor,
            "scope": self.scope,
            "filter": Jsonb(self.filter),
            "limit": self.limit,
            "dry_run": self.dry_run,
            **self.extra,
        }


def _answer(rows: list[Row]) -> BulkAnswer:
    row = rows[0]
    return BulkAnswer(
        bulk_id=row["bulk_id"],
        matched=int(row["matched"]),
        done=int(row["done"]),
        requested=int(row["requested"]),
        refused={str(k): int(v) for k, v in (row["refused"] or {}).items()},
        remaining=int(row["remaining"]),
        queue_found=bool(row["queue_found"]),
    )


async def run_bulk(conn: AsyncConn, statement: Statement, args: BulkArgs) -> BulkAnswer:
    """Run one bulk action (or its dry run) in one transaction; return its summary.

    Raises DatabaseError for what the function refuses (a bad limit or time range).
    """
    with db_errors(f"{statement.replace('_', ' ')} of jobs"):
        rows = await run_for_org(conn, args.scope, statement, args.params())
    return _answer(rows)


def run_bulk_sync(conn: SyncConn, statement: Statement, args: BulkArgs) -> BulkAnswer:
    """Run one bulk action; see ``run_bulk`` (sync)."""
    with db_errors(f"{statement.replace('_', ' ')} of jobs"):
        rows = run_for_org_sync(conn, args.scope, statement, args.params())
    return _answer(rows)
