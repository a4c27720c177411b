"""The worker child of a side-by-side case: one library's worker in its own process.

    python bench/peer_worker.py LIB URL SETTING [--record FILE]

Imports the library, prints ``ready`` on stdout, waits for a line on stdin, then runs
the library's worker (``libs.<lib>.serve``) until SIGTERM. With ``--record`` each
handler appends ``<i> <CLOCK_MONOTONIC seconds>`` to FILE as its first act, for the
pickup-latency case (the parent stamps its commits with the same clock).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable

from libs import adapter


def _recorder(path: str | None) -> Callable[[int], None]:
    if path is None:
        return lambda i: None
    out = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's life

    def record(i: int) -> None:
        out.write(f"{i} {time.clock_gettime(time.CLOCK_MONOTONIC):.9f}\n")

    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("lib")
    parser.add_argument("url")
    parser.add_argument("setting", choices=("default", "best"))
    parser.add_argument("--record", help="append each handler's start time to this file")
    args = parser.parse_args()
    # BENCH_WORKER_LOG_LEVEL=INFO shows what the worker did (a stall, say), timestamped
    logging.basicConfig(
        level=os.environ.get("BENCH_WORKER_LOG_LEVEL", "WARNING"),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    lib = adapter(args.lib)
    on_start = _recorder(args.record)
    print("ready", flush=True)
    os.dup2(2, 1)  # nothing else goes to the pipe, which the parent no longer reads
    if not sys.stdin.readline():
        return  # the parent went away before saying go
    lib.serve(args.url, lib.SETTINGS[args.setting], on_start)


if __name__ == "__main__":
    main()
