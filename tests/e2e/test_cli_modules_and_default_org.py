"""``jobsd run MODULE...`` imports the modules named with JOBSD_HANDLERS's, and
``jobsd enqueue`` without --org uses JOBSD_DEFAULT_ORG, or refuses in one line."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from .conftest import Proc, make_env, run_cli, wait_status
from .test_cli import assert_one_line_error

TYPED_MODULE = """
import datetime as dt

from pydantic import BaseModel

import jobsd


class Reminder(BaseModel):
    at: dt.datetime


@jobsd.handler("{kind}")
async def remind(ctx: jobsd.JobContext, reminder: Reminder) -> dict[str, str]:
    return {{"type": type(reminder.at).__name__}}
"""


def _modules(tmp_path: Path, env: dict[str, str], *kinds: str) -> list[str]:
    """Write one typed handler module per kind; return their names."""
    names = []
    for kind in kinds:
        name = f"mod_{kind}"
        (tmp_path / f"{name}.py").write_text(TYPED_MODULE.format(kind=kind))
        names.append(name)
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
    return names


def test_run_imports_the_modules_named_and_those_of_jobsd_handlers(
    db_url: str, conn: psycopg.Connection[Any], tmp_path: Path, spawn: Callable[..., Proc]
) -> None:
    suffix = uuid.uuid4().hex[:6]
    env = make_env(db_url)  # JOBSD_HANDLERS=e2e_handlers
    kinds = [f"a_{suffix}", f"b_{suffix}"]
    names = _modules(tmp_path, env, *kinds)
    ids = []
    for kind in [*kinds, "noop"]:
        enqueued = run_cli(
            "enqueue", kind, "--org", "acme", "--payload", '{"at": "2030-01-01T00:00:00Z"}', env=env
        )
        assert enqueued.returncode == 0, enqueued.stderr
        ids.append(enqueued.stdout.strip())
    daemon = spawn("run", *names, names[0], env=env)  # a module twice is one import
    daemon.wait_ready()
    rows = [wait_status(conn, job_id, "succeeded", "failed") for job_id in ids]
    daemon.send(signal.SIGTERM)
    assert daemon.wait(20) == 0
    assert [r["status"] for r in rows] == ["succeeded"] * 3
    assert [r["report"] for r in rows[:2]] == [{"type": "datetime"}] * 2


def test_run_names_a_module_that_cannot_be_imported(db_url: str, tmp_path: Path) -> None:
    env = make_env(db_url)
    (name,) = _modules(tmp_path, env, "fine")
    result = run_cli("run", name, "no_such_module_here", env=env)
    assert_one_line_error(
        result, "cannot import handler module 'no_such_module_here'", "No module named"
    )


def test_enqueue_without_org_uses_the_default_org_or_refuses(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    refused = run_cli("enqueue", "noop", env=make_env(db_url))
    assert_one_line_error(refused, "no org given: use --org, or set JOBSD_DEFAULT_ORG")
    env = make_env(db_url, JOBSD_DEFAULT_ORG="acme")
    defaulted = run_cli("enqueue", "noop", env=env)
    explicit = run_cli("enqueue", "noop", "--org", "beta", env=env)
    assert defaulted.returncode == 0 and explicit.returncode == 0, defaulted.stderr
    orgs = [
        conn.execute("SELECT org_id FROM jobsd.jobs WHERE id = %s", (r.stdout.strip(),)).fetchone()
        for r in (defaulted, explicit)
    ]
    assert orgs == [("acme",), ("beta",)]
