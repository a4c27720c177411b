"""The sample site examples/newsletter: its own tests (Django's test client with the
``jobsd.testing`` plugin) pass here, on the backport, and on Django 6 with
``django.tasks`` in a fresh environment."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import NEWSLETTER, REPO_ROOT

pytestmark = pytest.mark.timeout(600)

EXPECTED = "4 passed"


def run_example_tests(python: str, admin_url: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBSD_", "DJANGO_"))}
    env["JOBSD_TEST_DATABASE_URL"] = admin_url
    return subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=NEWSLETTER,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_newsletter_examples_tests_pass(admin_url: str) -> None:
    run = run_example_tests(sys.executable, admin_url)

    assert run.returncode == 0, run.stdout + run.stderr
    assert EXPECTED in run.stdout, run.stdout


def _python_312_or_later() -> str | None:
    """A Python of 3.12 or later on this machine (Django 6 needs one), else None."""
    names = [f"python3.{minor}" for minor in range(16, 11, -1)]
    candidates = [shutil.which(name) for name in names]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[2-9]*/bin/python3")))
    for candidate in filter(None, candidates):
        check = subprocess.run(
            [candidate, "-c", "import sys; print(sys.version_info >= (3, 12))"],
            capture_output=True,
            text=True,
        )
        if check.returncode == 0 and check.stdout.strip() == "True":
            return candidate
    return None


def test_the_newsletter_examples_tests_pass_on_django_6(admin_url: str, tmp_path: Path) -> None:
    python = _python_312_or_later()
    if python is None:
        pytest.skip("no Python 3.12 or later on this machine: Django 6 needs one")
    venv = tmp_path / "venv"
    uv = shutil.which("uv") or "uv"
    subprocess.run([uv, "venv", "-q", "--python", python, str(venv)], check=True, timeout=120)
    installed = subprocess.run(
        [
            uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"),
            f"jobsd[server,django,embedded] @ {REPO_ROOT.as_uri()}", "django>=6.0", "pytest",
        ],
        capture_output=True,
        text=True,
        timeout=400,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    version = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import django, django.tasks; print(django.VERSION[0])",
        ],
        capture_output=True,
        text=True,
    )
    assert int(version.stdout.strip()) >= 6, version.stderr

    run = run_example_tests(str(venv / "bin" / "python"), admin_url)

    assert run.returncode == 0, run.stdout + run.stderr
    assert EXPECTED in run.stdout, run.stdout
