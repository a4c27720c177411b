"""Module-level handlers of the handler-process tests: under the default isolation, the
sync ones run in handler processes (a child imports them by name)."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
from typing import Any

import anyio
from support.processes import MARK_VAR

import jobsd
from jobsd.registry import Registry

REGISTRY = Registry()
_LEAKED: list[bytearray] = []


@jobsd.handler("proc_segv", registry=REGISTRY)
def proc_segv(ctx: jobsd.JobContext) -> None:
    """Read address 0: SIGSEGV."""
    ctypes.string_at(0)


@jobsd.handler("proc_sync", registry=REGISTRY)
def proc_sync(ctx: jobsd.JobContext) -> dict[str, Any]:
    """Work a little; say which process ran it."""
    time.sleep(ctx.payload.get("sleep_s", 0.0))
    return {"pid": os.getpid()}


@jobsd.handler("proc_async", registry=REGISTRY)
async def proc_async(ctx: jobsd.JobContext) -> dict[str, Any]:
    """Work a little in the daemon's loop; say which process ran it."""
    await anyio.sleep(ctx.payload.get("sleep_s", 0.0))
    return {"pid": os.getpid()}


def _start_tools(ctx: jobsd.JobContext) -> None:
    """Start a ``sleep 30`` tool, and one that writes ``effect`` after ``effect_s``."""
    env = {**os.environ, MARK_VAR: ctx.payload["mark"]}
    subprocess.Popen(["sleep", "30"], env=env)
    effect = ctx.payload.get("effect")
    if effect:
        delay = ctx.payload["effect_s"]
        subprocess.Popen(["sh", "-c", f"sleep {delay}; echo landed > {effect}"], env=env)


@jobsd.handler("proc_tools_then_hang", timeout=0.5, registry=REGISTRY)
def proc_tools_then_hang(ctx: jobsd.JobContext) -> None:
    """Start tools, then block past the timeout."""
    _start_tools(ctx)
    ctx.progress(tools="started")
    time.sleep(3600)


@jobsd.handler("proc_tools_left", registry=REGISTRY)
def proc_tools_left(ctx: jobsd.JobContext) -> dict[str, Any]:
    """Start tools and return at once, leaving them running."""
    _start_tools(ctx)
    return {"pid": os.getpid()}


@jobsd.handler("proc_leak", max_child_memory="220MB", registry=REGISTRY)
def proc_leak(ctx: jobsd.JobContext) -> dict[str, Any]:
    """Leak 10 MB a job (written, so resident)."""
    _LEAKED.append(bytearray(b"\x01") * (10 * 1024 * 1024))
    return {"pid": os.getpid(), "leaked_mb": 10 * len(_LEAKED)}


@jobsd.handler("proc_hog", max_child_memory="220MB", registry=REGISTRY)
def proc_hog(ctx: jobsd.JobContext) -> None:
    """Take 400 MB at once and hold it."""
    hog = bytearray(b"\x01") * (400 * 1024 * 1024)
    time.sleep(10)
    del hog


@jobsd.handler("proc_counted", max_jobs_per_child=5, registry=REGISTRY)
def proc_counted(ctx: jobsd.JobContext) -> dict[str, Any]:
    """Say which process ran it."""
    return {"pid": os.getpid()}


@jobsd.handler("proc_until_cancelled", registry=REGISTRY)
def proc_until_cancelled(ctx: jobsd.JobContext) -> None:
    """Say it runs, then block: only a kill stops it."""
    ctx.progress(running=True)
    time.sleep(3600)


@jobsd.handler("async_until_cancelled", registry=REGISTRY)
async def async_until_cancelled(ctx: jobsd.JobContext) -> None:
    """Say it runs, then wait: a cancel stops it."""
    await ctx.progress(running=True)
    await anyio.sleep(3600)


@jobsd.handler("proc_metadata", registry=REGISTRY)
def proc_metadata(ctx: jobsd.JobContext) -> dict[str, Any]:
    """Read a file's metadata with an external tool that prints JSON (as ExifTool does)."""
    script = "import json, os, sys; print(json.dumps([{'size': os.path.getsize(sys.argv[1])}]))"
    result = ctx.run_tool([sys.executable, "-c", script, ctx.payload["path"]], timeout=30)
    result.check()
    return {"metadata": json.loads(result.stdout)[0], "pid": os.getpid()}


@jobsd.handler("proc_missing_tool", registry=REGISTRY)
def proc_missing_tool(ctx: jobsd.JobContext) -> None:
    """Run a program that does not exist."""
    ctx.run_tool(["no-such-tool-here", "-json"])


@jobsd.handler("async_tool_until_cancelled", registry=REGISTRY)
async def async_tool_until_cancelled(ctx: jobsd.JobContext) -> None:
    """Run a long tool from the event loop."""
    env = {**os.environ, MARK_VAR: ctx.payload["mark"]}
    await ctx.progress(running=True)
    await ctx.run_tool_async(["sh", "-c", "sleep 30 & sleep 31"], env=env)
