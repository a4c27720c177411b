"""The main of a handler process: ``python -m jobsd.worker.child PPID KILL_GRACE``.

The daemon (``children.py``) writes one request per line on stdin (the handler as
``module:qualname`` and the job's context); the child runs the handler, sync or async,
and answers on the original stdout, one JSON line per message: ``progress`` as the
handler reports it, then ``result`` or ``error``. Whatever the handler prints goes to
stderr, never into the protocol. The child dies with the daemon (``PR_SET_PDEATHSIG``).
When the daemon set up jobsd's logging, it adds its ``LEVEL FORMAT`` to the arguments:
the child then logs the same way, to the same stderr. Each line logged during a job
carries the job's fields (``jobsd.logs``).

Nothing a handler starts outlives its job: the child is the subreaper of its
descendants (an orphaned tool stays below it), and before it answers it ends every
process still below it (SIGTERM, ``KILL_GRACE``, SIGKILL) and collects them.
"""

from __future__ import annotations

import asyncio
import ctypes
import importlib
import inspect
import json
import os
import signal
import sys
import threading
import traceback
import uuid
from typing import IO, Any

from jobsd.context import JobContext, _Done
from jobsd.errors import InvalidPayload
from jobsd.jsonsafe import encode_object
from jobsd.logs import job_fields, setup_logging
from jobsd.processes import end_processes, members, set_child_subreaper, snapshot

__all__ = ["context_message", "main", "resolve"]

PR_SET_PDEATHSIG = 1
# the arguments of the job's JobContext that a request carries as they are (and the id,
# as text)
_CONTEXT_FIELDS = (
    "type",
    "org_id",
    "queue",
    "payload",
    "attempt",
    "checkpoint",
    "priority",
    "concurrency_key",
    "max_progress_bytes",
)


def die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies; exit if it already did."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the closed pipe still ends the loop
        pass
    if os.getppid() != parent_pid:
        os._exit(1)


def context_message(ctx: JobContext) -> dict[str, Any]:
    """Return ``ctx`` as a request carries it to the child, which builds it again."""
    return {"id": str(ctx.id), **{name: getattr(ctx, name) for name in _CONTEXT_FIELDS}}


def resolve(ref: str) -> Any:
    """Import ``module:qualname`` and return the object it names."""
    module_name, _, qualname = ref.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    # a decorated handler may be wrapped; the registry stores the function itself
    return obj


class _Channel:
    """The protocol stream back to the daemon; one line per message, thread-safe."""

    def __init__(self, out: IO[bytes]) -> None:
        self._out = out
        self._lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode()
        with self._lock:
            self._out.write(data + b"\n")
            self._out.flush()


class ChildContext(JobContext):
    """A JobContext whose progress also goes to the daemon at once."""

    def __init__(self, channel: _Channel, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._channel = channel

    def progress(self, done: int | None = None, total: int | None = None, **fields: Any) -> _Done:
        """Record progress here and send it to the daemon."""
        answer = super().progress(done, total, **fields)
        if done is not None:
            fields["done"] = done
        if total is not None:
            fields["total"] = total
        self._channel.send({"op": "progress", "fields": fields})
        return answer


def _reap_children() -> bool:
    """Collect exited children; say whether any child is left (alive or not yet
    collected). One call when the handler left nothing."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def end_leftovers(grace_s: float) -> int:
    """End every process the handler left running below this one; return how many.

    The child is its descendants' subreaper: while any lives, a child of its own does.
    """
    if not _reap_children():
        return 0
    me = os.getpid()
    return end_processes(
        lambda: members(snapshot(), roots=[me]),
        grace_s,
        reap=_reap_children,
    )


def _run(channel: _Channel, request: dict[str, Any], grace_s: float) -> None:
    raw = request["ctx"]
    # the lines logged during the job carry it, as in the daemon; none after it
    with job_fields(raw["id"], raw["type"], raw["attempt"], raw["queue"], raw["org_id"]):
        message = _outcome(channel, request)
    left = end_leftovers(grace_s)
    if left:
        print(f"jobsd: ended {left} process(es) the handler left running", file=sys.stderr)
    channel.send(message)


def _outcome(channel: _Channel, request: dict[str, Any]) -> dict[str, Any]:
    """Run the request's handler; return the message that says how it ended."""
    raw = request["ctx"]
    try:
        func = resolve(request["func"])
        ctx = ChildContext(
            channel, id=uuid.UUID(raw["id"]), **{name: raw[name] for name in _CONTEXT_FIELDS}
        )
        result = asyncio.run(func(ctx)) if inspect.iscoroutinefunction(func) else func(ctx)
    except BaseException as exc:  # reported to the daemon, whatever it is
        return {
            "op": "error",
            "message": f"{type(exc).__name__}: {exc}",
            "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
            "traceback": "".join(traceback.format_exception(exc)),
            "mro": [f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__],
        }
    if result is None:
        return {"op": "result", "report": None}
    try:
        text = encode_object(result, what="handler result", max_bytes=None)
    except InvalidPayload as exc:
        return {"op": "invalid", "message": str(exc)}
    return {"op": "result", "report": json.loads(text)}


def main(argv: list[str]) -> None:
    """Serve requests until stdin closes."""
    die_with_parent(int(argv[0]))
    grace_s = float(argv[1]) if len(argv) > 1 else 2.0
    if len(argv) > 3:  # the daemon's logging (jobsd.logs.installed): the same here
        setup_logging(argv[2], argv[3])
    set_child_subreaper()
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # prints of handlers go to stderr, not into the protocol
    channel = _Channel(out)
    channel.send({"op": "ready", "pid": os.getpid()})
    for line in sys.stdin.buffer:
        if line.strip():
            _run(channel, json.loads(line), grace_s)


if __name__ == "__main__":
    main(sys.argv[1:])
