"""The command examples of the README and docs/ are run and their output compared, so
the docs cannot drift from the code (issue 14).

A fenced block whose info string is ``console doctest`` is a transcript: ``$ command``
lines, each followed by what it prints (stdout and stderr together). The doctest blocks
of one file run in order in one bash session (shell variables carry from one command,
and one block, to the next) on a fresh database of their own: an empty one when the
file's first command is ``jobsd migrate`` (the docs show a first migration), a migrated
one otherwise. ``JOBSD_ALLOW_INSECURE=1`` is set, and its warning lines are left out of
the comparison. A fenced block whose info string ends in ``file=NAME`` (``sql
file=setup.sql``) is written to NAME in the session's directory first.

In the comparison a UUID stands for any UUID, an ISO 8601 time for any time, a token
for any token, seconds with decimals (``0.01 s``, ``"seconds": 0.008``) for any
duration, ``cli:<user>`` for the user running the commands, the port of 127.0.0.1 or
localhost for any port; a line ``...`` matches any number of lines (``applied
0001_jobs`` then ``...`` is every migration, however many there are). Blocks marked
plain ``console`` are not run (they need a daemon, curl, or an HTTP server).

Each ``jobsd`` of a session runs in a fork of one process that imported jobsd once
(``serve`` below, started with ``python test_docs_examples.py serve SOCKET``): the
``jobsd`` on the session's PATH hands its arguments, environment, directory and
standard streams over a unix socket, and exits with the command's status. A command
still runs as the installed script would, in a process of its own that exits through
the interpreter's shutdown; only the start is shared. The start costs 1 to 3 s on the
2-core CI machine, and the docs hold about 50 commands.
"""

from __future__ import annotations

import gc
import getpass
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
MARK = "@@jobsd-doctest@@"
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_CLI_USER = re.compile(r"\bcli:" + re.escape(getpass.getuser()) + r"\b")
_TIME = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d:\d\d)?")
_TOKEN = re.compile(r"\bjobsd_[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])|\bjobsd_[A-Za-z0-9_-]*…")
_SECONDS = re.compile(r"\b\d+\.\d+ s\b|(?<=\"seconds\": )\d+(\.\d+)?")
_PORT = re.compile(r"(?<=127\.0\.0\.1:)\d+|(?<=localhost:)\d+")
_WARNING = re.compile(r"insecure_connection_allowed|allowed by JOBSD_ALLOW_INSECURE")
_FILE_FENCE = re.compile(r"```\w*\s+file=(\S+)$")


@dataclass
class Step:
    """One ``$ command`` of a transcript and the lines it prints."""

    line: int
    command: str
    expected: list[str] = field(default_factory=list)


@dataclass
class DocFile:
    """The doctest blocks of one file, in order, and the files they use."""

    path: str
    steps: list[Step]
    files: dict[str, str]


def doc_files() -> list[DocFile]:
    """Every README.md or docs/*.md that has ``console doctest`` blocks."""
    found = []
    for path in [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]:
        lines = path.read_text().splitlines()
        steps: list[Step] = []
        files: dict[str, str] = {}
        i = 0
        while i < len(lines):
            fence = lines[i].strip()
            i += 1
            if not fence.startswith("```"):
                continue
            body_start = i
            while lines[i].strip() != "```":
                i += 1
            body = lines[body_start:i]
            i += 1
            if fence == "```console doctest":
                for n, line in enumerate(body, start=body_start + 1):
                    if line.startswith("$ "):
                        steps.append(Step(n, line[2:]))
                    else:
                        steps[-1].expected.append(line)
            elif named := _FILE_FENCE.fullmatch(fence):
                files[named.group(1)] = "\n".join(body) + "\n"
        if steps:
            found.append(DocFile(str(path.relative_to(REPO_ROOT)), steps, files))
    return found


def normalize(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        if _WARNING.search(line):
            continue
        line = _TIME.sub("<time>", _UUID.sub("<id>", _CLI_USER.sub("cli:<user>", line)))
        line = _PORT.sub("<port>", _SECONDS.sub("<seconds>", _TOKEN.sub("<token>", line)))
        out.append(" ".join(line.split()))
    return out


def matches(expected: list[str], actual: list[str]) -> bool:
    """Compare line by line; a ``...`` line matches any number of lines."""
    if not expected:
        return not actual
    if expected[0] == "...":
        return any(matches(expected[1:], actual[k:]) for k in range(len(actual) + 1))
    return bool(actual) and expected[0] == actual[0] and matches(expected[1:], actual[1:])


DOCS = doc_files()


def test_the_docs_have_tested_examples() -> None:
    tested = {doc.path for doc in DOCS}
    assert {"README.md", "docs/queues.md", "docs/retention.md", "docs/api.md"} <= tested


# the command's side: the `jobsd` on the sessions' PATH (no site: it starts in ~20 ms)
_CLIENT = """#!{python} -S
import json, os, socket, sys

conn = socket.socket(socket.AF_UNIX)
conn.connect({socket_path!r})
socket.send_fds(conn, [b"."], [0, 1, 2])
request = {{"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}}
conn.sendall(json.dumps(request).encode())
conn.shutdown(socket.SHUT_WR)
answer = b""
while chunk := conn.recv(64):
    answer += chunk
code = int(answer or b"-1")  # no answer: the command's process was lost
sys.exit(128 - code if code < 0 else code)
"""


@pytest.fixture(scope="module")
def jobsd_bin() -> Iterator[Path]:
    """Start the commands' server; yield a directory whose ``jobsd`` runs in it."""
    tmp = Path(tempfile.mkdtemp(prefix="jobsd-docs-"))
    socket_path = str(tmp / "jobsd.sock")
    server = subprocess.Popen(
        [sys.executable, __file__, "serve", socket_path],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its group: the server and every command it forked
    )
    try:
        assert server.stdout is not None
        assert server.stdout.readline() == "ready\n", "the commands' server did not start"
        script = tmp / "jobsd"
        script.write_text(_CLIENT.format(python=sys.executable, socket_path=socket_path))
        script.chmod(0o755)
        yield tmp
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.parametrize("doc", DOCS, ids=[doc.path for doc in DOCS])
def test_doc_examples(doc: DocFile, jobsd_bin: Path, request: pytest.FixtureRequest) -> None:
    fresh = doc.steps[0].command == "jobsd migrate"
    db_url = request.getfixturevalue("empty_db_url" if fresh else "db_url")
    # the mark between two commands keeps the status of the first: `echo $?` works
    script = f"_mark() {{ local status=$?; echo '{MARK}'; return $status; }}\n" + "\n".join(
        f"_mark\n{step.command}" for step in doc.steps
    )
    bindir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBSD_", "PG"))} | {
        "JOBSD_DATABASE_URL": db_url,
        "JOBSD_ALLOW_INSECURE": "1",
        "PATH": os.pathsep.join([str(jobsd_bin), str(bindir), os.environ.get("PATH", "")]),
        "PSQLRC": os.devnull,  # psql's tables as the docs show them
    }
    with tempfile.TemporaryDirectory(prefix="jobsd-doc-") as cwd:
        for name, text in doc.files.items():
            Path(cwd, name).write_text(text)
        result = subprocess.run(
            ["bash", "-c", f"exec 2>&1\n{script}"],
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
    outputs = result.stdout.split(f"{MARK}\n")[1:]
    assert len(outputs) == len(doc.steps), result.stdout
    failures = []
    for step, output in zip(doc.steps, outputs, strict=True):
        got = normalize(output.splitlines())
        want = normalize(step.expected)
        if not matches(want, got):
            failures.append(
                f"{doc.path}:{step.line}: `$ {step.command}` printed\n"
                + "\n".join(got)
                + "\nexpected\n"
                + "\n".join(want)
            )
    assert not failures, "\n\n".join(failures)


def serve(socket_path: str) -> list[str]:
    """Serve ``jobsd`` commands: import jobsd once, then fork a process per command.

    Returns only in a command's process, with its arguments (the caller runs the
    command there): its standard streams, directory and environment are the client's.
    A command runs next to the others; the process in between waits for it and
    answers its exit status.
    """
    import jobsd.admin.retention
    import jobsd.cli.app
    import jobsd.store.migrate  # noqa: F401  (what the commands import lazily, once)

    gc.freeze()  # a command's exit then skips the inherited objects: 0.3 s less each
    sys.path[0] = str(Path(sys.executable).parent)  # as for the installed script
    server = socket.socket(socket.AF_UNIX)
    server.bind(socket_path)
    server.listen(16)
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        if os.fork() == 0:
            server.close()
            return _run_for(conn)
        conn.close()
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass


def _run_for(conn: socket.socket) -> list[str]:
    """Take one command: fork its process, and answer its exit status when it ends."""
    _, fds, _, _ = socket.recv_fds(conn, 1, 3)
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    request = json.loads(data)
    pid = os.fork()
    if pid == 0:
        conn.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        return list(request["argv"])
    for fd in fds:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    conn.sendall(str(os.waitstatus_to_exitcode(status)).encode())
    os._exit(0)


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    sys.argv = ["jobsd", *serve(sys.argv[2])]
    from jobsd.cli import main

    main()
