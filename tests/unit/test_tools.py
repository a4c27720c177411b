"""ctx.run_tool's engine: output, time and processes bounded, bad input refused."""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid

import anyio
import pytest
from support.processes import MARK_VAR, marked

from jobsd.tools import ToolCancelled, ToolFailed, ToolTimeout, run_tool, run_tool_async


def _env(mark: str) -> dict[str, str]:
    return {**os.environ, MARK_VAR: mark}


def _zombies_of_mine() -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if int(ppid) == os.getpid() and state == "Z":
            found.append(int(name))
    return found


def test_a_gigabyte_of_output_is_read_and_counted_not_kept() -> None:
    result = run_tool(["head", "-c", str(10**9), "/dev/zero"], max_output=1000)
    assert (result.returncode, result.stdout_bytes, len(result.stdout)) == (0, 10**9, 1000)
    assert result.stdout_truncated and not result.stderr_truncated
    assert (
        result.describe()
        == "head exited with code 0 (stdout truncated to 1000 of 1000000000 bytes)"
    )


def test_a_tool_that_forks_a_grandchild_and_exits_leaves_nothing() -> None:
    mark = uuid.uuid4().hex
    started = time.monotonic()
    result = run_tool(
        ["sh", "-c", "sleep 30 & echo started; echo oops >&2"], env=_env(mark), kill_grace=0.5
    )
    assert time.monotonic() - started < 5, "the grandchild held the pipe: it was ended"
    assert (result.returncode, result.text, result.stderr) == (0, "started\n", b"oops\n")
    assert marked(mark) == []


def test_past_its_timeout_the_whole_group_ends() -> None:
    mark = uuid.uuid4().hex
    with pytest.raises(ToolTimeout, match=r"sh ran past its timeout of 0\.3 s") as caught:
        run_tool(["sh", "-c", "sleep 30 & sleep 31"], timeout=0.3, env=_env(mark))
    # ended by SIGTERM: the shell killed by it (-15), or the shell reporting that its
    # child was (128 + 15) when the child's death reached it first
    assert caught.value.result.returncode in (-15, 143)
    assert isinstance(caught.value, TimeoutError)
    assert marked(mark) == []


def test_a_cancelled_job_ends_its_tool() -> None:
    mark = uuid.uuid4().hex
    flag = threading.Event()
    threading.Timer(0.3, flag.set).start()
    with pytest.raises(ToolCancelled, match="the job was cancelled"):
        run_tool(["sleep", "30"], env=_env(mark), cancelled=flag.is_set)
    assert marked(mark) == []


def test_a_cancelled_async_handler_ends_its_tool_first() -> None:
    mark = uuid.uuid4().hex

    async def main() -> bool:
        with anyio.move_on_after(0.3) as scope:
            await run_tool_async(["sleep", "30"], env=_env(mark))
        return scope.cancelled_caught

    assert anyio.run(main) is True
    assert marked(mark) == []


def test_exit_codes_cwd_and_check(tmp_path: os.PathLike[str]) -> None:
    result = run_tool(
        [sys.executable, "-c", "import os,sys; print(os.getcwd()); sys.exit(3)"], cwd=tmp_path
    )
    assert (result.returncode, result.text.strip()) == (3, str(tmp_path))
    with pytest.raises(ToolFailed, match=r"exited with code 3"):
        result.check()
    assert run_tool(["true"]).check().returncode == 0


def test_bad_input_is_refused_clearly_and_leaves_no_zombie() -> None:
    with pytest.raises(TypeError, match="argv must be a list of strings, not str"):
        run_tool("ls -l")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="argv must be a non-empty list of strings"):
        run_tool(["ls", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="non-empty"):
        run_tool([])
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        run_tool(["true"], timeout=-1)
    with pytest.raises(ValueError, match="max_output must be a number of bytes"):
        run_tool(["true"], max_output=-5)
    before = _zombies_of_mine()
    with pytest.raises(FileNotFoundError, match="no-such-tool-here"):
        run_tool(["no-such-tool-here", "-v"])
    assert _zombies_of_mine() == before
