"""Settings from the environment (prefix ``JOBSD_``), one slice per service.

Durations are seconds; a value may also carry a unit: ``500ms``, ``30s``, ``10m``, ``1h``.
Lists are comma-separated: ``JOBSD_HANDLERS=app.jobs,app.crawl``.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from jobsd.envsettings import EnvSettings
from jobsd.sizes import parse_size

__all__ = [
    "CREDENTIAL_DATABASE_URL",
    "Settings",
    "credential_database_url",
    "parse_duration",
]

# the systemd credential (LoadCredential=database_url:...) that holds the database URL
CREDENTIAL_DATABASE_URL = "database_url"


def credential_database_url() -> str | None:
    """Return the database URL from the systemd credential ``database_url``, if any.

    systemd puts a unit's credentials (``LoadCredential=``) in ``$CREDENTIALS_DIRECTORY``,
    readable by the service alone and never in its environment, so handlers and their
    children do not inherit the secret. Surrounding whitespace is dropped.
    """
    directory = os.environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        return None
    path = Path(directory) / CREDENTIAL_DATABASE_URL
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the credential {path}: {exc}") from exc
    return text or None


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: Any) -> float:
    """Read seconds from a number or a string such as ``"90"``, ``"1.5s"`` or ``"10m"``."""
    if isinstance(value, int | float):
        return float(value)
    match = _DURATION.match(str(value))
    if match is None:
        raise ValueError(f"not a duration: {value!r} (use seconds, or 500ms, 30s, 10m, 1h)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def _split_list(value: Any) -> Any:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def parse_retention_days(value: Any) -> Any:
    """Read a retention in days: ``"90"`` or ``"90d"``; ``"forever"`` or empty: none."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("", "forever"):
            return None
        if text.endswith("d"):
            text = text[:-1].strip()
        if not text.isdigit():
            raise ValueError(
                f"not a retention: {value!r} (use days, such as 90 or 90d, or forever)"
            )
        return int(text)
    return value


Duration = Annotated[float, BeforeValidator(parse_duration), Field(gt=0)]
RetentionDays = Annotated[Annotated[int, Field(ge=0)] | None, BeforeValidator(parse_retention_days)]
OptionalDuration = Annotated[
    float | None,
    BeforeValidator(lambda v: None if v in (None, "", "none", "None") else parse_duration(v)),
]
CommaList = Annotated[list[str], BeforeValidator(_split_list)]


def _default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"


class Settings(EnvSettings):
    """Everything jobsd reads from ``JOBSD_*`` variables."""

    database_url: str | None = None
    """libpq URL or key=value string; unset means the systemd credential ``database_url``
    (``$CREDENTIALS_DIRECTORY/database_url``), else "no database configured"."""

    read_database_url: str | None = None
    """A streaming replica of that database, for the reads that may lag (the dashboard,
    job listings, ``GET /jobs/{id}`` without ``wait``, ``jobsd top``, ``jobsd export``):
    the primary answers whenever the replica does not (docs/replicas.md). Unset: every
    read goes to the primary. The commands read as the role it names: the owner's, as
    ``JOBSD_DATABASE_URL`` (the API reads as ``JOBSD_API_READ_DATABASE_URL``'s)."""

    handlers: CommaList = Field(default_factory=list)
    """Modules to import at start; importing them registers their handlers."""

    default_org: str | None = None
    """The org of an enqueue that names none (the clients, ``Task.enqueue``, ``jobsd
    enqueue``); unset, such an enqueue is refused. An explicit org always wins."""

    queues: CommaList = Field(default_factory=list)
    """Queues this daemon claims from; empty means every queue."""

    unknown_types: Literal["leave", "fail"] = "leave"
    """Jobs of a type this daemon has no handler for: ``leave`` them queued for a daemon
    that has one (the claim skips them), or claim and ``fail`` them (``unknown type``)."""

    slots: int = Field(default=10, ge=1, le=10_000)
    """How many jobs one daemon runs at once."""

    claim_ahead: int | None = Field(default=None, ge=0, le=10_000)
    """At most this many jobs claimed beyond the free slots, started as slots free
    (unset or 0: claim only for free slots; a job claimed ahead costs a write of its
    row more, docs/decisions.md). Fewer
    while runs last: only as many as the slots start within a tenth of
    ``claim_ahead_max_wait`` at the mean run time. Never a job with a dedup or
    concurrency key, nor of an at-most-once type. Given back, unstarted, on stop:
    docs/decisions.md."""

    claim_ahead_max_wait: Duration = 1.0
    """How long a job claimed ahead may wait while no slot of its daemon frees; then it
    goes back to ``queued`` (reason ``not started``) for another daemon, and claiming
    ahead pauses while runs take more than half of it (docs/decisions.md)."""

    durable_claims: bool = False
    """Every claim waits for its WAL to reach the disk before its jobs start (unset:
    only claims of at-most-once jobs do; a claim lost in a crash of Postgres is a job
    queued again, never one lost: docs/decisions.md)."""

    poll_interval: Duration = 1.5
    """Mean time between polls; each wait is jittered to 2/3..4/3 of it (1-2 s by default)."""

    outcome_stall_after: Duration = 120.0
    """The daemon counts as unhealthy (no watchdog ping) when outcomes have waited this
    long without any being written."""

    stale_after: Duration = 600.0
    """A daemon whose lease ended this long ago while it still holds its lock (a process
    stopped, or cut off from the database) has its running jobs rescued by the others."""

    heartbeat_interval: Duration = 10.0
    """Time between checks of every held job (a lost lease, a cancel request); never
    more than a third of stale_after. Progress is written every progress_interval."""

    sweep_interval: Duration = 60.0
    """Time between sweeps (one also runs at start)."""

    archive_after: Duration = 10.0
    """How long an ended job stays in the hot table before the daemons move it, with
    its history, into the archive (monthly partitions): the hot table holds the open
    jobs and the last seconds' ended ones. Reads find a job wherever it is."""

    archive_interval: Duration = 1.0
    """Time between the daemons' moves into the archive (jittered)."""

    archive_batch: int = Field(default=5000, ge=1, le=100_000)
    """Ended jobs moved per statement; a pass moves batches until one is not full."""

    retention: RetentionDays = None
    """Days an ended job is kept when neither its type nor its queue says otherwise
    (``jobsd prune``: ``90`` or ``90d``); unset or ``forever``: kept forever."""

    death_check_interval: Duration = 5.0
    """Time between checks for dead workers (their lock is free and their lease has run
    out): their jobs are rescued. Also how often a daemon renews its own lease (at most
    a sixth of ``worker_lease``)."""

    worker_lease: Duration = 30.0
    """How long a daemon counts as alive after its last lease renewal, even with its lock
    free. A daemon that cannot renew its lease stops its runs at two thirds of it, and
    exits if a handler will not stop before it ends; a daemon killed outright has its
    jobs rescued within this lease plus a death check."""

    statement_timeout: Duration = 5.0
    """How long a statement of the daemon's own services (claim, heartbeat, completion,
    sweep) may run: the server cancels it then (the pass is retried). Without any
    answer 1 s later the database is unreachable (a partition): ``db.no_answer`` is
    logged; the daemon keeps waiting (a healed link answers at once) up to 6 times
    this, at least 30 s, then drops the connection and retries on a new one."""

    progress_interval: Duration = 1.0
    """Progress reported by handlers is written at most this often, in one batch."""

    drain_timeout: Duration = 30.0
    """On SIGTERM, how long running jobs may take to finish before they are cancelled."""

    notify: bool = True
    """LISTEN for wake-ups; false means poll-only (see `jobsd notify off`)."""

    max_payload_bytes: int = Field(default=1_048_576, ge=2)
    """Largest accepted payload, in bytes of UTF-8 JSON."""

    max_report_bytes: int = Field(default=1_048_576, ge=2)
    """Largest report a handler may return, in bytes of UTF-8 JSON (else the job fails,
    cause ``report too large``)."""

    max_progress_bytes: int = Field(default=1_048_576, ge=2)
    """Largest progress (all fields together) a handler may record, in bytes of UTF-8
    JSON (else the job fails, cause ``progress too large``)."""

    isolation: Literal["auto", "none", "process"] = "auto"
    """Where handlers of types that do not say run: ``auto`` (sync handlers in handler
    processes, async ones in the daemon's event loop), ``process`` (every handler in
    handler processes) or ``none`` (in the daemon: a sync handler in a thread)."""

    max_jobs_per_child: int | None = Field(default=None, ge=1)
    """A handler process is replaced after this many jobs (unset: no limit)."""

    max_child_memory: Annotated[
        int | None,
        BeforeValidator(lambda v: None if v in (None, "", "none", "None") else parse_size(v)),
    ] = None
    """A handler process's memory ceiling (resident size; bytes, or ``512MB``, ``1GiB``):
    past it during a job the process is killed and the job fails (cause ``memory
    limit``); past 80 % of it after a job the process is replaced. Unset: none."""

    default_timeout: OptionalDuration = 3600.0
    """How long a run of a type that gives no ``timeout`` may take before it is ended
    (cause ``timeout``): nothing runs forever by default. ``none`` (or empty): no
    limit for those types. A type's ``timeout`` (``None`` included) overrides it."""

    stall_after: OptionalDuration = None
    """A run that neither returns nor reports progress this long is ended (cause
    ``stalled``); unset: no limit. A type's ``stall_after`` overrides it."""

    kill_grace: Duration = 2.0
    """How long an isolated handler's child has between SIGTERM and SIGKILL."""

    fault: Literal["after_publish", "after_outcome_sent"] | None = None
    """Test only: exit the daemon hard at this point (needs ``JOBSD_ALLOW_FAULTS=1``)."""

    allow_faults: bool = False

    default_max_attempts: int = Field(default=1, ge=1)
    """max_attempts for a type the sweeper has no handler for."""

    pool_size: int = Field(default=4, ge=2, le=100)
    """Connections in the daemon's pool (the LISTEN connection is separate)."""

    worker_id: str = Field(default_factory=_default_worker_id)
    """This daemon's identity in jobs.worker_id and job_events."""

    scheduler: bool = True
    """Run the scheduler of periodic jobs in this daemon (any number of daemons may)."""

    schedules: str | None = None
    """A TOML file of ``[[schedules]]`` tables, read and checked at start."""

    schedule_grace: Duration = 60.0
    """A tick older than this when a scheduler sees it was missed: its catch_up decides."""

    schedule_catch_up_max: int = Field(default=100, ge=1)
    """How many missed ticks ``catch_up="all"`` fires at most (per schedule, per pass)."""

    scheduler_interval: Duration = 10.0
    """Longest wait between scheduler passes (it also wakes at each schedule's next tick)."""

    log_level: str = "INFO"
    log_format: str = "text"
    """``text`` or ``json`` (one object per line)."""

    @field_validator("log_format")
    @classmethod
    def _known_log_format(cls, value: str) -> str:
        if value not in ("text", "json"):
            raise ValueError("log_format must be 'text' or 'json'")
        return value

    @model_validator(mode="after")
    def _url_from_credential(self) -> Settings:
        # JOBSD_DATABASE_URL (or an explicit value) wins; else the systemd credential
        if not self.database_url:
            self.database_url = credential_database_url()
        return self

    @field_validator("stall_after")
    @classmethod
    def _positive_stall(cls, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError("stall_after must be positive")
        return value

    @field_validator("worker_lease")
    @classmethod
    def _lease_long_enough(cls, value: float) -> float:
        if value < 1.0:
            raise ValueError(
                "worker_lease must be at least 1 s: a daemon renews it every sixth of it, "
                "and stops its runs when two thirds pass without a renewal"
            )
        return value

    @model_validator(mode="after")
    def _faults_allowed(self) -> Settings:
        if self.fault is not None and not self.allow_faults:
            raise ValueError(
                f"JOBSD_FAULT={self.fault} is a test fault point: refused unless "
                "JOBSD_ALLOW_FAULTS=1"
            )
        return self

    @property
    def effective_claim_ahead(self) -> int:
        """Return how many jobs the daemon may claim beyond its free slots, at most."""
        return self.claim_ahead or 0

    @property
    def lease_renew_s(self) -> float:
        """Return how often the daemon renews its lease: every death check interval, at
        most a sixth of the lease (four renewals fail before the fence closes)."""
        return min(self.death_check_interval, self.worker_lease / 6)

    @property
    def effective_heartbeat_s(self) -> float:
        """Return the heartbeat interval, capped at a third of stale_after."""
        return min(self.heartbeat_interval, self.stale_after / 3)
