"""``jobsd demo crash``: the crash demo, end to end, on a real database.

A job publishes an artifact (a file named after the job, written atomically: the
publication is idempotent by the job's stable id, as the original publishing service is);
the daemon then dies hard at a fault point (``JOBSD_FAULT``); a new daemon proves
the owner dead (its lock is free) and rescues the job; the demo prints the job as a
user sees it: status, history, and the published artifact, once.

Two types, one per delivery:

- ``demo_publish`` (``at_least_once``, 2 attempts): the job runs again; publishing
  again finds the artifact there: still one artifact, two publish calls.
- ``demo_publish_once`` (``at_most_once`` with a ``recover`` hook): never run again;
  the hook finds the artifact and the job ends ``succeeded``, reason
  ``recovered_after_publish``; one publish call.

The daemons are ``python -m jobsd run`` subprocesses; their logs go to the workspace.
This module is also the handler module those daemons import
(``JOBSD_HANDLERS=jobsd.dev.crash_demo``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jobsd
from jobsd.errors import JobsdError
from jobsd.models import Job
from jobsd.recovery import AMBIGUOUS, RERUN, Recovery, succeeded

__all__ = ["DemoRun", "run_demo"]

WORKSPACE_ENV = "JOBSD_DEMO_WORKSPACE"
POINTS = ("after_publish", "after_outcome_sent")
TYPES = ("demo_publish", "demo_publish_once")
FAULT_EXIT_CODE = 70  # jobsd.worker.faults.FAULT_EXIT_CODE (jobsd.dev does not load the daemon)
TERMINAL = ("succeeded", "failed", "cancelled")


def _workspace() -> Path:
    return Path(os.environ[WORKSPACE_ENV])


def _artifact(job_id: uuid.UUID | str) -> Path:
    return _workspace() / "published" / f"{job_id}.json"


def _publish(ctx: jobsd.JobContext) -> dict[str, Any]:
    """Publish the job's artifact once (idempotent by job id) and log every call."""
    with open(_workspace() / "publish.log", "a", encoding="utf-8") as log:
        log.write(f"{ctx.id} attempt={ctx.attempt} pid={os.getpid()}\n")
    artifact = _artifact(ctx.id)
    if not artifact.exists():
        artifact.parent.mkdir(parents=True, exist_ok=True)
        tmp = artifact.with_suffix(".tmp")
        tmp.write_text(json.dumps({"job_id": str(ctx.id), "message": ctx.payload}))
        os.replace(tmp, artifact)
    return {"artifact": artifact.name}


def _recover(job: Job) -> Recovery:
    """Look for the artifact: there and readable, the work was done; missing, it was not."""
    artifact = _artifact(job.id)
    if not artifact.exists():
        return RERUN
    try:
        json.loads(artifact.read_text())
    except ValueError:
        return AMBIGUOUS
    return succeeded({"artifact": artifact.name, "found_by": "recover"})


@jobsd.handler("demo_publish", max_attempts=2)
def demo_publish(ctx: jobsd.JobContext) -> dict[str, Any]:
    """Publish (at_least_once: may run again; the publication is idempotent)."""
    return _publish(ctx)


@jobsd.handler("demo_publish_once", delivery="at_most_once", max_attempts=2, recover=_recover)
def demo_publish_once(ctx: jobsd.JobContext) -> dict[str, Any]:
    """Publish (at_most_once: an unknown outcome goes to the recover hook)."""
    return _publish(ctx)


@dataclass(frozen=True, slots=True)
class DemoRun:
    """One job of the demo and what became of it."""

    point: str
    type: str
    job: Job
    history: list[str]
    crash_code: int | None
    artifacts: int
    publish_calls: int


def _daemon_env(url: str, workspace: Path, *, fault: str | None, insecure: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "JOBSD_DATABASE_URL": url,
            "JOBSD_HANDLERS": "jobsd.dev.crash_demo",
            WORKSPACE_ENV: str(workspace),
            "JOBSD_SLOTS": "1",
            "JOBSD_POLL_INTERVAL": "0.3",
            "JOBSD_DEATH_CHECK_INTERVAL": "0.5",
            # a short lease: the crashed daemon's job is rescued within seconds
            "JOBSD_WORKER_LEASE": "2",
            "JOBSD_DRAIN_TIMEOUT": "5",
        }
    )
    env.pop("JOBSD_FAULT", None)
    env.pop("JOBSD_QUEUES", None)
    if fault is not None:
        env.update({"JOBSD_FAULT": fault, "JOBSD_ALLOW_FAULTS": "1"})
    if insecure:
        env["JOBSD_ALLOW_INSECURE"] = "1"
    return env


def _start_daemon(url: str, workspace: Path, name: str, **kw: Any) -> subprocess.Popen[bytes]:
    log = open(workspace / f"{name}.log", "wb")  # noqa: SIM115 - the child owns it
    return subprocess.Popen(
        [sys.executable, "-m", "jobsd", "run"],
        env=_daemon_env(url, workspace, **kw),
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def _wait_for(check: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise JobsdError(f"demo: timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.1)


def run_demo(
    url: str,
    workspace: Path,
    *,
    insecure: bool = False,
    say: Callable[[str], None] = print,
    timeout_s: float = 90.0,
) -> list[DemoRun]:
    """Run the demo: for each fault point and each type, a job publishes, its daemon
    dies at the point, a new daemon recovers it. Return what became of each job."""
    workspace.mkdir(parents=True, exist_ok=True)
    runs: list[DemoRun] = []
    with jobsd.SyncClient(url) as client:
        for point in POINTS:
            for kind in TYPES:
                runs.append(_one(client, url, workspace, point, kind, insecure, say, timeout_s))
    return runs


def _one(
    client: jobsd.SyncClient,
    url: str,
    workspace: Path,
    point: str,
    kind: str,
    insecure: bool,
    say: Callable[[str], None],
    timeout_s: float,
) -> DemoRun:
    job = client.enqueue(kind, {"point": point}, org_id="demo")
    say(f"\n== {kind} dies at {point}: job {job.id}")
    name = f"{point}-{kind}"
    crashing = _start_daemon(url, workspace, f"{name}-1", fault=point, insecure=insecure)
    try:
        code: int | None = crashing.wait(timeout_s)
    except subprocess.TimeoutExpired:
        crashing.kill()
        code = None
    say(f"   daemon 1 (JOBSD_FAULT={point}) exited with code {code}")
    recovering = _start_daemon(url, workspace, f"{name}-2", fault=None, insecure=insecure)
    try:
        _wait_for(lambda: client.get(job.id).status in TERMINAL, f"job {job.id} to end", timeout_s)
    finally:
        recovering.send_signal(signal.SIGTERM)
        recovering.wait(timeout_s)
    return _report(client, point, kind, job.id, code, workspace, say)


def _report(
    client: jobsd.SyncClient,
    point: str,
    kind: str,
    job_id: uuid.UUID,
    code: int | None,
    workspace: Path,
    say: Callable[[str], None],
) -> DemoRun:
    job = client.get(job_id)
    history = [
        f"{e.from_status or '-'} -> {e.to_status} (attempt {e.attempt}"
        + (f", {e.reason}" if e.reason else "")
        + ")"
        for e in client.events(job_id)
    ]
    artifacts = len(list((workspace / "published").glob(f"{job_id}.json")))
    log = workspace / "publish.log"
    calls = sum(1 for line in log.read_text().splitlines() if line.startswith(str(job_id)))
    say(f"   daemon 2 recovered it: {job.status}" + (f" ({job.reason})" if job.reason else ""))
    say(f"   report: {json.dumps(job.report)}")
    say("   history:")
    for line in history:
        say(f"     {line}")
    say(f"   published: {artifacts} artifact, publish called {calls} time(s)")
    return DemoRun(point, kind, job, history, code, artifacts, calls)
