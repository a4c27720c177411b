"""The command examples of the README and docs/ are run and their output compared, so
the docs cannot drift from the code (issue 14).

A fenced block whose info string is ``console doctest`` is a transcript: ``$ command``
lines, each followed by what it prints (stdout and stderr together). The block runs in
one bash session (shell variables carry from one command to the next) on a fresh
migrated database, with ``JOBSD_ALLOW_INSECURE=1``, whose warning lines are left out of
the comparison. In the expected text ``<id>`` stands for a UUID, ``<time>`` for an ISO
8601 time, and a line ``...`` for any number of lines. Blocks marked plain
``console`` are not run (they need a daemon, curl, or an HTTP server).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO_ROOT

MARK = "@@jobsd-doctest@@"
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TIME = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d:\d\d)?")
_WARNING = re.compile(r"insecure_connection_allowed|allowed by JOBSD_ALLOW_INSECURE")


def doc_blocks() -> list[tuple[str, int, list[tuple[str, list[str]]]]]:
    """Every ``console doctest`` block: (file, line, [(command, expected lines)])."""
    found = []
    for path in [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]:
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            if lines[i].strip() != "```console doctest":
                i += 1
                continue
            start, steps = i + 1, []
            i += 1
            while lines[i].strip() != "```":
                if lines[i].startswith("$ "):
                    steps.append((lines[i][2:], []))
                else:
                    steps[-1][1].append(lines[i])
                i += 1
            found.append((str(path.relative_to(REPO_ROOT)), start, steps))
    return found


def normalize(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        if _WARNING.search(line):
            continue
        line = _TIME.sub("<time>", _UUID.sub("<id>", line))
        out.append(" ".join(line.split()))
    return out


def matches(expected: list[str], actual: list[str]) -> bool:
    """Compare line by line; a ``...`` line matches any number of lines."""
    if not expected:
        return not actual
    if expected[0] == "...":
        return any(matches(expected[1:], actual[k:]) for k in range(len(actual) + 1))
    return bool(actual) and expected[0] == actual[0] and matches(expected[1:], actual[1:])


BLOCKS = doc_blocks()


def test_the_docs_have_tested_examples() -> None:
    assert any(f == "README.md" for f, _, _ in BLOCKS)


@pytest.mark.parametrize("block", BLOCKS, ids=[f"{f}:{n}" for f, n, _ in BLOCKS])
def test_doc_example(block: tuple[str, int, list[tuple[str, list[str]]]], db_url: str) -> None:
    where, line, steps = block
    script = "\n".join(f"echo '{MARK}'\n{command}" for command, _ in steps)
    bindir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBSD_", "PG"))} | {
        "JOBSD_DATABASE_URL": db_url,
        "JOBSD_ALLOW_INSECURE": "1",
        "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    result = subprocess.run(
        ["bash", "-c", f"exec 2>&1\n{script}"],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    outputs = result.stdout.split(f"{MARK}\n")[1:]
    assert len(outputs) == len(steps), result.stdout
    for (command, expected), output in zip(steps, outputs, strict=True):
        got = normalize(output.splitlines())
        want = normalize(expected)
        assert matches(want, got), (
            f"{where}:{line}: `$ {command}` printed\n"
            + "\n".join(got)
            + "\nexpected\n"
            + "\n".join(want)
        )
