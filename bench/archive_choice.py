"""Row movement or a batched move: what it costs to get finished jobs out of the hot table.

    uv run python bench/archive_choice.py [--database-url URL] [--jobs 200000]
                                          [--archived 1000000] [--workers 4] [--repeat 2]

Two designs keep the table of open jobs small:

* **A, row movement**: one ``jobs`` table ``PARTITION BY RANGE (finished_at)``. A DEFAULT
  partition holds the open jobs (finished_at NULL), monthly partitions the finished
  ones, so the finishing ``UPDATE ... SET finished_at = now()`` moves the row (a DELETE
  and an INSERT inside Postgres). A primary key cannot hold a nullable column, so the
  key is ``UNIQUE NULLS NOT DISTINCT (id, finished_at)``: the same index, and id is
  not unique by itself. The history table is partitioned by its own time and never
  moves.
* **B, batched move**: a plain hot ``jobs`` table; finishing is a plain UPDATE; a mover
  on its own connection, once a second, moves the jobs finished more than 2 s ago
  with their history in batches of 5,000, one statement per batch (``FOR UPDATE SKIP
  LOCKED``, ``DELETE ... RETURNING``, ``INSERT``), into archives partitioned by month
  of the job's finished_at.

Both get the same job row (uuid id, org_id, type, queue, priority, status, ~100 byte
jsonb payload, created_at/started_at/finished_at, attempts, lease_id, worker_id,
error), the same indexes (key, a partial claim index ``(queue, priority, created_at,
id) WHERE status = 'queued'``, ``(org_id, created_at, id)``, ``(finished_at)``), and
a history table (job_id, id bigint, to_status, at) with 3 rows per job: queued
(seeded), running (written by the claim), succeeded (written by the finish). Thirteen
monthly partitions (11 months back to next month) exist in A's jobs and history and
in B's archives, and ``--archived`` jobs that finished before (spread over the 11
months before this one and this month so far) fill the partitions of finished jobs,
so that a GET by id probes full partitions, not empty ones.

For each design, ``--jobs`` queued jobs are seeded, then ``--workers`` connections run
the worker cycle until the queue is empty: claim 10 queued jobs (``FOR UPDATE SKIP
LOCKED``, set running), finish them (one UPDATE per batch), each an autocommit
statement. Measured:

1. drain jobs/s of the worker cycle (B: with the mover running), and the time until
   the hot table holds no finished job (B: 2 s age + 1 s period after the last finish);
2. WAL bytes per job: the scratch database's own records, read with pg_walinspect
   (those touching its blocks, and the commits of their transactions; a temporary
   replication slot keeps the WAL until then), so that other work on the server does
   not count. Every statement returns its transaction id, so the WAL is split by what
   wrote it: claims, finishes, the mover, a final VACUUM of the run's tables, other
   (pruning, failed claims); and by table (history or jobs); with the share of
   full-page images. A CHECKPOINT precedes every run. Also the cluster-wide
   ``pg_current_wal_lsn()`` difference, checkpoints during the run, the CPU per job
   of the workers' and the mover's backends (``/proc``, when the server runs on this
   machine), the mean time of each kind of statement; the hot table's size and dead
   tuples at the end (before that VACUUM);
3. errors, counted by message (the claim retries after one), for example "tuple to
   be locked was already moved to another partition due to a concurrent update";
4. GET by id of 2,000 of the drained jobs, p50/p99 on one connection (prepared
   after 5 calls, as psycopg does), after the VACUUM: A reads the parent table (every
   partition is probed), B reads the hot table then the archive (every archive
   partition); also with finished_at known (one partition).

The designs run interleaved (A, B, A, B...) ``--repeat`` times each in one scratch
database ``archive_choice_<random>`` made on the server of ``--database-url`` (the
role must be a superuser: CREATE DATABASE, CHECKPOINT, pg_walinspect, replication
slots) and dropped at the end. Before each run it waits (up to 2 minutes) for the
machine to be less than 25% busy. Prints a markdown table of the medians with their
range on stdout; progress on stderr. Not a test: nothing in tests/ runs it.
"""

from __future__ import annotations

import argparse
import itertools
import os
import secrets
import statistics
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
CLAIM_BATCH = 10
MOVE_BATCH = 5000
MOVE_PERIOD_S = 1.0
MOVE_AGE = "2 seconds"
MONTHS_BACK = 11  # partitions from 11 months back to next month: 13
LOOKUPS = 2000
LOOKUP_WARMUP = 50
WAL_KINDS = ("claim", "finish", "move", "other", "vacuum")
_TICK = os.sysconf("SC_CLK_TCK")

JOB_COLUMNS = """
  id          uuid        NOT NULL,
  org_id      text        NOT NULL,
  type        text        NOT NULL,
  queue       text        NOT NULL,
  priority    smallint    NOT NULL DEFAULT 0,
  status      text        NOT NULL,
  payload     jsonb       NOT NULL,
  created_at  timestamptz NOT NULL,
  started_at  timestamptz,
  finished_at timestamptz,
  attempts    int         NOT NULL DEFAULT 0,
  lease_id    uuid,
  worker_id   text,
  error       text
"""

JOB_INDEXES = """
CREATE INDEX {t}_claim_idx ON {t} (queue, priority, created_at, id) WHERE status = 'queued';
CREATE INDEX {t}_org_idx ON {t} (org_id, created_at, id);
CREATE INDEX {t}_finished_idx ON {t} (finished_at);
"""

# A: one table, the row moves from jobs_open to a month when finished_at is set
SCHEMA_A = f"""
CREATE SEQUENCE history_id_seq;
CREATE TABLE jobs ({JOB_COLUMNS}) PARTITION BY RANGE (finished_at);
ALTER TABLE jobs ADD CONSTRAINT jobs_key UNIQUE NULLS NOT DISTINCT (id, finished_at);
{JOB_INDEXES.format(t="jobs")}
CREATE TABLE jobs_open PARTITION OF jobs DEFAULT;
CREATE TABLE history (
  job_id    uuid        NOT NULL,
  id        bigint      NOT NULL DEFAULT nextval('history_id_seq'),
  to_status text        NOT NULL,
  at        timestamptz NOT NULL,
  PRIMARY KEY (id, at)
) PARTITION BY RANGE (at);
CREATE INDEX history_job_idx ON history (job_id);
"""
MONTHS_A = ("jobs", "history")

# B: a plain hot table, archives partitioned by the month of the job's finished_at
SCHEMA_B = f"""
CREATE SEQUENCE history_id_seq;
CREATE TABLE jobs ({JOB_COLUMNS}, PRIMARY KEY (id));
{JOB_INDEXES.format(t="jobs")}
CREATE TABLE history (
  job_id    uuid        NOT NULL,
  id        bigint      PRIMARY KEY DEFAULT nextval('history_id_seq'),
  to_status text        NOT NULL,
  at        timestamptz NOT NULL
);
CREATE INDEX history_job_idx ON history (job_id);
CREATE TABLE jobs_archive ({JOB_COLUMNS}) PARTITION BY RANGE (finished_at);
ALTER TABLE jobs_archive ALTER COLUMN finished_at SET NOT NULL;
ALTER TABLE jobs_archive ADD PRIMARY KEY (id, finished_at);
CREATE INDEX jobs_archive_org_idx ON jobs_archive (org_id, created_at, id);
CREATE INDEX jobs_archive_finished_idx ON jobs_archive (finished_at);
CREATE TABLE history_archive (
  job_id          uuid        NOT NULL,
  id              bigint      NOT NULL,
  to_status       text        NOT NULL,
  at              timestamptz NOT NULL,
  job_finished_at timestamptz NOT NULL,
  PRIMARY KEY (id, job_finished_at)
) PARTITION BY RANGE (job_finished_at);
CREATE INDEX history_archive_job_idx ON history_archive (job_id);
"""
MONTHS_B = ("jobs_archive", "history_archive")

# Ids are time-ordered like UUIDv7: 48 bits of Unix milliseconds of t.ts, version 7,
# variant 10, the rest from the md5 t.h. Payloads are ~100 bytes of jsonb.
UUID7_SQL = """(lpad(to_hex((extract(epoch FROM t.ts) * 1000)::bigint), 12, '0')
        || '7' || substr(t.h, 1, 3) || '8' || substr(t.h, 4, 15))::uuid"""
PAYLOAD_SQL = """jsonb_build_object('n', i, 'url', 'https://example.com/items/' || i,
                          'note', repeat('x', 40))"""

# The jobs to drain: queued, created over the last 10 minutes, with their first history row.
SEED_SQL = f"""
INSERT INTO jobs (id, org_id, type, queue, status, payload, created_at)
SELECT {UUID7_SQL},
       'org' || (i %% 50), 'type' || (i %% 5), 'default', 'queued', {PAYLOAD_SQL}, t.ts
FROM generate_series(1, %(n)s) AS i,
LATERAL (SELECT now() - interval '10 minutes' + interval '10 minutes' * i / %(n)s AS ts,
                md5(i::text || random()::text) AS h) AS t
"""
SEED_HISTORY_SQL = (
    "INSERT INTO history (job_id, to_status, at) SELECT id, 'queued', created_at FROM jobs"
    " WHERE status = 'queued'"
)

# The past: jobs that finished over the 11 months before this one and this month so far
# (up to an hour ago), so that a GET by id probes full partitions, not empty ones. They
# go where finished jobs live: A's monthly partitions, B's archive. (Their history is
# left out: no measured statement reads it.)
ARCHIVED_SQL = f"""
INSERT INTO {{table}} (id, org_id, type, queue, status, payload, created_at, started_at,
                       finished_at, attempts, lease_id, worker_id)
SELECT {UUID7_SQL},
       'org' || (i %% 50), 'type' || (i %% 5), 'default', 'succeeded', {PAYLOAD_SQL},
       t.ts, t.ts + interval '1 second', t.ts + interval '2 seconds', 1,
       gen_random_uuid(), 'past'
FROM generate_series(1, %(n)s) AS i,
LATERAL (SELECT %(lo)s::timestamptz
                + (now() - interval '1 hour' - %(lo)s::timestamptz) * i / %(n)s AS ts,
                md5(i::text || random()::text) AS h) AS t
"""


# The worker cycle. In A the claim and the finish say finished_at IS NULL so that they
# are planned against the open partition only (a caller would).
CLAIM_SQL = """
WITH c AS (
  SELECT id FROM jobs
  WHERE queue = 'default' AND status = 'queued' {open}
  ORDER BY priority, created_at, id
  LIMIT {batch}
  FOR UPDATE SKIP LOCKED
), u AS (
  UPDATE jobs AS j
  SET status = 'running', started_at = now(), attempts = j.attempts + 1,
      lease_id = gen_random_uuid(), worker_id = %(worker)s
  FROM c WHERE j.id = c.id {open_j}
  RETURNING j.id
), h AS (
  INSERT INTO history (job_id, to_status, at) SELECT id, 'running', now() FROM u
)
SELECT id, pg_current_xact_id_if_assigned()::xid::text::bigint FROM u
"""

FINISH_SQL = """
WITH u AS (
  UPDATE jobs SET status = 'succeeded', finished_at = now()
  WHERE id = ANY(%(ids)s) {open}
  RETURNING id
), h AS (
  INSERT INTO history (job_id, to_status, at) SELECT id, 'succeeded', now() FROM u
)
SELECT count(*), pg_current_xact_id_if_assigned()::xid::text::bigint FROM u
"""

# B's mover: one statement per batch, jobs and their history together.
MOVE_SQL = f"""
WITH picked AS (
  SELECT id FROM jobs
  WHERE finished_at < now() - interval '{MOVE_AGE}'
  ORDER BY finished_at
  LIMIT {MOVE_BATCH}
  FOR UPDATE SKIP LOCKED
), moved AS (
  DELETE FROM jobs AS j USING picked AS p WHERE j.id = p.id RETURNING j.*
), ins AS (
  INSERT INTO jobs_archive SELECT * FROM moved
), hmoved AS (
  DELETE FROM history AS h USING moved AS m WHERE h.job_id = m.id
  RETURNING h.job_id, h.id, h.to_status, h.at, m.finished_at
), hins AS (
  INSERT INTO history_archive SELECT * FROM hmoved
)
SELECT count(*), pg_current_xact_id_if_assigned()::xid::text::bigint FROM moved
"""

GET_SQL_A = "SELECT * FROM jobs WHERE id = %(id)s"
GET_KNOWN_SQL_A = "SELECT * FROM jobs WHERE id = %(id)s AND finished_at = %(f)s"
GET_SQL_B = """
(SELECT * FROM jobs WHERE id = %(id)s)
UNION ALL
(SELECT * FROM jobs_archive WHERE id = %(id)s)
LIMIT 1
"""
GET_KNOWN_SQL_B = """
(SELECT * FROM jobs WHERE id = %(id)s)
UNION ALL
(SELECT * FROM jobs_archive WHERE id = %(id)s AND finished_at = %(f)s)
LIMIT 1
"""


@dataclass(frozen=True, slots=True)
class Design:
    """One of the two designs: its schema and statements."""

    key: str
    name: str
    schema_sql: str
    month_tables: tuple[str, ...]
    hot_jobs: str  # the relation holding the open jobs
    hot_history: str | None  # B's hot history table (A's history never moves)
    finished_table: str  # where finished jobs end up
    finished_history: str  # where their history ends up
    claim_sql: str
    finish_sql: str
    get_sql: str
    get_known_sql: str
    mover: bool


DESIGNS = {
    "A": Design(
        key="A",
        name="A row movement",
        schema_sql=SCHEMA_A,
        month_tables=MONTHS_A,
        hot_jobs="jobs_open",
        hot_history=None,
        finished_table="jobs",
        finished_history="history",
        claim_sql=CLAIM_SQL.format(
            open="AND finished_at IS NULL",
            open_j="AND j.finished_at IS NULL",
            batch=CLAIM_BATCH,
        ),
        finish_sql=FINISH_SQL.format(open="AND finished_at IS NULL"),
        get_sql=GET_SQL_A,
        get_known_sql=GET_KNOWN_SQL_A,
        mover=False,
    ),
    "B": Design(
        key="B",
        name="B batched move",
        schema_sql=SCHEMA_B,
        month_tables=MONTHS_B,
        hot_jobs="jobs",
        hot_history="history",
        finished_table="jobs_archive",
        finished_history="history_archive",
        claim_sql=CLAIM_SQL.format(open="", open_j="", batch=CLAIM_BATCH),
        finish_sql=FINISH_SQL.format(open=""),
        get_sql=GET_SQL_B,
        get_known_sql=GET_KNOWN_SQL_B,
        mover=True,
    ),
}


@dataclass(slots=True)
class RunResult:
    """What one run of one design measured."""

    design: str
    jobs: int
    mover: bool
    drain_s: float = 0.0
    empty_s: float = 0.0
    wal_drain: int = 0  # cluster-wide bytes, start to hot table empty of finished jobs
    wal_vacuum: int = 0  # cluster-wide bytes, the final VACUUM
    # this database's WAL records (pg_walinspect) in the same two stretches
    # this database's WAL (pg_walinspect): (kind of statement, table) -> (bytes, FPI bytes)
    wal: dict[tuple[str, str], tuple[int, int]] | None = None
    stmt_s: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    stmt_n: Counter[str] = field(default_factory=Counter)
    checkpoints: int = 0
    backend_cpu_s: float | None = None  # the workers' and the mover's backends
    mover_cpu_s: float | None = None  # the mover's backend alone
    other_cpu_s: float | None = None  # the machine's busy time less the bench and them
    busy_before: float = 0.0
    hot_heap_bytes: int = 0
    hot_total_bytes: int = 0
    hot_dead: int = 0
    hot_live: int = 0
    hot_autovacuums: int = 0
    hist_hot_total_bytes: int | None = None
    hist_hot_dead: int | None = None
    hot_total_after_vacuum: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    claims: int = 0
    empty_claims: int = 0
    moved: int = 0
    move_batches: int = 0
    move_max_ms: float = 0.0
    get_p50_us: float = 0.0
    get_p99_us: float = 0.0
    get_known_p50_us: float = 0.0
    get_known_p99_us: float = 0.0
    get_probes: int = 0
    get_known_probes: int = 0

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.drain_s

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- server-side counters


def proc_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of process ``pid``, or None when /proc cannot tell."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # fields[0] is stat field 3; utime and stime are fields 14 and 15
    return (int(fields[11]) + int(fields[12])) / _TICK


def backend_pid(conn: psycopg.Connection[Any]) -> int | None:
    """The pid of this connection's backend, if it is a process of this machine."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    try:
        with open(f"/proc/{row[0]}/comm") as fh:
            return int(row[0]) if fh.read().strip() == "postgres" else None
    except OSError:
        return None


def machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot (all but idle and iowait)."""
    with open("/proc/stat") as fh:
        values = [int(v) for v in fh.readline().split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / _TICK


def self_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def wait_for_quiet(limit_s: float = 120.0, busy_share: float = 0.25) -> float:
    """Wait until the machine is mostly idle for a second; return the last busy share."""
    cpus = os.cpu_count() or 1
    deadline = time.monotonic() + limit_s
    while True:
        b0 = machine_busy_s()
        time.sleep(1.0)
        share = (machine_busy_s() - b0) / cpus
        if share < busy_share or time.monotonic() > deadline:
            if share >= busy_share:
                log(f"  the machine is still {share:.0%} busy: measuring anyway")
            return share
        log(f"  the machine is {share:.0%} busy: waiting")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Counters read at one instant."""

    lsn: str
    checkpoints: int
    busy: float
    own_cpu: float


def snapshot(conn: psycopg.Connection[Any]) -> Snapshot:
    row = conn.execute(
        """
        SELECT pg_current_wal_lsn()::text,
               (SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter)
        """
    ).fetchone()
    assert row is not None
    return Snapshot(
        lsn=row[0], checkpoints=int(row[1]), busy=machine_busy_s(), own_cpu=self_cpu_s()
    )


def wal_between(conn: psycopg.Connection[Any], start: str, end: str) -> int:
    row = conn.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", (end, start)).fetchone()
    assert row is not None
    return int(row[0])


# The WAL records of one database: those that touch one of its blocks ("rel
# tablespace/database/relfilenode"), and the commit records of their transactions;
# summed by the kind of statement that wrote them (run_xids, filled from the xids the
# statements returned), "vacuum" from ``split`` on, "other" for the rest (page pruning
# and hint bits, which have no transaction, and the claims that failed), and by the
# table the first block belongs to (a history table or index, or a jobs one; commit
# records apart). Full-page images apart.
WAL_OF_DATABASE_SQL = """
WITH r AS (
  SELECT start_lsn, xid::text::bigint AS xid, resource_manager, record_length,
         fpi_length, coalesce(block_ref LIKE %(pattern)s, false) AS ours,
         substring(block_ref FROM 'rel [0-9]+/[0-9]+/([0-9]+)')::oid AS filenode
  FROM pg_get_wal_records_info(%(start)s::pg_lsn,
                               least(%(end)s::pg_lsn, pg_current_wal_flush_lsn()))
), x AS (
  SELECT DISTINCT xid FROM r WHERE ours AND xid <> 0
), g AS (
  SELECT CASE WHEN r.start_lsn >= %(split)s::pg_lsn THEN 'vacuum'
              ELSE coalesce(k.kind, 'other') END AS kind,
         r.filenode, sum(r.record_length) AS size, sum(r.fpi_length) AS fpi
  FROM r LEFT JOIN pg_temp.run_xids AS k ON k.xid = r.xid
  WHERE r.ours OR (r.resource_manager = 'Transaction' AND r.xid IN (SELECT xid FROM x))
  GROUP BY 1, 2
)
SELECT kind,
       CASE WHEN filenode IS NULL THEN 'commit'
            WHEN pg_filenode_relation(0, filenode)::text LIKE '%%history%%' THEN 'history'
            ELSE 'jobs' END,
       sum(size), sum(fpi)
FROM g
GROUP BY 1, 2
"""


def wal_of_database(
    conn: psycopg.Connection[Any], start: str, split: str, end: str, xids: dict[str, list[int]]
) -> dict[tuple[str, str], tuple[int, int]] | None:
    """This database's WAL and FPI bytes by kind of statement and table, or None."""
    try:
        conn.execute("CREATE TEMP TABLE run_xids (xid bigint PRIMARY KEY, kind text NOT NULL)")
        with conn.cursor() as cur, cur.copy("COPY pg_temp.run_xids (xid, kind) FROM STDIN") as cp:
            for kind, values in xids.items():
                for xid in values:
                    cp.write_row((xid, kind))
        conn.execute("ANALYZE pg_temp.run_xids")
        rows = conn.execute(
            WAL_OF_DATABASE_SQL,
            {"start": start, "split": split, "end": end, "pattern": f"%/{database_oid(conn)}/%"},
        ).fetchall()
    except psycopg.Error as exc:
        log(f"  (no per-database WAL: {exc.diag.message_primary})")
        return None
    finally:
        conn.execute("DROP TABLE IF EXISTS pg_temp.run_xids")
    return {(str(kind), str(table)): (int(size), int(fpi)) for kind, table, size, fpi in rows}


def database_oid(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()
    assert row is not None
    return int(row[0])


# ---------------------------------------------------------------- setup


def month_starts() -> list[datetime]:
    now = datetime.now(UTC)
    index = now.year * 12 + now.month - 1
    return [
        datetime(i // 12, i % 12 + 1, 1, tzinfo=UTC) for i in range(index - MONTHS_BACK, index + 3)
    ]


def create_schema(conn: psycopg.Connection[Any], schema: str, design: Design) -> None:
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    conn.execute(sql.SQL("SET search_path = {}, public").format(sql.Identifier(schema)))
    conn.execute(design.schema_sql)
    starts = month_starts()
    for parent in design.month_tables:
        for lo, hi in itertools.pairwise(starts):
            conn.execute(
                sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                    sql.Identifier(f"{parent}_p{lo:%Y_%m}"),
                    sql.Identifier(parent),
                    sql.Literal(lo),
                    sql.Literal(hi),
                )
            )


def seed(conn: psycopg.Connection[Any], design: Design, n: int, archived: int) -> None:
    if archived:
        conn.execute(
            sql.SQL(ARCHIVED_SQL).format(table=sql.Identifier(design.finished_table)),
            {"n": archived, "lo": month_starts()[0]},
        )
    conn.execute(SEED_SQL, {"n": n})
    conn.execute(SEED_HISTORY_SQL)
    conn.execute("VACUUM ANALYZE")  # the whole scratch database: a few small tables
    conn.execute("CHECKPOINT")


@contextmanager
def connect(url: str, schema: str | None = None) -> Iterator[psycopg.Connection[Any]]:
    kwargs: dict[str, Any] = {"autocommit": True}
    if schema is not None:
        kwargs["options"] = f"-c search_path={schema},public"
    with psycopg.connect(url, **kwargs) as conn:
        yield conn


# ---------------------------------------------------------------- the timed section


class Shared:
    """What the worker and mover threads report, under a lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.errors: Counter[str] = Counter()
        self.claims = 0
        self.empty_claims = 0
        self.finished = 0
        self.moved = 0
        self.move_batches = 0
        self.move_max_ms = 0.0
        self.empty_at: float | None = None
        self.drained_at: float | None = None  # when the last worker saw the queue empty
        self.failure: BaseException | None = None
        self.backend_cpu: float | None = 0.0
        self.mover_cpu: float | None = None
        self.xids: dict[str, list[int]] = {"claim": [], "finish": [], "move": []}
        self.stmt_s: defaultdict[str, float] = defaultdict(float)
        self.stmt_n: Counter[str] = Counter()

    def statement(self, kind: str, seconds: float, xid: int | None) -> None:
        with self.lock:
            self.stmt_s[kind] += seconds
            self.stmt_n[kind] += 1
            if xid is not None:
                self.xids[kind].append(xid)

    def add_cpu(self, before: float | None, after: float | None, *, mover: bool = False) -> None:
        with self.lock:
            if before is None or after is None or self.backend_cpu is None:
                self.backend_cpu = None
            else:
                self.backend_cpu += after - before
                if mover:
                    self.mover_cpu = after - before

    def error(self, exc: psycopg.Error, where: str) -> None:
        message = exc.diag.message_primary or str(exc)
        with self.lock:
            self.errors[f"{where}: {exc.sqlstate} {message}"] += 1


def worker_loop(
    url: str,
    schema: str,
    design: Design,
    wid: int,
    ready: threading.Barrier,
    go: threading.Event,
    shared: Shared,
) -> None:
    try:
        with connect(url, schema) as conn:
            claim_sql: Any = design.claim_sql
            finish_sql: Any = design.finish_sql
            worker = f"w{wid}"
            pid = backend_pid(conn)
            cpu0 = proc_cpu_s(pid)
            ready.wait()
            go.wait()
            while True:
                t = time.perf_counter()
                try:
                    rows = conn.execute(claim_sql, {"worker": worker}).fetchall()
                except psycopg.Error as exc:
                    shared.error(exc, "claim")
                    continue
                ids = [r[0] for r in rows]
                if ids:
                    shared.statement("claim", time.perf_counter() - t, rows[0][1])
                with shared.lock:
                    shared.claims += 1
                    shared.empty_claims += not ids
                if not ids:
                    # every queued job left is locked by a claim that will take it
                    with shared.lock:
                        shared.drained_at = max(shared.drained_at or 0.0, time.monotonic())
                    shared.add_cpu(cpu0, proc_cpu_s(pid))
                    break
                for _attempt in range(5):
                    t = time.perf_counter()
                    try:
                        row = conn.execute(finish_sql, {"ids": ids}).fetchone()
                        shared.statement("finish", time.perf_counter() - t, row[1] if row else None)
                        break
                    except psycopg.Error as exc:
                        shared.error(exc, "finish")
                else:
                    raise RuntimeError("finish failed five times")
                done = int(row[0]) if row else 0
                with shared.lock:
                    shared.finished += done
    except BaseException as exc:
        shared.failure = exc
        ready.abort()
        raise


def mover_loop(
    url: str, schema: str, workers_done: threading.Event, stop: threading.Event, shared: Shared
) -> None:
    try:
        with connect(url, schema) as conn:
            move_sql: Any = MOVE_SQL
            pid = backend_pid(conn)
            cpu0 = proc_cpu_s(pid)
            while not stop.is_set():
                pass_start = time.monotonic()
                while True:
                    t = time.perf_counter()
                    try:
                        row = conn.execute(move_sql).fetchone()
                    except psycopg.Error as exc:
                        shared.error(exc, "move")
                        break
                    ms = (time.perf_counter() - t) * 1000
                    moved = int(row[0]) if row else 0
                    if moved and row:
                        shared.statement("move", ms / 1000, row[1])
                    with shared.lock:
                        shared.moved += moved
                        shared.move_batches += moved > 0
                        shared.move_max_ms = max(shared.move_max_ms, ms)
                    if moved < MOVE_BATCH:
                        break
                if workers_done.is_set():
                    left = conn.execute(
                        "SELECT EXISTS (SELECT 1 FROM jobs WHERE finished_at IS NOT NULL)"
                    ).fetchone()
                    if left is not None and not left[0]:
                        shared.empty_at = time.monotonic()
                        shared.add_cpu(cpu0, proc_cpu_s(pid), mover=True)
                        return
                stop.wait(max(0.0, pass_start + MOVE_PERIOD_S - time.monotonic()))
    except BaseException as exc:
        shared.failure = exc
        raise


def table_stats(conn: psycopg.Connection[Any], table: str) -> tuple[int, int, int, int, int]:
    """Heap bytes, heap+index bytes, dead tuples, live tuples, autovacuums of ``table``."""
    row = conn.execute(
        """
        SELECT pg_relation_size(c.oid), pg_total_relation_size(c.oid),
               coalesce(s.n_dead_tup, 0), coalesce(s.n_live_tup, 0),
               coalesce(s.autovacuum_count, 0)
        FROM pg_class AS c
        LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
        WHERE c.oid = %s::regclass
        """,
        (table,),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2]), int(row[3]), int(row[4])


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an ascending sequence."""
    rank = max(1, -(-len(sorted_values) * p // 100))
    return sorted_values[int(rank) - 1]


def relations_probed(conn: psycopg.Connection[Any], query: str, params: dict[str, Any]) -> int:
    """How many tables or partitions the plan of ``query`` scans."""
    row = conn.execute(
        f"EXPLAIN (FORMAT JSON) {query}",
        params,
    ).fetchone()
    assert row is not None
    count = 0

    def walk(node: dict[str, Any]) -> None:
        nonlocal count
        if "Relation Name" in node:
            count += 1
        for child in node.get("Plans", []):
            walk(child)

    walk(row[0][0]["Plan"])
    return count


def time_lookups(
    conn: psycopg.Connection[Any], query: str, sample: list[tuple[Any, Any]]
) -> tuple[float, float]:
    q: Any = query
    for job_id, finished in sample[:LOOKUP_WARMUP]:
        conn.execute(q, {"id": job_id, "f": finished}).fetchone()
    times: list[float] = []
    for job_id, finished in sample[LOOKUP_WARMUP:]:
        t = time.perf_counter()
        row = conn.execute(q, {"id": job_id, "f": finished}).fetchone()
        times.append((time.perf_counter() - t) * 1e6)
        if row is None:
            raise RuntimeError(f"job {job_id} not found")
    times.sort()
    return percentile(times, 50), percentile(times, 99)


def run_once(
    url: str, design: Design, n: int, archived: int, workers: int, run_no: int
) -> RunResult:
    schema = f"run{run_no}_{design.key.lower()}"
    result = RunResult(design=design.key, jobs=n, mover=design.mover)
    with connect(url) as admin:
        admin.execute("SET search_path = public")
        create_schema(admin, schema, design)
        log(f"[{schema}] seeding {n} jobs")
        seed(admin, design, n, archived)
        # keeps the run's WAL on the server until pg_walinspect has read it (a
        # temporary slot: it goes with this connection whatever happens)
        slot = f"archive_choice_{os.getpid()}_{schema}"
        try:
            admin.execute("SELECT pg_create_physical_replication_slot(%s, true, true)", (slot,))
        except psycopg.Error as exc:
            log(f"  (no replication slot, the run's WAL may go: {exc.diag.message_primary})")
            slot = ""
        start_stats = table_stats(admin, f"{schema}.{design.hot_jobs}")

        shared = Shared()
        ready = threading.Barrier(workers + 1)
        go = threading.Event()
        workers_done = threading.Event()
        stop = threading.Event()
        threads = [
            threading.Thread(
                target=worker_loop, args=(url, schema, design, i, ready, go, shared), daemon=True
            )
            for i in range(workers)
        ]
        for th in threads:
            th.start()
        log(f"[{schema}] draining with {workers} workers{' and the mover' if design.mover else ''}")
        mover = None
        if design.mover:
            mover = threading.Thread(
                target=mover_loop, args=(url, schema, workers_done, stop, shared), daemon=True
            )
        ready.wait()  # every worker connected: the connections' start-up is not timed
        result.busy_before = wait_for_quiet()
        s0 = snapshot(admin)
        if mover is not None:
            mover.start()
        t0 = time.monotonic()
        go.set()
        for th in threads:
            th.join()
        workers_done.set()
        t_drain = shared.drained_at or time.monotonic()
        if shared.failure is not None:
            stop.set()
            raise RuntimeError(f"a worker failed: {shared.failure!r}")
        if mover is not None:
            mover.join(timeout=600)
            if mover.is_alive() or shared.empty_at is None:
                stop.set()
                raise RuntimeError(f"the mover did not empty the hot table: {shared.failure!r}")
            t_empty = shared.empty_at
        else:
            t_empty = t_drain
        time.sleep(0.5)  # the backends of the closed connections exit (their CPU is counted)
        s1 = snapshot(admin)

        result.drain_s = t_drain - t0
        result.empty_s = t_empty - t0
        result.wal_drain = wal_between(admin, s0.lsn, s1.lsn)
        result.checkpoints = s1.checkpoints - s0.checkpoints
        if shared.backend_cpu is not None:
            result.backend_cpu_s = shared.backend_cpu
            result.mover_cpu_s = shared.mover_cpu
            result.other_cpu_s = (
                (s1.busy - s0.busy) - shared.backend_cpu - (s1.own_cpu - s0.own_cpu)
            )
        result.errors = shared.errors
        result.claims = shared.claims
        result.empty_claims = shared.empty_claims
        result.moved = shared.moved
        result.move_batches = shared.move_batches
        result.move_max_ms = shared.move_max_ms
        log(
            f"[{schema}] drained in {result.drain_s:.1f} s ({result.jobs_per_s:.0f} jobs/s), "
            f"hot table empty of finished jobs after {result.empty_s:.1f} s, "
            f"errors {result.error_count}"
        )

        # every job done once, with its three history rows, wherever it lives
        row = admin.execute(
            sql.SQL(
                "SELECT (SELECT count(*) FILTER (WHERE status = 'succeeded' AND attempts = 1)"
                " FROM {jobs} WHERE worker_id <> 'past'), (SELECT count(*) FROM {hist})"
            ).format(
                jobs=sql.Identifier(schema, design.finished_table),
                hist=sql.Identifier(schema, design.finished_history),
            )
        ).fetchone()
        assert row is not None
        if int(row[0]) != n or int(row[1]) != 3 * n:
            raise RuntimeError(f"expected {n} succeeded jobs and {3 * n} history rows: {row}")

        # the hot table as the run left it (stats of exited backends need a moment)
        time.sleep(1.5)
        admin.execute("SELECT pg_stat_clear_snapshot()")
        heap, total, dead, live, autovac = table_stats(admin, f"{schema}.{design.hot_jobs}")
        result.hot_heap_bytes, result.hot_total_bytes = heap, total
        result.hot_dead, result.hot_live = dead, live
        result.hot_autovacuums = autovac - start_stats[4]
        if design.hot_history is not None:
            _, h_total, h_dead, _, _ = table_stats(admin, f"{schema}.{design.hot_history}")
            result.hist_hot_total_bytes, result.hist_hot_dead = h_total, h_dead

        # what is left to clean up: one VACUUM of every table of the run
        lsn0 = admin.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        tables = admin.execute(
            """
            SELECT c.oid::regclass::text FROM pg_class AS c
            JOIN pg_namespace AS n ON n.oid = c.relnamespace
            WHERE n.nspname = %s AND c.relkind = 'r'
            """,
            (schema,),
        ).fetchall()
        admin.execute(
            sql.SQL("VACUUM {}").format(sql.SQL(", ").join(sql.SQL(t[0]) for t in tables))
        )
        lsn1 = admin.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert lsn0 is not None and lsn1 is not None
        result.wal_vacuum = wal_between(admin, lsn0[0], lsn1[0])
        result.hot_total_after_vacuum = table_stats(admin, f"{schema}.{design.hot_jobs}")[1]
        log(f"[{schema}] reading the run's WAL records")
        result.wal = wal_of_database(admin, s0.lsn, lsn0[0], lsn1[0], shared.xids)
        result.stmt_s, result.stmt_n = shared.stmt_s, shared.stmt_n
        if slot:
            admin.execute("SELECT pg_drop_replication_slot(%s)", (slot,))

        # GET by id of finished jobs
        sample = admin.execute(
            sql.SQL(
                "SELECT id, finished_at FROM {} WHERE worker_id <> 'past'"
                " ORDER BY random() LIMIT %s"
            ).format(sql.Identifier(schema, design.finished_table)),
            (LOOKUPS + LOOKUP_WARMUP,),
        ).fetchall()
    with connect(url, schema) as conn:
        params = {"id": sample[0][0], "f": sample[0][1]}
        result.get_probes = relations_probed(conn, design.get_sql, params)
        result.get_known_probes = relations_probed(conn, design.get_known_sql, params)
        result.get_p50_us, result.get_p99_us = time_lookups(conn, design.get_sql, sample)
        result.get_known_p50_us, result.get_known_p99_us = time_lookups(
            conn, design.get_known_sql, sample
        )
    with connect(url) as admin:
        admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    return result


# ---------------------------------------------------------------- the report


def fmt_range(values: list[float], fmt: Callable[[float], str]) -> str:
    med = statistics.median(values)
    if len(values) == 1 or min(values) == max(values):
        return fmt(med)
    return f"{fmt(med)} ({fmt(min(values))} to {fmt(max(values))})"


def num(digits: int = 0) -> Callable[[float], str]:
    return lambda v: f"{v:,.{digits}f}"


def na(v: float | None, digits: int = 0) -> str:
    return "n/a" if v is None else f"{v:,.{digits}f}"


def mib(v: float) -> str:
    return f"{v / 1048576:,.1f}"


def report(results: list[RunResult], info: dict[str, str], args: argparse.Namespace) -> str:
    by = {k: [r for r in results if r.design == k] for k in DESIGNS}
    n: int = args.jobs

    def per_job(v: float | None, scale: float = 1.0) -> float | None:
        return None if v is None else v * scale / n

    def wal_kind(r: RunResult, *kinds: str, table: str = "", percent: bool = False) -> float | None:
        """WAL bytes per job of these kinds of statement (of one table's family)."""
        if r.wal is None:
            return None
        parts = [v for (k, t), v in r.wal.items() if k in kinds and (not table or t == table)]
        size = sum(v[0] for v in parts)
        if percent:  # the share of full-page images
            return 100 * sum(v[1] for v in parts) / size if size else None
        return size / n

    def sub(x: float | None, y: float | None) -> float | None:
        return None if x is None else x - (y or 0.0)

    def mean_ms(r: RunResult, kind: str) -> float | None:
        return 1000 * r.stmt_s[kind] / r.stmt_n[kind] if r.stmt_n[kind] else None

    def row(
        label: str, get: Callable[[RunResult], float | None], fmt: Callable[[float], str]
    ) -> str:
        cells = []
        for k in DESIGNS:
            values = [v for v in (get(r) for r in by[k]) if v is not None]
            cells.append(fmt_range(values, fmt) if values else "n/a")
        return f"| {label} | " + " | ".join(cells) + " |"

    lines = [
        f"## Finished jobs out of the hot table: {n:,} jobs, {args.workers} workers, "
        f"claim batch {CLAIM_BATCH}, {args.archived:,} finished before; "
        f"{args.repeat} runs each (median, range)",
        "",
        f"Server: {info['version']}; fsync {info['fsync']}, synchronous_commit "
        f"{info['synchronous_commit']}, shared_buffers {info['shared_buffers']}, "
        f"max_wal_size {info['max_wal_size']}, autovacuum {info['autovacuum']}; "
        f"{os.cpu_count()} CPUs on the client machine.",
        "",
        "| | " + " | ".join(d.name for d in DESIGNS.values()) + " |",
        "|---|" + "---|" * len(DESIGNS),
        row("drain, jobs/s (B: mover running)", lambda r: r.jobs_per_s, num()),
        row("drain time, s", lambda r: r.drain_s, num(1)),
        row("until the hot table holds no finished job, s", lambda r: r.empty_s, num(1)),
        row("WAL per job, B: claims", lambda r: wal_kind(r, "claim"), num()),
        row("WAL per job, B: finishes", lambda r: wal_kind(r, "finish"), num()),
        row("WAL per job, B: mover", lambda r: wal_kind(r, "move"), num()),
        row(
            "WAL per job, B: mover, of which history",
            lambda r: wal_kind(r, "move", table="history") if r.mover else None,
            num(),
        ),
        row(
            "WAL per job, B: finishing path (finish + mover)",
            lambda r: wal_kind(r, "finish", "move"),
            num(),
        ),
        row(
            "WAL per job, B: other (pruning, failed claims)", lambda r: wal_kind(r, "other"), num()
        ),
        row(
            "WAL per job, B: drain (+ move), all of the above",
            lambda r: wal_kind(r, "claim", "finish", "move", "other"),
            num(),
        ),
        row("WAL per job, B: the final VACUUM", lambda r: wal_kind(r, "vacuum"), num()),
        row("WAL per job, B: total", lambda r: wal_kind(r, *WAL_KINDS), num()),
        row(
            "WAL per job, B: total, of which history tables",
            lambda r: wal_kind(r, *WAL_KINDS, table="history"),
            num(),
        ),
        row(
            "full-page images, % of that total",
            lambda r: wal_kind(r, *WAL_KINDS, percent=True),
            num(),
        ),
        row(
            "WAL per job, B, whole cluster: drain (+ move)",
            lambda r: r.wal_drain / n,
            num(),
        ),
        row("checkpoints during the run", lambda r: r.checkpoints, num()),
        row(
            "backend CPU per job, µs: workers (claims + finishes)",
            lambda r: per_job(sub(r.backend_cpu_s, r.mover_cpu_s), 1e6),
            num(),
        ),
        row(
            "backend CPU per job, µs: mover",
            lambda r: per_job(r.mover_cpu_s, 1e6) if r.mover else None,
            num(),
        ),
        row(
            "backend CPU per job, µs: workers + mover",
            lambda r: per_job(r.backend_cpu_s, 1e6),
            num(),
        ),
        row("hot jobs table at the end, MiB (heap + indexes)", lambda r: r.hot_total_bytes, mib),
        row("hot jobs table at the end, heap MiB", lambda r: r.hot_heap_bytes, mib),
        row("hot jobs table at the end, dead tuples", lambda r: r.hot_dead, num()),
        row("hot jobs table, autovacuums during the run", lambda r: r.hot_autovacuums, num()),
        row(
            "hot jobs table after VACUUM, MiB (heap + indexes)",
            lambda r: r.hot_total_after_vacuum,
            mib,
        ),
        row(
            "hot history table at the end, MiB (heap + indexes)",
            lambda r: r.hist_hot_total_bytes,
            mib,
        ),
        row("hot history table at the end, dead tuples", lambda r: r.hist_hot_dead, num()),
        row("errors (all kinds; the claim retried)", lambda r: r.error_count, num()),
        row("claims (incl. empty ones)", lambda r: r.claims, num()),
        row("claim statement, mean ms", lambda r: mean_ms(r, "claim"), num(2)),
        row("finish statement, mean ms", lambda r: mean_ms(r, "finish"), num(2)),
        row("mover: batches with rows", lambda r: r.move_batches if r.mover else None, num()),
        row("mover: batch, mean ms", lambda r: mean_ms(r, "move"), num()),
        row("mover: slowest batch, ms", lambda r: r.move_max_ms if r.mover else None, num()),
        row("GET by id, p50 µs", lambda r: r.get_p50_us, num()),
        row("GET by id, p99 µs", lambda r: r.get_p99_us, num()),
        row("GET by id, tables/partitions probed", lambda r: r.get_probes, num()),
        row("GET by id + finished_at, p50 µs", lambda r: r.get_known_p50_us, num()),
        row("GET by id + finished_at, p99 µs", lambda r: r.get_known_p99_us, num()),
        row(
            "GET by id + finished_at, tables/partitions probed",
            lambda r: r.get_known_probes,
            num(),
        ),
        row("other load: machine busy before the run, %", lambda r: 100 * r.busy_before, num()),
        row("other load: CPU s of everything else during the run", lambda r: r.other_cpu_s, num(1)),
        "",
    ]
    errors: Counter[tuple[str, str]] = Counter()
    for r in results:
        for message, count in r.errors.items():
            errors[(r.design, message)] += count
    if errors:
        lines.append("Errors, summed over the runs:")
        lines.append("")
        for (design, message), count in sorted(errors.items()):
            lines.append(f"- {design}: {count} times: {message}")
    else:
        lines.append("No errors in any run.")
    lines += [
        "",
        "B = bytes. WAL rows but the whole-cluster one count the scratch database's own "
        "records (pg_walinspect); the whole-cluster one includes whatever else the server "
        "did meanwhile. Backend CPU: the workers' and the mover's server processes. "
        "jobs/s and latencies depend on the other load of the machine (last two rows).",
    ]
    lines += ["", "Runs, in order:", ""]
    lines.append(
        "| run | design | jobs/s | empty after, s | WAL B/job (db) | + VACUUM | "
        "WAL B/job (cluster) | backend µs/job | errors | checkpoints | other CPU s |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(results, 1):
        cells = [
            str(i),
            r.design,
            f"{r.jobs_per_s:,.0f}",
            f"{r.empty_s:.1f}",
            na(wal_kind(r, "claim", "finish", "move", "other")),
            na(wal_kind(r, "vacuum")),
            f"{r.wal_drain / n:,.0f}",
            na(per_job(r.backend_cpu_s, 1e6)),
            str(r.error_count),
            str(r.checkpoints),
            na(r.other_cpu_s, 1),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--archived", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)

    dbname = f"archive_choice_{secrets.token_hex(4)}"
    url = make_conninfo(args.database_url, dbname=dbname)
    with connect(args.database_url) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    log(f"scratch database {dbname}")
    results: list[RunResult] = []
    try:
        with connect(url) as conn:
            info: dict[str, str] = {}
            for name in (
                "fsync",
                "synchronous_commit",
                "shared_buffers",
                "max_wal_size",
                "autovacuum",
            ):
                setting = conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()
                info[name] = str(setting[0]) if setting else "?"
            version = conn.execute("SELECT version()").fetchone()
            info["version"] = str(version[0]).split(" on ")[0] if version else "?"
            try:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            except psycopg.Error as exc:
                log(f"no pg_walinspect ({exc.diag.message_primary}): no FPI share")
        run_no = 0
        for _ in range(args.repeat):
            for design in DESIGNS.values():
                run_no += 1
                results.append(
                    run_once(url, design, args.jobs, args.archived, args.workers, run_no)
                )
    finally:
        with connect(args.database_url) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname))
            )
        log(f"dropped {dbname}")
    sys.stdout.write(report(results, info, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
