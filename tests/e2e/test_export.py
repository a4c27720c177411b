"""``jobsd export``: the snapshot matches the database, follows its documented contract,
and replaces its target atomically, even when the process is killed mid-write."""

from __future__ import annotations

import copy
import io
import json
import os
import signal
import socket
import stat
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonschema
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from support.jobs import NOW, PATHS, make_job, make_jobs

from jobsd.admin.roles import create_roles, drop_roles
from jobsd.admin.snapshot import CONTRACT, validate_snapshot, write_snapshot, write_snapshot_file
from jobsd.store.sqlfiles import load_migrations

from .conftest import REPO_ROOT, Proc, make_env, poll, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

SCHEMA = json.loads((REPO_ROOT / "docs" / "snapshot.v1.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
BIG_NUMBER = "12345678901234567890.123456789"  # a float would round it


def schema_errors(doc: Any) -> list[str]:
    """Return what the committed JSON Schema finds wrong with ``doc``."""
    return [f"{list(e.absolute_path)}: {e.message}" for e in VALIDATOR.iter_errors(doc)]


def add_job(
    conn: psycopg.Connection[Any],
    *,
    queue: str = "default",
    born: str = "queued",
    then: tuple[str, ...] = (),
    priority: int = 0,
    created_at: datetime = T0,
    job_id: str | None = None,
    payload: str = "{}",
) -> str:
    """Insert a job born ``born``, walk it through the states ``then``; return its id."""
    status = then[-1] if then else born
    assert PATHS[status] == then, f"{born} -> {then} is not the path make_job takes"
    ids = {"id": uuid.UUID(job_id)} if job_id else {}
    job = make_job(
        conn,
        status=status,
        # the claim of the walk's run, as a daemon's would write it
        claim={
            "attempts": sql.SQL("attempts + 1"),
            "started_at": NOW,
            "worker_id": "w1",
            "lease_id": sql.SQL("gen_random_uuid()"),
            "progress": {"done": 1},
        },
        org_id="acme",
        type="work",
        queue=queue,
        priority=priority,
        payload=payload,
        created_at=created_at,
        **({} if born == "scheduled" else {"run_after": created_at}),
        **ids,
    )
    return str(job)


def export_doc(url: str) -> tuple[dict[str, Any], str]:
    """Run ``jobsd export`` to stdout; return the parsed document and its text."""
    done = run_cli("export", env=make_env(url))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stdout


def error_line(result: Any) -> str:
    """Check an error exit: one ``jobsd: error:`` line (warnings aside), no traceback."""
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = [x for x in result.stderr.splitlines() if not x.startswith("jobsd: warning:")]
    assert len(lines) == 1 and lines[0].startswith("jobsd: error: "), result.stderr
    assert result.stdout == ""
    return lines[0]


def leftovers(target: Path) -> list[Path]:
    """Return the temporary files of exports to ``target``."""
    return sorted(target.parent.glob(f".{target.name}.tmp-*"))


def test_the_snapshot_matches_the_database(db_url: str, conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "INSERT INTO jobsd.queues (name, capacity, concurrency_limit, retention_days, paused_at) "
        "VALUES ('mail', 100, 2, 7, now()), ('zeta', NULL, NULL, NULL, NULL)"
    )
    t = [T0 + timedelta(seconds=s) for s in range(6)]
    low = add_job(conn, priority=5, created_at=t[0])
    tie_b = add_job(conn, created_at=t[1], job_id="00000000-0000-7000-8000-000000000002")
    tie_a = add_job(conn, created_at=t[1], job_id="00000000-0000-7000-8000-000000000001")
    high = add_job(conn, priority=-1, created_at=t[2])
    scheduled = add_job(conn, born="scheduled", created_at=t[3])
    running = add_job(conn, then=("running",), created_at=t[4])
    stuck = add_job(conn, then=("running", "recovery_required"), created_at=t[5])
    finished = add_job(conn, then=("running", "succeeded"))
    add_job(conn, then=("running", "failed"))
    add_job(conn, then=("cancelled",))
    payload = f'{{"n": {BIG_NUMBER}, "s": "h\u00e9llo"}}'
    blocked = add_job(conn, queue="mail", born="blocked", payload=payload)
    conn.execute(
        "INSERT INTO jobsd.job_dependencies (job_id, depends_on, org_id) "
        "VALUES (%s, %s, 'acme'), (%s, %s, 'acme')",
        (blocked, low, blocked, finished),
    )
    db_now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]

    doc, text = export_doc(db_url)

    assert schema_errors(doc) == []
    assert validate_snapshot(doc) == []
    assert doc["contract"] == CONTRACT
    generated = datetime.fromisoformat(doc["generated_at"])
    assert generated.utcoffset() == timedelta(0)
    assert db_now <= generated <= db_now + timedelta(seconds=30)
    assert doc["database"]["schema_version"] == max(m.version for m in load_migrations())
    assert doc["database"]["name"] == conn.info.dbname

    queues = {q["name"]: q for q in doc["queues"]}
    assert [q["name"] for q in doc["queues"]] == ["default", "mail", "zeta"]
    assert queues["default"]["depth"] == {
        "queued": 4,
        "scheduled": 1,
        "blocked": 0,
        "running": 1,
        "recovery_required": 1,
    }
    assert queues["mail"]["depth"] == {
        "queued": 0,
        "scheduled": 0,
        "blocked": 1,
        "running": 0,
        "recovery_required": 0,
    }
    assert set(queues["zeta"]["depth"].values()) == {0}
    mail = queues["mail"]
    assert (mail["capacity"], mail["concurrency_limit"], mail["retention_days"]) == (100, 2, 7)
    assert mail["paused"] is True and mail["paused_at"] is not None
    assert queues["default"]["paused"] is False and queues["default"]["paused_at"] is None

    # open jobs only, by queue then claim order (priority, created_at, id)
    expected = [high, tie_a, tie_b, scheduled, running, stuck, low, blocked]
    assert [j["id"] for j in doc["jobs"]] == expected
    jobs = {j["id"]: j for j in doc["jobs"]}
    assert jobs[blocked]["depends_on"] == sorted([low, finished]), "a succeeded dependency too"
    assert jobs[low]["depends_on"] == []
    assert jobs[running]["status"] == "running"
    assert jobs[running]["worker_id"] == "w1" and jobs[running]["attempts"] == 1
    assert jobs[running]["progress"] == {"done": 1}
    assert jobs[low]["priority"] == 5 and jobs[high]["priority"] == -1
    assert jobs[low]["created_at"] == t[0].isoformat()
    assert jobs[blocked]["payload"]["s"] == "h\u00e9llo"
    assert BIG_NUMBER in text, "payloads are written as stored, digit for digit"

    # every field is documented in the schema, and nothing documented is missing
    defs = SCHEMA["$defs"]
    assert set(doc) == set(SCHEMA["properties"])
    assert set(doc["database"]) == set(SCHEMA["properties"]["database"]["properties"])
    for queue in doc["queues"]:
        assert set(queue) == set(defs["queue"]["properties"])
        assert set(queue["depth"]) == set(defs["queue"]["properties"]["depth"]["properties"])
    for job in doc["jobs"]:
        assert set(job) == set(defs["job"]["properties"])


BROKEN: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
    ("other contract", lambda d: d.update(contract="jobsd.snapshot.v2")),
    ("no generated_at", lambda d: d.pop("generated_at")),
    ("local time", lambda d: d.update(generated_at="2026-03-01T13:00:00+01:00")),
    ("terminal job", lambda d: d["jobs"][0].update(status="succeeded")),
    ("unknown state", lambda d: d["jobs"][0].update(status="paused")),
    ("no payload", lambda d: d["jobs"][0].pop("payload")),
    ("text priority", lambda d: d["jobs"][0].update(priority="high")),
    ("bad id", lambda d: d["jobs"][0].update(id="job-1")),
    ("bad dependency", lambda d: d["jobs"][0].update(depends_on=["job-0"])),
    ("text paused", lambda d: d["queues"][0].update(paused="no")),
    ("negative depth", lambda d: d["queues"][0]["depth"].update(queued=-1)),
    ("no running depth", lambda d: d["queues"][0]["depth"].pop("running")),
    ("jobs not a list", lambda d: d.update(jobs={})),
]


def test_broken_documents_fail_validation(
    db_url: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    add_job(conn)
    add_job(conn, born="scheduled")
    out = io.BytesIO()
    write_snapshot(db_url, out)
    good = json.loads(out.getvalue())
    assert schema_errors(good) == [] and validate_snapshot(good) == []

    for name, breaks in BROKEN:
        doc = copy.deepcopy(good)
        breaks(doc)
        assert schema_errors(doc), f"the schema accepts a document with {name}"
        assert validate_snapshot(doc), f"validate_snapshot accepts a document with {name}"

    # what the schema cannot see: the depth disagrees with the jobs listed
    missing = copy.deepcopy(good)
    missing["jobs"].pop()
    assert schema_errors(missing) == []
    assert any("counts 1 scheduled jobs" in p for p in validate_snapshot(missing))

    env = make_env(None)
    good_file, bad_file = tmp_path / "good.json", tmp_path / "bad.json"
    good_file.write_bytes(out.getvalue())
    checked = run_cli("export", "--check", str(good_file), env=env)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout == f"{good_file}: valid {CONTRACT} (1 queues, 2 jobs)\n"
    bad_file.write_text(json.dumps(missing))
    assert "counts 1 scheduled jobs" in error_line(
        run_cli("export", "--check", str(bad_file), env=env)
    )
    bad_file.write_text(out.getvalue().decode()[:-20])
    assert "not valid JSON" in error_line(run_cli("export", "--check", str(bad_file), env=env))


def test_out_replaces_the_target_by_rename(
    db_url: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    target = tmp_path / "snap.json"
    target.write_bytes(b"old contents\n")
    witness = tmp_path / "witness"
    os.link(target, witness)  # a second name for the old file
    add_job(conn)

    done = run_cli("export", "--out", str(target), env=make_env(db_url))
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"exported 1 queues and 1 open jobs to {target}\n"
    doc = json.loads(target.read_text())
    assert schema_errors(doc) == [] and len(doc["jobs"]) == 1
    # renamed over, not rewritten in place: the old file is intact under its other name
    assert witness.read_bytes() == b"old contents\n"
    assert target.stat().st_ino != witness.stat().st_ino
    assert stat.S_IMODE(target.stat().st_mode) == 0o600, "payloads are not world-readable"
    assert leftovers(target) == []

    missing_dir = tmp_path / "nope" / "snap.json"
    line = error_line(run_cli("export", "--out", str(missing_dir), env=make_env(db_url)))
    assert "cannot write" in line and "No such file" in line


def kill_when(proc: Proc, target: Path, ready: Callable[[Path], bool]) -> Path:
    """Wait for the export's temporary file to be ``ready``, then SIGKILL the export."""

    def temporary() -> Path | None:
        assert proc.popen.poll() is None, f"export ended before the kill:\n{proc.text()}"
        found = list(target.parent.glob(f".{target.name}.tmp-{proc.pid}-*"))
        return found[0] if found and ready(found[0]) else None

    path = poll(temporary, what="the export's temporary file", timeout_s=30)
    proc.popen.send_signal(signal.SIGKILL)
    assert proc.wait(10) == -signal.SIGKILL
    return path


def assert_killed_export_left_the_old_snapshot(target: Path, old: bytes, temp: Path) -> None:
    assert target.read_bytes() == old
    assert schema_errors(json.loads(old)) == []
    assert temp.exists(), "kill -9 runs no cleanup: the temporary file stays"
    with pytest.raises(ValueError):
        json.loads(temp.read_bytes())  # only ever a part of a snapshot


EXPORT_WAITING_ON_A_LOCK = (
    "SELECT pid FROM pg_stat_activity WHERE application_name = 'jobsd-export' "
    "AND datname = current_database() AND wait_event_type = 'Lock'"
)


@contextmanager
def slow_database(db_url: str) -> Iterator[None]:
    """Make an export wait, deterministically, after its temporary file is created: its
    jobs query needs this lock."""
    with psycopg.connect(db_url) as locker:
        locker.execute("LOCK TABLE jobsd.job_dependencies IN ACCESS EXCLUSIVE MODE")
        yield
        locker.rollback()


def export_backend(conn: psycopg.Connection[Any]) -> int | None:
    """Return the pid of the export's backend once it waits on the lock."""
    row = conn.execute(EXPORT_WAITING_ON_A_LOCK).fetchone()
    return int(row[0]) if row else None


def test_kill_9_while_blocked_mid_export_keeps_the_old_snapshot(
    db_url: str, conn: psycopg.Connection[Any], tmp_path: Path, spawn: Callable[..., Proc]
) -> None:
    add_job(conn)
    target = tmp_path / "snap.json"
    env = make_env(db_url)
    write_snapshot_file(db_url, target)
    old = target.read_bytes()
    add_job(conn, born="scheduled")

    with slow_database(db_url):
        proc = spawn("export", "--out", str(target), env=env)
        temp = kill_when(proc, target, lambda _: export_backend(conn) is not None)

    assert_killed_export_left_the_old_snapshot(target, old, temp)
    again = run_cli("export", "--out", str(target), env=env)
    assert again.returncode == 0, again.stderr
    doc = json.loads(target.read_text())
    assert validate_snapshot(doc) == [] and len(doc["jobs"]) == 2
    assert leftovers(target) == [temp], "only the killed export's file is left over"


def test_sigterm_mid_export_removes_the_temporary_file_and_keeps_the_old_snapshot(
    db_url: str, conn: psycopg.Connection[Any], tmp_path: Path, spawn: Callable[..., Proc]
) -> None:
    add_job(conn)
    target = tmp_path / "snap.json"
    env = make_env(db_url)
    write_snapshot_file(db_url, target)
    old = target.read_bytes()

    with slow_database(db_url):
        proc = spawn("export", "--out", str(target), env=env)

        def waiting() -> bool:
            assert proc.popen.poll() is None, f"export ended early:\n{proc.text()}"
            return bool(leftovers(target)) and export_backend(conn) is not None

        poll(waiting, what="the export to wait on the lock", timeout_s=30)
        proc.popen.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 128 + signal.SIGTERM

    assert target.read_bytes() == old
    assert leftovers(target) == [], "SIGTERM unwinds: the temporary file is removed"


def test_database_lost_mid_export_removes_the_temporary_file(
    db_url: str, conn: psycopg.Connection[Any], tmp_path: Path, spawn: Callable[..., Proc]
) -> None:
    add_job(conn)
    target = tmp_path / "snap.json"
    target.write_bytes(b"the old snapshot\n")
    with slow_database(db_url):
        proc = spawn("export", "--out", str(target), env=make_env(db_url))
        pid = poll(lambda: export_backend(conn), what="the export to wait on the lock")
        assert leftovers(target), "the temporary file exists while the export waits"
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        assert proc.wait(20) == 1
    errors = [x for x in proc.text().splitlines() if not x.startswith("jobsd: warning:")]
    assert len(errors) == 1 and errors[0].startswith("jobsd: error: export failed:"), errors
    assert target.read_bytes() == b"the old snapshot\n"
    assert leftovers(target) == []


@pytest.mark.heavy
def test_kill_9_mid_stream_of_50k_jobs_keeps_the_old_snapshot(
    db_url: str, conn: psycopg.Connection[Any], tmp_path: Path, spawn: Callable[..., Proc]
) -> None:
    target = tmp_path / "snap.json"
    env = make_env(db_url)
    add_job(conn)
    write_snapshot_file(db_url, target)
    old = target.read_bytes()
    make_jobs(
        conn,
        50_000,
        org_id="acme",
        type="bulk",
        priority=sql.SQL("g % 7"),
        payload=sql.SQL("jsonb_build_object('i', g, 'pad', repeat('x', 100))"),
    )

    proc = spawn("export", "--out", str(target), env=env)
    temp = kill_when(proc, target, lambda p: p.stat().st_size >= 1 << 20)  # 1 MiB written
    assert_killed_export_left_the_old_snapshot(target, old, temp)
    assert temp.read_bytes().startswith(b'{\n  "contract": "jobsd.snapshot.v1"')

    again = run_cli("export", "--out", str(target), env=env)
    assert again.returncode == 0, again.stderr
    assert again.stdout.endswith("1 queues and 50001 open jobs to " + str(target) + "\n")
    # the hand-written checks: the JSON Schema takes ~20 s on 50k jobs (it has its tests)
    assert validate_snapshot(json.loads(target.read_text())) == []


def closed_port() -> int:
    """Return a local TCP port nothing listens on (it was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("case", ["unknown database", "database down", "not migrated"])
def test_database_errors_are_one_line_and_leave_the_target_untouched(
    case: str, db_url: str, empty_db_url: str, tmp_path: Path
) -> None:
    url, fragment = {
        "unknown database": (
            make_conninfo(db_url, dbname="jobsd_no_such_db"),
            'database "jobsd_no_such_db" does not exist',
        ),
        "database down": (
            f"postgresql://postgres@127.0.0.1:{closed_port()}/postgres",
            "database unavailable",
        ),
        "not migrated": (empty_db_url, "run `jobsd migrate`"),
    }[case]
    target = tmp_path / "snap.json"
    target.write_bytes(b"the old snapshot\n")
    line = error_line(run_cli("export", "--out", str(target), env=make_env(url)))
    assert fragment in line
    assert target.read_bytes() == b"the old snapshot\n"
    assert leftovers(target) == []
    assert fragment in error_line(run_cli("export", env=make_env(url)))


def test_no_database_configured(tmp_path: Path) -> None:
    line = error_line(run_cli("export", "--out", str(tmp_path / "s.json"), env=make_env(None)))
    assert "JOBSD_DATABASE_URL" in line
    assert list(tmp_path.iterdir()) == []


def test_a_role_that_sees_one_org_is_refused(db_url: str, conn: psycopg.Connection[Any]) -> None:
    add_job(conn)
    prefix = f"x{uuid.uuid4().hex[:10]}"
    create_roles(db_url, prefix=prefix)
    try:
        as_read = make_conninfo(db_url, user=f"{prefix}_read", options="-c jobsd.org_id=acme")
        line = error_line(run_cli("export", env=make_env(as_read)))
        assert "sees only the jobs of the org" in line
        owner_doc, _ = export_doc(make_conninfo(db_url, user=f"{prefix}_owner"))
        assert len(owner_doc["jobs"]) == 1
    finally:
        drop_roles(db_url, prefix=prefix)
