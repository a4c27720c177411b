"""Over a real socket: uvicorn on a loopback port picked at run time, `jobsd api`,
`jobsd run` with JOBSD_HTTP_ADDR, and the token commands."""

from __future__ import annotations

import inspect
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import click
import httpx
import pytest
from apikit import bearer, make_token, running_daemon, served_api, settings_for, wait_until
from click.testing import CliRunner
from test_http_daemon import make_registry

import jobsd.worker.supervisor
from jobsd.cli import main as jobsd_main

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]
LISTENING = re.compile(r"api\.listening addr=(\S+)")


async def test_submit_and_follow_over_a_real_socket(db_url: str, token_a: str) -> None:
    settings = settings_for(db_url)
    async with (
        running_daemon(settings, make_registry()) as daemon,
        served_api(settings, daemon=daemon) as (base_url, _backend),
    ):
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", base_url)
        async with httpx.AsyncClient(base_url=base_url) as client:
            r = await client.post(
                "/jobs", json={"type": "ok", "payload": {"x": 1}}, headers=bearer(token_a)
            )
            assert r.status_code == 202
            job_id = r.json()["id"]
            r = await client.get(f"/jobs/{job_id}?wait=10", headers=bearer(token_a))
            assert r.json()["status"] == "succeeded"
            metrics = (await client.get("/metrics")).text
            assert 'jobsd_jobs_claimed_total{type="ok"} 1.0' in metrics
            assert (await client.get("/readyz")).status_code == 200


async def test_stopping_the_server_answers_pending_long_polls(db_url: str, token_a: str) -> None:
    """Cancelling serve() (what the daemon does at shutdown) answers a pending ?wait=60 at
    once with the current state instead of cutting the connection."""
    settings = settings_for(db_url)
    answers: list[httpx.Response] = []
    async with (
        httpx.AsyncClient() as client,
        anyio.create_task_group() as outer,
        served_api(settings) as (base_url, backend),
    ):
        r = await client.post(f"{base_url}/jobs", json={"type": "t"}, headers=bearer(token_a))
        url = f"{base_url}/jobs/{r.json()['id']}?wait=60"

        async def poll() -> None:
            answers.append(await client.get(url, headers=bearer(token_a)))

        outer.start_soon(poll)
        await wait_until(lambda: _true(backend.waiter.waiting > 0), what="the long-poll")
        started = time.monotonic()
    assert time.monotonic() - started < 3
    assert answers[0].status_code == 200
    assert answers[0].json()["status"] == "queued"


async def _true(value: bool) -> bool:
    return value


def _cli() -> click.Group:
    return jobsd_main


def test_token_commands(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBSD_DATABASE_URL", db_url)
    runner = CliRunner()
    created = runner.invoke(_cli(), ["token", "create", "--org", "acme", "--name", "ci"])
    assert created.exit_code == 0, created.output
    token = created.stdout.strip()
    assert re.fullmatch(r"jobsd_[A-Za-z0-9_-]{43}", token)
    assert "shown only now" in created.stderr
    listed = runner.invoke(_cli(), ["token", "list", "--json"])
    assert token not in listed.stdout
    assert '"org_id": "acme"' in listed.stdout and '"revoked_at": null' in listed.stdout
    token_id = re.search(r'"id": "([0-9a-f-]{36})"', listed.stdout)
    assert token_id is not None
    revoked = runner.invoke(_cli(), ["token", "revoke", token_id.group(1)])
    assert revoked.exit_code == 0 and "revoked" in revoked.stdout
    again = runner.invoke(_cli(), ["token", "revoke", token])  # by the token itself: no-op
    assert again.exit_code == 0
    missing = runner.invoke(_cli(), ["token", "revoke", "not-a-token"])
    assert missing.exit_code == 1
    assert missing.stderr == "jobsd: error: no such token\n"
    monkeypatch.delenv("JOBSD_DATABASE_URL")
    unset = runner.invoke(_cli(), ["token", "create", "--org", "acme"])
    assert unset.exit_code == 1
    assert unset.stderr.startswith("jobsd: error: no database configured")


@pytest.fixture
def cli_script(tmp_path: Path) -> Path:
    script = tmp_path / "jobsd_cli.py"
    script.write_text(
        textwrap.dedent(
            """
            from jobsd.cli import main

            main()
            """
        )
    )
    return script


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        args,
        env={**os.environ, "JOBSD_ALLOW_INSECURE": "1", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


def _address_from_log(proc: subprocess.Popen[str], timeout_s: float = 30) -> str:
    """Read the child's stderr until it logs the address it listens on."""
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        match = LISTENING.search(line)
        if match:
            return match.group(1)
    proc.kill()
    raise AssertionError("no api.listening line:\n" + "".join(seen))


@pytest.fixture
def reaper() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_jobsd_api_serves_alone_and_stops_on_sigterm(
    db_url: str, cli_script: Path, reaper: list[subprocess.Popen[str]]
) -> None:
    token = make_token(db_url, "acme")
    proc = _spawn(
        [sys.executable, str(cli_script), "api"],
        {"JOBSD_DATABASE_URL": db_url, "JOBSD_HTTP_ADDR": "127.0.0.1:0"},
    )
    reaper.append(proc)
    addr = _address_from_log(proc)
    with httpx.Client(base_url=f"http://{addr}", timeout=10) as client:
        r = client.post("/jobs", json={"type": "t"}, headers=bearer(token))
        assert r.status_code == 202, r.text
        assert r.json()["status"] == "queued"  # no worker anywhere: still 202 (ST-1)
        assert client.get("/healthz").status_code == 200
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0


def _daemon_serves_http() -> bool:
    return "jobsd.http" in inspect.getsource(jobsd.worker.supervisor)


@pytest.mark.slow
@pytest.mark.skipif(
    not _daemon_serves_http(),
    reason="the supervisor does not start the API on JOBSD_HTTP_ADDR yet (hook pending)",
)
def test_jobsd_run_with_http_addr_serves_the_api(
    db_url: str, tmp_path: Path, reaper: list[subprocess.Popen[str]]
) -> None:
    (tmp_path / "http_e2e_handlers.py").write_text(
        textwrap.dedent(
            """
            import jobsd

            @jobsd.handler("double")
            async def double(ctx):
                return {"result": ctx.payload["n"] * 2}
            """
        )
    )
    token = make_token(db_url, "acme")
    env: dict[str, Any] = {
        "JOBSD_DATABASE_URL": db_url,
        "JOBSD_HTTP_ADDR": "127.0.0.1:0",
        "JOBSD_HANDLERS": "http_e2e_handlers",
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    proc = _spawn([sys.executable, "-m", "jobsd", "run"], env)
    reaper.append(proc)
    addr = _address_from_log(proc)
    with httpx.Client(base_url=f"http://{addr}", timeout=15) as client:
        r = client.post(
            "/jobs", json={"type": "double", "payload": {"n": 21}}, headers=bearer(token)
        )
        assert r.status_code == 202
        done = client.get(f"/jobs/{r.json()['id']}?wait=10", headers=bearer(token)).json()
        assert done["status"] == "succeeded" and done["report"] == {"result": 42}
        assert client.get("/readyz").json()["checks"]["daemon_listen"] is True
        assert 'jobsd_jobs_claimed_total{type="double"} 1.0' in client.get("/metrics").text
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
