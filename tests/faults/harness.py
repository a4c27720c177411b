"""The fault campaign's harness: daemons as subprocesses, a workload, the audit, the figures.

A test gets a ``Scenario`` (fixture ``scenario``): a fresh migrated database on the
module's throwaway cluster, a ledger file, and helpers to start ``python -m jobsd run``
daemons with the campaign's handlers (``fault_handlers.py``) and lease settings, to
enqueue, and to inject faults. Every scenario ends with ``audit()``: the figures of
docs/reliability.md, computed from the ledger (what really ran) and from jobsd's tables
(what jobsd says), never from jobsd's own view alone. ``expect()`` records a figure
with its pass criterion; ``verdict()`` fails the test if any criterion failed, after
every figure has been recorded for the report.
"""

from __future__ import annotations

import contextlib
import operator
import os
import re
import signal
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from e2e.conftest import Proc, jobsd_command, make_env, poll
from ledger import Run, read_runs
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row
from support.history import history_problems

from jobsd.client import SyncClient
from jobsd.errors import BackendUnavailable, JobsdError, OutcomeUnknown
from jobsd.ops import Caller
from jobsd.ops.tokens import create_token

OPERATOR = Caller.as_operator("tests")

__all__ = [
    "LEASE_ENV",
    "Audit",
    "Campaign",
    "Producer",
    "Scenario",
    "TimedProc",
    "connect_quietly",
    "sized",
]

FAULTS_DIR = Path(__file__).resolve().parent

# L = 3 s: a daemon's lease (renewed every 0.5 s), and how long after its end a daemon
# that still holds its lock is rescued; checks, sweeps and death checks every 1 s
LEASE_S = 3.0
LEASE_ENV = {
    "JOBSD_STALE_AFTER": "3",
    "JOBSD_HEARTBEAT_INTERVAL": "1",
    "JOBSD_SWEEP_INTERVAL": "1",
    "JOBSD_DEATH_CHECK_INTERVAL": "1",
    "JOBSD_WORKER_LEASE": "3",
    "JOBSD_POLL_INTERVAL": "0.5",
    "JOBSD_PROGRESS_INTERVAL": "0.2",
    "JOBSD_SLOTS": "4",
    "JOBSD_DRAIN_TIMEOUT": "5",
    # scaled with the lease: a cut is noticed within 5 s (T7-detect)
    "JOBSD_STATEMENT_TIMEOUT": "2",
    # ended jobs stay in the hot table, where the checks' SQL looks for them
    "JOBSD_ARCHIVE_AFTER": "1h",
}

# what each campaign type may do (fault_handlers.py)
DELIVERY = {"work": "at_least_once", "once": "at_most_once"}
MAX_RUNS = {"work": 3, "once": 1, "hang_async": 1, "hang_async_retry": 2, "boom": 1, "flaky": 3}
TERMINAL = ("succeeded", "failed", "cancelled")

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
}


class Campaign:
    """Whether the full campaign runs (conftest sets it at collection): sizes follow it."""

    full = False


def sized(quick: int, full: int) -> int:
    """Return the full campaign's size of a workload, or the quick subset's."""
    return full if Campaign.full else quick


class TimedProc(Proc):
    """A ``Proc`` that also remembers when (monotonic) each stderr line arrived."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.stamps: list[tuple[float, str]] = []
        super().__init__(args, env)

    def _read(self, name: str) -> None:
        stream = self.popen.stdout if name == "stdout" else self.popen.stderr
        assert stream is not None
        for line in stream:
            with self._changed:
                text = line.rstrip("\n")
                self.lines[name].append(text)
                if name == "stderr":
                    self.stamps.append((time.monotonic(), text))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def first_line_after(self, pattern: str, after: float) -> float | None:
        """Return when the first stderr line matching ``pattern`` came after ``after``."""
        regex = re.compile(pattern)
        with self._changed:
            for stamp, text in self.stamps:
                if stamp >= after and regex.search(text):
                    return stamp
        return None

    def count(self, pattern: str) -> int:
        """Count the stderr lines matching ``pattern``."""
        regex = re.compile(pattern)
        with self._changed:
            return sum(1 for _, text in self.stamps if regex.search(text))


def connect_quietly(url: str, timeout_s: int = 2) -> psycopg.Connection[Any] | None:
    """Connect in autocommit mode, or return None while the server is away."""
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=timeout_s)
    except psycopg.OperationalError:
        return None


@dataclass
class Audit:
    """The figures of one scenario, from the ledger and from jobsd's tables."""

    jobs: int
    by_status: dict[str, int]
    lost: int
    ghost: int
    stuck: int
    double_runs: int
    overlaps: int
    amo_reruns: int
    illegal: int
    phantom_runs: int
    fenced: int
    runs: int
    problems: list[str] = field(default_factory=list)

    def as_figures(self) -> dict[str, Any]:
        """Return the figures for the report."""
        return {
            "jobs": self.jobs,
            "lost": self.lost,
            "ghost": self.ghost,
            "stuck": self.stuck,
            "double_runs": self.double_runs,
            "overlaps": self.overlaps,
            "amo_reruns": self.amo_reruns,
            "illegal": self.illegal,
            "phantom_runs": self.phantom_runs,
            "fenced": self.fenced,
            "runs": self.runs,
            "by_status": self.by_status,
        }


@dataclass
class Check:
    """A figure and its pass criterion."""

    name: str
    value: Any
    op: str
    bound: Any
    ok: bool

    def text(self) -> str:
        return f"{self.name} = {self.value!r} (want {self.op} {self.bound!r})"


class Producer(threading.Thread):
    """Enqueue jobs at a steady pace through ``SyncClient``, recording every answer.

    Each job has a client-made id. A definite refusal (``BackendUnavailable``: nothing
    was created) is recorded in ``refused`` and the producer moves on; an ambiguous one
    (``OutcomeUnknown``) is retried with the same id until it resolves, so it ends in
    ``acked``. ``acked`` holds the ids jobsd confirmed.
    """

    def __init__(
        self,
        url: str,
        count: int,
        *,
        pace_s: float,
        types: Iterable[str] = ("work",),
        ms: int = 50,
        deadline_s: float = 60.0,
        pad_bytes: int = 0,
    ) -> None:
        super().__init__(daemon=True)
        self.url, self.count, self.pace_s, self.ms = url, count, pace_s, ms
        self.pad_bytes = pad_bytes
        self.types = list(types)
        self.deadline_s = deadline_s
        self.acked: list[uuid.UUID] = []
        self.refused: list[uuid.UUID] = []
        self.unknown: list[uuid.UUID] = []
        self.errors: list[str] = []
        self.ack_times: list[float] = []
        self.stop_flag = threading.Event()

    def first_ack_after(self, t: float) -> float | None:
        """Return when (monotonic) the first job after ``t`` was acknowledged."""
        later = [s for s in self.ack_times if s >= t]
        return min(later) if later else None

    def run(self) -> None:
        end = time.monotonic() + self.deadline_s
        with SyncClient(self.url) as client:
            for n in range(self.count):
                if self.stop_flag.is_set() or time.monotonic() > end:
                    break
                job_id = uuid.uuid4()
                kind = self.types[n % len(self.types)]
                payload: dict[str, Any] = {"ms": self.ms, "n": n}
                if self.pad_bytes:  # incompressible: every byte reaches the WAL
                    payload["pad"] = os.urandom(self.pad_bytes // 2).hex()
                while time.monotonic() < end:
                    try:
                        client.enqueue(kind, payload, org_id="acme", job_id=job_id)
                    except OutcomeUnknown:
                        self.unknown.append(job_id)
                        time.sleep(0.1)
                        continue  # same id: resolves to the job, or creates it once
                    except BackendUnavailable:
                        self.refused.append(job_id)
                    except JobsdError as exc:
                        self.errors.append(f"{job_id}: {exc}")
                    else:
                        self.acked.append(job_id)
                        self.ack_times.append(time.monotonic())
                    break
                time.sleep(self.pace_s)


class Scenario:
    """One scenario's database, ledger, daemons, workload and figures."""

    def __init__(self, url: str, workdir: Path, figures: dict[str, Any]) -> None:
        self.url = url
        self.workdir = workdir
        self.ledger_path = workdir / "ledger.jsonl"
        self.ledger_path.touch()
        self.ledger_path.chmod(0o666)
        self.procs: list[TimedProc] = []
        self.deaths: dict[int, float] = {}  # pid -> monotonic time it was killed
        self.acked: set[uuid.UUID] = set()
        self.refused: set[uuid.UUID] = set()
        self.figures = figures
        self.checks: list[Check] = figures.setdefault("checks", [])

    # -- processes -------------------------------------------------------------------

    def env(self, url: str | None = None, **settings: str) -> dict[str, str]:
        """Return a daemon's environment: the campaign's handlers, ledger and lease."""
        env = make_env(url or self.url, **{**LEASE_ENV, **settings})
        env["JOBSD_HANDLERS"] = settings.get("JOBSD_HANDLERS", "fault_handlers")
        env["PYTHONPATH"] = f"{FAULTS_DIR}:{env['PYTHONPATH']}"
        env["JOBSD_FAULTS_LEDGER"] = str(self.ledger_path)
        return env

    def spawn(self, *args: str, env: dict[str, str], prefix: tuple[str, ...] = ()) -> TimedProc:
        """Start ``jobsd <args>`` (optionally behind a command prefix such as netns exec)."""
        proc = TimedProc([*prefix, *jobsd_command(), *args], env)
        self.procs.append(proc)
        return proc

    def daemon(
        self,
        *,
        url: str | None = None,
        prefix: tuple[str, ...] = (),
        ready: bool = True,
        **settings: str,
    ) -> TimedProc:
        """Start a daemon and (by default) wait until it claims."""
        proc = self.spawn("run", env=self.env(url, **settings), prefix=prefix)
        if ready:
            proc.wait_ready(timeout_s=30)
        return proc

    def api(self, *, url: str | None = None, **settings: str) -> tuple[TimedProc, str]:
        """Start ``jobsd api`` on a free port; return it and its base URL once it listens."""
        env = self.env(url, **settings)
        proc = self.spawn("api", "--addr", "127.0.0.1:0", env=env)
        match = proc.wait_for(r"\bapi\.listening\b.*addr=(\S+)", timeout_s=30)
        return proc, f"http://{match.group(1)}"

    def token(self, org_id: str = "acme") -> str:
        """Create an API token for ``org_id`` and return it."""
        with self.conn() as conn:
            secret, _ = create_token(conn, OPERATOR, org_id, "faults")
        return secret

    def kill(self, proc: TimedProc, sig: signal.Signals = signal.SIGKILL) -> float:
        """Send ``sig``; for SIGKILL, wait for the death and remember its time."""
        t = time.monotonic()
        proc.send(sig)
        if sig == signal.SIGKILL:
            proc.popen.wait(10)
            self.deaths[proc.pid] = t
        return t

    def stop(self, proc: TimedProc, timeout_s: float = 30) -> int:
        """SIGTERM a daemon and return its exit status."""
        if proc.popen.poll() is None:
            proc.send(signal.SIGTERM)
        return proc.wait(timeout_s)

    def close(self) -> None:
        """Kill every process still alive (teardown) and print their logs' tails."""
        for proc in self.procs:
            if proc.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send(signal.SIGCONT)
            proc.kill()
            print(f"--- {' '.join(proc.args[-1:])} pid {proc.pid} exit {proc.popen.returncode}")
            print(proc.text("stderr")[-3000:])

    # -- database --------------------------------------------------------------------

    def conn(self) -> psycopg.Connection[Any]:
        """Open an autocommit connection to the scenario's database."""
        return psycopg.connect(self.url, autocommit=True)

    def rows(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Run a query and return its rows."""
        with self.conn() as conn:
            return conn.execute(query, params).fetchall()

    def scalar(self, query: str, params: Any = None) -> Any:
        """Run a query and return the first column of its first row (None if no row)."""
        with self.conn() as conn:
            row = conn.execute(query, params).fetchone()
        return None if row is None else row[0]

    def enqueue(
        self, count: int, *, types: Iterable[str] = ("work",), ms: int | Callable[[int], int] = 50
    ) -> list[uuid.UUID]:
        """Enqueue ``count`` jobs (types in rotation); return their ids, all acked."""
        kinds = list(types)
        ids = []
        with SyncClient(self.url) as client:
            for n in range(count):
                dur = ms(n) if callable(ms) else ms
                job = client.enqueue(kinds[n % len(kinds)], {"ms": dur, "n": n}, org_id="acme")
                ids.append(job.id)
        self.acked.update(ids)
        return ids

    def enqueue_bulk(self, count: int, *, type: str = "work", ms: int = 0) -> list[uuid.UUID]:
        """Insert ``count`` queued jobs in one statement (setup of the big scenarios)."""
        rows = self.rows(
            "INSERT INTO jobsd.jobs (org_id, type, payload) "
            "SELECT 'acme', %s, jsonb_build_object('ms', %s::int, 'n', n) "
            "FROM generate_series(1, %s) AS n RETURNING id",
            (type, ms, count),
        )
        ids = [r[0] for r in rows]
        self.acked.update(ids)
        return ids

    def count_status(self, *statuses: str, worker_pid: int | None = None) -> int:
        """Count jobs in ``statuses`` (optionally owned by the daemon of ``worker_pid``)."""
        query = "SELECT count(*) FROM jobsd.jobs WHERE status = ANY(%s)"
        params: list[Any] = [list(statuses)]
        if worker_pid is not None:
            query += " AND split_part(worker_id, ':', 2) = %s"
            params.append(str(worker_pid))
        return int(self.scalar(query, params))

    def wait_running(self, n: int, *, worker_pid: int | None = None, timeout_s: float = 30) -> None:
        """Wait until at least ``n`` jobs run (on one daemon, if given)."""
        poll(
            lambda: self.count_status("running", worker_pid=worker_pid) >= n,
            what=f"{n} running jobs",
            timeout_s=timeout_s,
        )

    def wait_settled(self, timeout_s: float = 60, *, statuses: tuple[str, ...] = TERMINAL) -> float:
        """Wait until every job is in ``statuses``; return how long it took."""
        t0 = time.monotonic()

        def done() -> bool:
            with connect_quietly(self.url) or _Nothing() as conn:
                if conn is None:
                    return False
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE NOT status = ANY(%s)) FROM jobsd.jobs",
                    (list(statuses),),
                ).fetchone()
                return row is not None and row[0] == 0

        try:
            poll(done, what=f"every job to be {'/'.join(statuses)}", timeout_s=timeout_s)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; unsettled: {self._unsettled(statuses)}") from None
        return time.monotonic() - t0

    def _unsettled(self, statuses: tuple[str, ...]) -> str:
        """Describe the jobs not in ``statuses`` (for a timeout's message)."""
        with connect_quietly(self.url) or _Nothing() as conn:
            if conn is None:
                return "database unreachable"
            rows = conn.execute(
                "SELECT j.status, j.attempts, j.run_after - now(), j.worker_id,"
                " (SELECT string_agg(e.from_status || '>' || e.to_status || ':'"
                "  || coalesce(e.reason, ''), ' ' ORDER BY e.id)"
                "  FROM jobsd.all_job_events e WHERE e.job_id = j.id)"
                " FROM jobsd.jobs j WHERE NOT j.status = ANY(%s) ORDER BY j.id LIMIT 5",
                (list(statuses),),
            ).fetchall()
            total = conn.execute(
                "SELECT status, count(*) FROM jobsd.jobs GROUP BY status"
            ).fetchall()
            return f"{dict(total)} e.g. {rows}"

    def events(self) -> list[dict[str, Any]]:
        """Return every job event, oldest first."""
        with psycopg.connect(self.url, autocommit=True, row_factory=dict_row) as conn:
            return conn.execute(
                "SELECT id, job_id, from_status, to_status, attempt, worker_id, reason, at "
                "FROM jobsd.all_job_events ORDER BY id"
            ).fetchall()

    def db_now(self) -> datetime:
        """Return the database's clock_timestamp()."""
        value = self.scalar("SELECT clock_timestamp()")
        assert isinstance(value, datetime)
        return value

    def first_event_after(
        self,
        after: datetime,
        *,
        to: Iterable[str] = ("running", *TERMINAL),
        worker_pid: int | None = None,
    ) -> datetime | None:
        """Return when the first claim or completion after ``after`` was recorded (by the
        daemon of ``worker_pid``, if given)."""
        value = self.scalar(
            "SELECT min(at) FROM jobsd.all_job_events WHERE at > %s AND to_status = ANY(%s) "
            "AND from_status IS DISTINCT FROM to_status AND from_status IS NOT NULL "
            "AND (%s::text IS NULL OR split_part(worker_id, ':', 2) = %s::text)",
            (after, list(to), worker_pid, worker_pid),
        )
        return value if isinstance(value, datetime) else None

    # -- the audit -------------------------------------------------------------------

    def runs(self) -> dict[str, list[Run]]:
        """Read the ledger."""
        return read_runs(self.ledger_path)

    def audit(self, *, max_runs: dict[str, int] | None = None, settled: bool = True) -> Audit:
        """Compute the scenario's figures and record them for the report.

        ``settled``: every job should have ended (else it counts as stuck).
        """
        limits = {**MAX_RUNS, **(max_runs or {})}
        with (
            psycopg.connect(self.url, autocommit=True, row_factory=dict_row) as conn,
            conn.transaction(),
        ):
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            jobs = conn.execute("SELECT id, type, status, attempts FROM jobsd.jobs").fetchall()
            events = conn.execute(
                "SELECT id, job_id, from_status, to_status, attempt, reason, at "
                "FROM jobsd.all_job_events ORDER BY job_id, id"
            ).fetchall()
        present = {j["id"] for j in jobs}
        problems = history_problems(jobs, events)
        # the event clock never goes backwards within a job's history
        last_at: dict[Any, Any] = {}
        for e in events:
            if e["at"] is None:
                problems.append(f"{e['job_id']}: event {e['id']} has no time")
            elif e["job_id"] in last_at and e["at"] < last_at[e["job_id"]]:
                problems.append(f"{e['job_id']}: event {e['id']} is older than the one before")
            last_at[e["job_id"]] = e["at"]
        claims = {(e["job_id"], e["attempt"]) for e in events if e["to_status"] == "running"}
        runs = self.runs()
        double = overlaps = amo_reruns = phantom = 0
        types = {str(j["id"]): j["type"] for j in jobs}
        for job_id, job_runs in runs.items():
            kind = job_runs[0].type
            overlapping = any(
                a.overlaps(b, self.deaths)
                for i, a in enumerate(job_runs)
                for b in job_runs[i + 1 :]
            )
            overlaps += overlapping
            too_many = len(job_runs) > limits.get(kind, 1)
            double += too_many or overlapping
            if DELIVERY.get(kind) == "at_most_once" and len(job_runs) > 1:
                amo_reruns += 1
            for run in job_runs:
                if (uuid.UUID(run.job), run.attempt) not in claims:
                    phantom += 1
                    problems.append(f"{run.job}: ran attempt {run.attempt} with no claim")
            if job_id not in types:
                problems.append(f"{job_id}: ran but is not in jobsd.jobs")
        stuck = sum(1 for j in jobs if j["status"] not in TERMINAL) if settled else 0
        audit = Audit(
            jobs=len(jobs),
            by_status=dict(Counter(j["status"] for j in jobs)),
            lost=len(self.acked - present),
            ghost=len(self.refused & present),
            stuck=stuck,
            double_runs=double,
            overlaps=overlaps,
            amo_reruns=amo_reruns,
            illegal=len(problems) - phantom,
            phantom_runs=phantom,
            fenced=sum(1 for e in events if str(e["reason"] or "").startswith("result discarded")),
            runs=sum(len(r) for r in runs.values()),
            problems=problems,
        )
        self.figures.update(audit.as_figures())
        if problems:
            self.figures["problems"] = problems[:10]
        return audit

    # -- figures and criteria ----------------------------------------------------------

    def record(self, **figures: Any) -> None:
        """Record figures for the report (no criterion)."""
        self.figures.update(figures)

    def expect(self, name: str, value: Any, op: str, bound: Any) -> bool:
        """Record a figure and whether it meets its criterion (``verdict`` asserts them)."""
        ok = value is not None and _OPS[op](value, bound)
        self.figures[name] = value
        self.checks.append(Check(name, value, op, bound, ok))
        return ok

    def expect_clean(self, audit: Audit, *, overlaps_allowed: bool = False) -> None:
        """The criteria every scenario shares: nothing lost, ghost, run twice or illegal."""
        self.expect("lost", audit.lost, "==", 0)
        self.expect("ghost", audit.ghost, "==", 0)
        self.expect("stuck", audit.stuck, "==", 0)
        self.expect("amo_reruns", audit.amo_reruns, "==", 0)
        if overlaps_allowed:
            self.expect("runs_over_limit", audit.double_runs - audit.overlaps, "<=", 0)
        else:
            self.expect("double_runs", audit.double_runs, "==", 0)
        self.expect("illegal", audit.illegal, "==", 0)
        self.expect("phantom_runs", audit.phantom_runs, "==", 0)

    def expect_no_tracebacks(self, proc: Proc, name: str = "tracebacks") -> None:
        """Expect no traceback in ``proc``'s output; a failure shows the first one."""
        text = proc.text()
        self.expect(name, text.count("Traceback"), "==", 0)
        start = text.find("Traceback")
        if start >= 0:
            begin = text.rfind("\n", 0, max(0, start - 400)) + 1
            self.figures.setdefault("problems", []).append(text[begin : start + 4000])

    def verdict(self) -> None:
        """Fail the test with every unmet criterion (figures are already recorded)."""
        failed = [c.text() for c in self.checks if not c.ok]
        problems = self.figures.get("problems", [])
        assert not failed, (
            "unmet criteria: "
            + "; ".join(failed)
            + ("\n" + "\n".join(problems) if problems else "")
        )


class _Nothing:
    """A context manager yielding None (for ``connect_quietly(...) or _Nothing()``)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def percentile(values: list[float], q: float) -> float | None:
    """Return the q-quantile (0..1) of ``values`` (nearest rank), or None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def median(values: list[float]) -> float | None:
    """Return the median, or None if empty."""
    return statistics.median(values) if values else None


def via(url: str, host: str, port: int) -> str:
    """Return ``url`` reaching the same database at ``host:port``, without TLS (a proxy
    or a network namespace in between)."""
    params = conninfo_to_dict(url)
    params.update(host=host, port=str(port), sslmode="disable", gssencmode="disable")
    return make_conninfo("", **params)
