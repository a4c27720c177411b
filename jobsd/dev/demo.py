"""What ``jobsd dev`` adds for a first look: the dashboard's address, a login token, and a
trickle of example jobs so the overview has something to show."""

from __future__ import annotations

import logging
import os
import socket
import threading

__all__ = [
    "DEMO_ORG",
    "ExampleFeeder",
    "dashboard_addr",
    "dashboard_token",
    "dashboard_url",
    "revoke_dashboard_token",
]

log = logging.getLogger(__name__)

DEMO_ORG = "demo"
DEFAULT_PORT = 8080


def _free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def dashboard_addr() -> str:
    """Return ``JOBSD_HTTP_ADDR``, setting it first when unset: 127.0.0.1:8080, or a free port.

    The daemon serves the API (and /ui) on it.
    """
    addr = os.environ.get("JOBSD_HTTP_ADDR")
    if not addr:
        port = DEFAULT_PORT
        if not _free("127.0.0.1", port):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
        addr = f"127.0.0.1:{port}"
        os.environ["JOBSD_HTTP_ADDR"] = addr
    return addr


def dashboard_url(addr: str) -> str:
    """Return the URL of /ui served on ``addr``."""
    from jobsd.http.settings import parse_addr

    host, port = parse_addr(addr)
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/ui"


def dashboard_token(url: str) -> str:
    """Create an admin token of org ``demo`` to log in to the dashboard; return it."""
    from jobsd.ops import Caller
    from jobsd.ops.tokens import create_token
    from jobsd.store.connect import connect

    with connect(url, application_name="jobsd-dev", operation="dashboard token") as conn:
        token, _ = create_token(
            conn, Caller.as_operator("dev"), None, "jobsd dev dashboard", admin=True
        )
    return token


def revoke_dashboard_token(url: str, token: str) -> None:
    """Revoke the run's token (best effort: the database may be gone already)."""
    from jobsd.errors import JobsdError
    from jobsd.ops import Caller
    from jobsd.ops.tokens import revoke_token
    from jobsd.store.connect import connect

    try:
        with connect(url, application_name="jobsd-dev", operation="dashboard token") as conn:
            revoke_token(conn, Caller.as_operator("dev"), token)
    except JobsdError as exc:
        log.warning("dev.token_not_revoked", extra={"error": str(exc)})


class ExampleFeeder:
    """Enqueue example jobs of org ``demo`` now and then, in a thread, until stopped.

    Every ``interval_s``: a map_reconcile; every 5th tick an import_csv (a few seconds
    of visible progress); every 15th an always_fails. Enqueue errors are logged and
    the next tick tries again.
    """

    def __init__(self, url: str, interval_s: float = 2.0) -> None:
        self.url = url
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jobsd-dev-examples", daemon=True)

    def start(self) -> None:
        """Start enqueuing."""
        self._thread.start()

    def stop(self) -> None:
        """Stop enqueuing and wait for the thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        from jobsd.client import SyncClient
        from jobsd.errors import JobsdError

        tick = 0
        with SyncClient(self.url) as client:
            while not self._stop.wait(self.interval_s if tick else 0.5):
                try:
                    client.enqueue("map_reconcile", {"target_id": tick}, org_id=DEMO_ORG)
                    if tick % 5 == 0:
                        client.enqueue(
                            "import_csv", {"rows": 3000, "delay_s": 0.2}, org_id=DEMO_ORG
                        )
                    if tick % 15 == 7:
                        client.enqueue(
                            "always_fails", {"message": "demo: this job fails"}, org_id=DEMO_ORG
                        )
                except JobsdError as exc:
                    log.warning("dev.example_enqueue_failed", extra={"error": str(exc)})
                tick += 1
