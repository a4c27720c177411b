"""The ``jobsd`` command (and ``python -m jobsd``).

The command line, the daemon and the HTTP API come with the ``server`` extra; an
application installed with ``pip install jobsd`` alone gets a clear message instead of
a traceback.
"""

from __future__ import annotations

import sys

from jobsd.extras import missing_server_libraries


def main() -> None:
    """Run the command line, or explain which extra it needs."""
    missing = missing_server_libraries()
    if missing:
        if sys.argv[1:] == ["--version"]:
            from jobsd import __version__

            print(f"jobsd, version {__version__}")
            return
        sys.stderr.write(
            "jobsd: error: the jobsd command needs the server extra "
            f"({', '.join(missing)} not installed): pip install 'jobsd[server]'\n"
        )
        raise SystemExit(2)
    from jobsd.cli import main as run_command_line

    run_command_line()


if __name__ == "__main__":
    main()
