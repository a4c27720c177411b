"""Settings from the environment (prefix ``JOBSD_``), one slice per service.

Durations are seconds; a value may also carry a unit: ``500ms``, ``30s``, ``10m``, ``1h``.
Lists are comma-separated: ``JOBSD_HANDLERS=app.jobs,app.crawl``.
"""

from __future__ import annotations

import os
import re
import socket
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

__all__ = ["Settings", "parse_duration"]

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


Duration = Annotated[float, BeforeValidator(parse_duration), Field(gt=0)]
OptionalDuration = Annotated[
    float | None, BeforeValidator(lambda v: None if v in (None, "") else parse_duration(v))
]
CommaList = Annotated[list[str], NoDecode, BeforeValidator(_split_list)]


def _default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"


class Settings(BaseSettings):
    """Everything jobsd reads from ``JOBSD_*`` variables."""

    model_config = SettingsConfigDict(env_prefix="JOBSD_", extra="ignore")

    database_url: str | None = None
    """libpq URL or key=value string; unset means "no database configured"."""

    handlers: CommaList = []
    """Modules to import at start; importing them registers their handlers."""

    queues: CommaList = []
    """Queues this daemon claims from; empty means every queue."""

    slots: int = Field(default=10, ge=1, le=10_000)
    """How many jobs one daemon runs at once."""

    poll_interval: Duration = 1.5
    """Mean time between polls; each wait is jittered to 2/3..4/3 of it (1-2 s by default)."""

    stale_after: Duration = 600.0
    """A running job whose heartbeat is older than this is rescued by the sweeper."""

    heartbeat_interval: Duration = 10.0
    """Time between heartbeats; never more than a third of stale_after."""

    sweep_interval: Duration = 60.0
    """Time between sweeps (one also runs at start)."""

    death_check_interval: Duration = 5.0
    """Time between checks for dead workers (their lock is free): their jobs are rescued."""

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

    isolation: Literal["none", "process"] = "none"
    """Where handlers of types that do not say run: ``none`` (in the daemon) or
    ``process`` (supervised child processes)."""

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

    log_level: str = "INFO"
    log_format: str = "text"
    """``text`` or ``json`` (one object per line)."""

    @field_validator("log_format")
    @classmethod
    def _known_log_format(cls, value: str) -> str:
        if value not in ("text", "json"):
            raise ValueError("log_format must be 'text' or 'json'")
        return value

    @field_validator("stall_after")
    @classmethod
    def _positive_stall(cls, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError("stall_after must be positive")
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
    def effective_heartbeat_s(self) -> float:
        """Return the heartbeat interval, capped at a third of stale_after."""
        return min(self.heartbeat_interval, self.stale_after / 3)
