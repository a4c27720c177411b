"""``jobsd jobs list``, ``jobsd top --once`` and ``jobsd export`` with
JOBSD_READ_DATABASE_URL: read on the streaming replica (shown by pausing its replay:
a job made since is missing), the delay on stderr or on screen; the primary when the
replica does not answer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from support.jobs import make_job
from support.replication import ReplicatedPair
from support.waiting import poll

from .conftest import make_env, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

_NOBODY = "postgresql://postgres@127.0.0.1:1/none?connect_timeout=1"
_LINE = "read from a replica, "


@pytest.fixture(scope="module")
def pair() -> Iterator[ReplicatedPair]:
    """A primary and its streaming standby (asynchronous), migrated."""
    made = ReplicatedPair(synchronous=False, dbname="jobsd_replica_cli")
    try:
        yield made
    finally:
        made.cleanup()


def _scalar(url: str, query: str) -> Any:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    return row[0] if row else None


@pytest.fixture
def paused(pair: ReplicatedPair) -> Iterator[tuple[str, str, str, str]]:
    """Job ``seen`` replayed by the standby, then replay paused and job ``unseen`` made on
    the primary; yield the primary's URL, the standby's and both ids."""
    assert pair.standby is not None
    primary, standby = pair.primary.url(pair.dbname), pair.standby.url(pair.dbname)
    with psycopg.connect(primary, autocommit=True) as conn:
        seen = str(make_job(conn, org_id="acme", type="seen"))
    target = _scalar(primary, "SELECT pg_current_wal_lsn()::text")
    poll(
        lambda: _scalar(standby, f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn"),
        what="the standby replaying the first job",
    )
    _scalar(standby, "SELECT pg_wal_replay_pause()")
    try:
        with psycopg.connect(primary, autocommit=True) as conn:
            unseen = str(make_job(conn, org_id="acme", type="unseen"))
        yield primary, standby, seen, unseen
    finally:
        _scalar(standby, "SELECT pg_wal_replay_resume()")


def test_jobs_list_reads_the_replica_and_says_so(paused: tuple[str, str, str, str]) -> None:
    primary, standby, seen, unseen = paused
    env = make_env(primary, JOBSD_READ_DATABASE_URL=standby)
    done = run_cli("jobs", "list", "--json", env=env)
    assert done.returncode == 0, done.stderr
    ids = [json.loads(line)["id"] for line in done.stdout.splitlines()]
    assert seen in ids and unseen not in ids  # the replica's older view
    assert _LINE in done.stderr and "s behind" in done.stderr

    table = run_cli("jobs", "list", env=env)
    assert table.returncode == 0 and seen in table.stdout and _LINE in table.stderr

    # no replica set, or one that does not answer: the primary, and no line
    for env in (make_env(primary), make_env(primary, JOBSD_READ_DATABASE_URL=_NOBODY)):
        done = run_cli("jobs", "list", "--json", env=env)
        assert done.returncode == 0, done.stderr
        ids = [json.loads(line)["id"] for line in done.stdout.splitlines()]
        assert seen in ids and unseen in ids
        assert _LINE not in done.stderr


def test_top_once_and_export_read_the_replica(paused: tuple[str, str, str, str]) -> None:
    primary, standby, seen, unseen = paused
    env = make_env(primary, JOBSD_READ_DATABASE_URL=standby)
    top = run_cli("top", "--once", env={**env, "COLUMNS": "120"})
    assert top.returncode == 0, top.stderr
    assert _LINE in top.stdout and "s behind" in top.stdout

    export = run_cli("export", env=env)
    assert export.returncode == 0, export.stderr
    ids = [job["id"] for job in json.loads(export.stdout)["jobs"]]
    assert seen in ids and unseen not in ids
    assert _LINE in export.stderr

    # --database-url names the database: no replica of another one
    export = run_cli("export", "--database-url", primary, env=env)
    ids = [job["id"] for job in json.loads(export.stdout)["jobs"]]
    assert unseen in ids and _LINE not in export.stderr

    top = run_cli("top", "--once", env=make_env(primary, JOBSD_READ_DATABASE_URL=_NOBODY))
    assert top.returncode == 0, top.stderr
    assert _LINE not in top.stdout and "queues" in top.stdout
