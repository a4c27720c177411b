"""A sync handler that starts tools and hangs, for the kill -9 test of handler processes
(``JOBSD_HANDLERS=tool_handlers``); under the default isolation it runs in a child."""

from __future__ import annotations

import os
import subprocess
import time

import jobsd


@jobsd.handler("tools_then_hang")
def tools_then_hang(ctx: jobsd.JobContext) -> None:
    """Start a ``sleep 30`` tool and a shell that forks one more, mark them, then hang."""
    env = {**os.environ, "JOBSD_TEST_MARK": ctx.payload["mark"]}
    subprocess.Popen(["sleep", "30"], env=env)
    subprocess.Popen(["sh", "-c", "sleep 30 & sleep 31; wait"], env=env)
    ctx.progress(tools="started")
    time.sleep(3600)


@jobsd.handler("async_tool_then_hang")
async def async_tool_then_hang(ctx: jobsd.JobContext) -> None:
    """Run a tool that forks one more from the daemon's event loop (``run_tool_async``)."""
    env = {**os.environ, "JOBSD_TEST_MARK": ctx.payload["mark"]}
    await ctx.progress(tools="started")
    await ctx.run_tool_async(["sh", "-c", "sleep 30 & sleep 31"], env=env)
