"""Settings of the HTTP API (prefix ``JOBSD_``), read apart from the daemon's.

The database URL, the payload cap and the pool size stay in ``jobsd.settings.Settings``;
this slice holds only what the API adds.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from jobsd.envsettings import EnvSettings
from jobsd.http.ratelimit import Rate
from jobsd.settings import Duration

__all__ = ["HttpSettings", "parse_addr"]

_ADDR = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:\[\]]*)):(?P<port>\d{1,5})$")


def parse_addr(addr: str) -> tuple[str, int]:
    """Split ``host:port`` (or ``[v6]:port``) into a host and a port; port 0 picks a free one."""
    match = _ADDR.match(addr.strip())
    if match is None:
        raise ValueError(f"not an address: {addr!r} (use host:port, e.g. 127.0.0.1:8080)")
    port = int(match.group("port"))
    if port > 65535:
        raise ValueError(f"port out of range in {addr!r}")
    host = match.group("v6") or match.group("host") or "127.0.0.1"
    return host, port


class HttpSettings(EnvSettings):
    """What the HTTP API reads from ``JOBSD_*`` variables."""

    http_addr: str | None = None
    """``host:port`` to serve on; the daemon starts the API only when this is set."""

    api_database_url: str | None = None
    """The API's own database URL (its least-privilege role, ``<prefix>_api``), also for
    the API inside ``jobsd run``; unset: ``JOBSD_DATABASE_URL``. The API refuses to
    start as a role that bypasses row-level security unless ``JOBSD_ALLOW_INSECURE``."""

    api_read_database_url: str | None = None
    """The API's URL of the streaming replica for the reads that may lag, as the API's
    role (``<prefix>_api``: the same role as ``JOBSD_API_DATABASE_URL``, checked the same
    way); unset: ``JOBSD_READ_DATABASE_URL``, and none of them: every read goes to the
    primary (docs/replicas.md)."""

    max_body_bytes: int | None = Field(default=None, ge=1024)
    """Largest request body; unset means twice JOBSD_MAX_PAYLOAD_BYTES plus 64 KiB."""

    submit_rate: str | None = "1000/s"
    """Submissions allowed per token, as ``N/s``, ``N/m`` or ``N/h`` (bursts of N);
    ``off`` means no limit. Over it, ``POST /jobs`` answers 429."""

    read_rate: str | None = "1000/s"
    """Reads (``GET /jobs``, ``GET /jobs/{id}``) allowed per token, as ``submit_rate``;
    ``off`` means no limit. Over it, the read answers 429."""

    http_max_concurrency: int = Field(default=1024, ge=1)
    """Requests the server handles at once (from their complete headers to their
    answer); beyond, 503 with ``Retry-After: 1`` at once. A connection that waits (for
    its headers, or kept alive between requests) takes none, and /healthz and /readyz
    are answered beyond it."""

    http_max_connections_per_peer: int = Field(default=512, ge=0)
    """Connections open at once from one IP address; beyond, a new one is closed as it
    is accepted, before anything is read. 0: no cap. Behind a reverse proxy every
    connection comes from the proxy: set it above the proxy's connections (or 0)."""

    http_header_timeout: Duration = 10.0
    """A connection whose request headers are not complete this long after they began
    (its accept, or the first byte of a later request) is closed."""

    http_body_timeout: Duration = 30.0
    """A request body not complete this long after its headers is cut: the connection
    is closed. A request the API works on (a long-poll) has no such deadline."""

    longpoll_max_concurrent: int = Field(default=256, ge=1)
    """Long-polls (``GET /jobs/{id}?wait=``) open at once, all tokens together; beyond,
    429 at once."""

    longpoll_max_per_token: int = Field(default=32, ge=1)
    """Long-polls open at once per token; beyond, 429 at once."""

    token_cache_s: float = Field(default=1.0, ge=0)
    """A token lookup's answer serves the requests carrying that token for this long
    (one lookup per token and interval under a flood); a revoked token stops working
    within it. 0 looks every request's token up."""

    probe_cache_s: float = Field(default=1.0, ge=0)
    """The probes (/readyz, /health, /metrics) ask the database at most once per this
    interval, whatever the number of callers; the others get the last answer. 0 asks
    at every probe."""

    probe_token: str | None = Field(default=None, repr=False)
    """The bearer token of /metrics and /health (operators, Prometheus); unset, they
    answer 403 unless ``JOBSD_ALLOW_INSECURE``."""

    token_priority_min: int = Field(default=-100, ge=-1_000_000, le=1_000_000)
    """The most urgent priority a token may submit (lower runs first); an operator may
    allow more (down to -1,000,000). Beyond it: 422 ``priority_not_allowed``."""

    token_priority_max: int = Field(default=1_000_000, ge=-1_000_000, le=1_000_000)
    """The least urgent priority a token may submit."""

    max_schedule_ahead: Duration = 3650 * 86400.0
    """How far ahead ``run_after`` may be (default ten years): a job due in the year
    9998 would hold its org's quota and the queue's capacity for good. Beyond it: 422
    ``run_after_too_far``."""

    longpoll_max: Duration = 30.0
    """Longest ``?wait=`` a client gets; longer waits are cut to this."""

    ready_timeout: Duration = 2.0
    """How long /readyz (and each introspection query) may wait for the database."""

    http_shutdown_grace: Duration = 5.0
    """On shutdown, how long open requests may take to finish."""

    health_pickup_lag_warn: Duration = 60.0
    """The health report warns when a queued job has waited longer than this."""

    health_dead_tuples_warn: int = Field(default=100_000, ge=0)
    """The health report warns when the jobs table holds more dead tuples than this."""

    health_xact_age_warn: Duration = 300.0
    """The health report warns when a transaction has been open longer than this."""

    health_notify_queue_warn: float = Field(default=0.5, ge=0, le=1)
    """The health report warns when the NOTIFY queue is fuller than this share."""

    ui: bool = True
    """Serve the dashboard at ``/ui`` (``JOBSD_UI=false`` turns it off: 404)."""

    ui_secret: str | None = Field(default=None, min_length=16)
    """Key that signs dashboard sessions; unset, a random key per process (sessions end
    when it restarts). Set the same value on every API process behind one address."""

    ui_session_ttl: Duration = 8 * 3600.0
    """How long a dashboard login lasts."""

    @field_validator("http_addr")
    @classmethod
    def _valid_addr(cls, value: str | None) -> str | None:
        if value:
            parse_addr(value)
        return value or None

    @field_validator("submit_rate", "read_rate")
    @classmethod
    def _valid_rate(cls, value: str | None) -> str | None:
        if value is None or value.strip().lower() in ("", "off", "none"):
            return None
        return Rate.parse(value).text

    def submit_rate_limit(self) -> Rate | None:
        """Return the submission rate per token, or None (no limit)."""
        return Rate.parse(self.submit_rate) if self.submit_rate else None

    def read_rate_limit(self) -> Rate | None:
        """Return the read rate per token, or None (no limit)."""
        return Rate.parse(self.read_rate) if self.read_rate else None

    def body_limit(self, max_payload_bytes: int) -> int:
        """Return the request body cap in bytes."""
        if self.max_body_bytes is not None:
            return self.max_body_bytes
        return 2 * max_payload_bytes + 65_536
