"""The wheel as a user installs it: alone for an application, with ``[server]`` to run.

The wheel and sdist are built from this checkout and checked as an index would
(``twine check --strict``); each test installs the wheel into a fresh virtual
environment, pinned to ``uv.lock``'s versions, and runs it from outside the checkout.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import psycopg
import pytest
from support.proc import Proc

REPO_ROOT = Path(__file__).resolve().parents[2]
UV = shutil.which("uv")
VERSION = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
# what the README promises: `pip install jobsd` brings at most this many distributions
CORE_DEPENDENCIES_MAX = 8
# the import names of the libraries of the extras: none of them in a client-only install
EXTRA_LIBRARIES = {
    "anyio",
    "click",
    "cronsim",
    "fastapi",
    "jinja2",
    "opentelemetry",
    "pgserver",
    "prometheus_client",
    "rich",
    "sqlalchemy",
    "starlette",
    "tenacity",
    "uvicorn",
}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(UV is None, reason="uv builds the wheel and the environments"),
]


def _run(*args: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=300, **kwargs
    )  # type: ignore[call-overload]
    assert result.returncode == 0, f"{args}:\n{result.stdout}\n{result.stderr}"
    return result  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the wheel and the sdist, and check both as an index would."""
    out = tmp_path_factory.mktemp("dist")
    assert UV is not None
    _run(UV, "build", "--quiet", "--out-dir", out, REPO_ROOT)
    built = sorted(out.glob("jobsd-*"))
    assert [p.name for p in built] == [
        f"jobsd-{VERSION}-py3-none-any.whl",
        f"jobsd-{VERSION}.tar.gz",
    ], built
    _run(sys.executable, "-m", "twine", "check", "--strict", *built)
    return out / f"jobsd-{VERSION}-py3-none-any.whl"


@pytest.fixture(scope="module")
def pins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Pin every distribution to uv.lock's version (installed from uv's cache)."""
    path = tmp_path_factory.mktemp("pins") / "constraints.txt"
    assert UV is not None
    _run(
        UV, "export", "--frozen", "--all-extras", "--no-dev", "--no-hashes",
        "--no-emit-project", "--quiet", "-o", path, cwd=REPO_ROOT,
    )  # fmt: skip
    return path


def _install(wheel: Path, pins: Path, venv: Path, extras: str = "") -> Path:
    assert UV is not None
    _run(UV, "venv", "--quiet", "--python", sys.executable, venv)
    python = venv / "bin" / "python"
    _run(UV, "pip", "install", "--quiet", "--python", python, f"{wheel}{extras}", "-c", pins)
    return venv / "bin"


def _clean_env(workdir: Path, **values: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("JOBSD_", "PYTHON", "VIRTUAL_ENV", "UV_"))
    }
    env["TMPDIR"] = str(workdir)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(values)
    return env


APPLICATION = """
import asyncio, json, sys
import jobsd

with jobsd.SyncClient() as client:
    queued = client.enqueue("send_receipt", {"order": 42}, org_id="acme")
    seen = client.get(queued.id, org_id="acme")

async def main():
    async with jobsd.Client() as client:
        other = await client.enqueue("send_receipt", {"order": 43}, org_id="acme")
        outcome = await client.cancel(other.id, org_id="acme")
        return str(other.id), outcome.job.status.value

other_id, other_status = asyncio.run(main())
print(json.dumps({
    "id": str(queued.id), "status": seen.status.value,
    "other": other_id, "other_status": other_status,
    "jobsd": jobsd.__file__, "version": jobsd.__version__,
    "modules": sorted({m.split(".")[0] for m in sys.modules}),
}))
"""


def test_the_wheel_alone_installs_few_distributions_and_enqueues(
    dist: Path, pins: Path, shared_tmp: Path, db_url: str
) -> None:
    bin_dir = _install(dist, pins, shared_tmp / "venv")
    assert UV is not None
    listed = _run(UV, "pip", "list", "--python", bin_dir / "python", "--format", "json")
    names = {entry["name"].lower() for entry in json.loads(listed.stdout)}
    dependencies = sorted(names - {"jobsd"})
    assert "jobsd" in names
    assert len(dependencies) <= CORE_DEPENDENCIES_MAX, dependencies
    assert {name.replace("-", "_") for name in dependencies}.isdisjoint(EXTRA_LIBRARIES)

    script = shared_tmp / "app.py"
    script.write_text(APPLICATION)
    env = _clean_env(shared_tmp, JOBSD_DATABASE_URL=db_url, JOBSD_ALLOW_INSECURE="1")
    ran = _run(bin_dir / "python", script, env=env, cwd=shared_tmp)
    seen = json.loads(ran.stdout.strip().splitlines()[-1])
    assert seen["jobsd"].startswith(str(shared_tmp / "venv")), "the wheel's jobsd, not the checkout"
    assert seen["version"] == VERSION
    assert (seen["status"], seen["other_status"]) == ("queued", "cancelled")
    assert EXTRA_LIBRARIES.isdisjoint(seen["modules"]), seen["modules"]
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id::text, type, payload, status FROM jobsd.jobs ORDER BY id"
        ).fetchall()
    assert rows == [
        (seen["id"], "send_receipt", {"order": 42}, "queued"),
        (seen["other"], "send_receipt", {"order": 43}, "cancelled"),
    ]

    version = _run(bin_dir / "jobsd", "--version", env=env, cwd=shared_tmp)
    assert version.stdout.strip() == f"jobsd, version {VERSION}"
    refused = subprocess.run(
        [bin_dir / "jobsd", "status"], env=env, cwd=shared_tmp, capture_output=True, text=True
    )
    assert refused.returncode == 2
    assert "pip install 'jobsd[server]'" in refused.stderr
    assert "Traceback" not in refused.stderr


def _banner_commands(text: str) -> list[list[str]]:
    """Return the commands the banner offers to run in another terminal."""
    commands = []
    for line in text.splitlines():
        if re.match(r"^    (jobsd|JOBSD_\w+=\S+ jobsd) ", line):
            commands.append(shlex.split(line))
    return commands


def test_the_server_extra_runs_jobsd_dev_and_the_banner_s_commands_work(
    dist: Path, pins: Path, shared_tmp: Path
) -> None:
    bin_dir = _install(dist, pins, shared_tmp / "venv", "[server]")
    env = _clean_env(shared_tmp, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    version = _run(bin_dir / "jobsd", "--version", env=env, cwd=shared_tmp)
    assert version.stdout.strip() == f"jobsd, version {VERSION}"

    dev = Proc([str(bin_dir / "jobsd"), "dev", "--no-examples"], env, cwd=shared_tmp)
    try:
        url = dev.wait_for(r"^\s+(postgresql://\S+)$", timeout_s=90).group(1)
        dev.wait_for(r"Stop with Ctrl-C")
        banner = dev.text()
        export = re.search(r"export (.+)$", banner, re.MULTILINE)
        assert export is not None, banner
        client_env = dict(env)
        for assignment in shlex.split(export.group(1)):
            key, _, value = assignment.partition("=")
            client_env[key] = value
        assert client_env["JOBSD_DATABASE_URL"] == url

        commands = _banner_commands(banner)
        assert [c[:2] for c in commands] == [
            ["jobsd", "enqueue"],
            ["jobsd", "enqueue"],
            ["jobsd", "status"],
            ["JOBSD_HANDLERS=jobsd.dev.examples", "jobsd"],
        ], commands
        imported = _run(*commands[0], env=client_env, cwd=shared_tmp)
        import_id = uuid.UUID(imported.stdout.strip())
        failed = subprocess.run(
            commands[1], env=client_env, cwd=shared_tmp, capture_output=True, text=True, timeout=60
        )
        assert failed.returncode != 0 and "this job always fails" in failed.stderr, failed
        status = _run(*commands[2][:2], str(import_id), env=client_env, cwd=shared_tmp)
        assert str(import_id) in status.stdout and "succeeded" in status.stdout, status.stdout

        # the second daemon of the crash walk-through starts from the wheel as well
        key, _, value = commands[3][0].partition("=")
        second = Proc(
            [str(bin_dir / "jobsd"), *commands[3][2:]], client_env | {key: value}, cwd=shared_tmp
        )
        try:
            second.wait_for(r"\bdaemon\.ready\b", timeout_s=60)
            second.send(signal.SIGTERM)
            assert second.wait(30) == 0
        finally:
            second.kill()
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT status, report->>'inserted' FROM jobsd.jobs WHERE id = %s", (import_id,)
            ).fetchone()
        assert row == ("succeeded", "3000")
    finally:
        dev.send(signal.SIGINT)
        code = dev.wait(30)
        dev.kill()
    assert code == 0, dev.text()[-4000:]
    assert "Traceback" not in dev.text()
