"""The SQLAlchemy side of jobsd: table definitions to read and join, and enqueue in a Session.

The tables mirror ``sql/migrations`` (a test compares them with the real schema); they
are for reading and joining in a host app, not for creating the schema: run
``jobsd migrate`` for that, since the triggers that write the history and send the
wake-ups exist only in the migrations.

``enqueue`` joins the Session's current transaction: nothing is committed by jobsd, so
the job exists exactly when the app's own rows do. It needs the psycopg (v3) driver,
e.g. an engine URL ``postgresql+psycopg://...``.
"""

from __future__ import annotations

from typing import Any, Unpack

import psycopg
from sqlalchemy import (
    TIMESTAMP,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    column,
    table,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Session

from jobsd.errors import ConfigError
from jobsd.jobspec import EnqueueOptions, JobSpec
from jobsd.models import Job, JobStatus
from jobsd.settings import Settings
from jobsd.store.enqueue import enqueue_sync

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "all_job_events",
    "enqueue",
    "job_events",
    "jobs",
    "metadata",
    "queues",
]

DEFAULT_MAX_PAYLOAD_BYTES: int = Settings.model_fields["max_payload_bytes"].default

metadata = MetaData(schema="jobsd")

_TIMESTAMPTZ = TIMESTAMP(timezone=True)
_STATUSES = ", ".join(f"'{s.value}'" for s in JobStatus)

queues = Table(
    "queues",
    metadata,
    Column("name", Text, primary_key=True),
    Column("created_at", _TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    # 0008_flow_control
    Column("capacity", Integer),
    Column("concurrency_limit", Integer),
    Column("retention_days", Integer),
    Column("paused_at", _TIMESTAMPTZ),
    # per-org limits (migration 0012)
    Column("org_running_limit", Integer),
    Column("org_open_limit", Integer),
    CheckConstraint(r"name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$'", name="queues_name_check"),
    CheckConstraint("capacity > 0", name="queues_capacity_check"),
    CheckConstraint("concurrency_limit > 0", name="queues_concurrency_limit_check"),
    CheckConstraint("retention_days >= 0", name="queues_retention_days_check"),
    CheckConstraint("org_running_limit > 0", name="queues_org_running_limit_check"),
    CheckConstraint("org_open_limit > 0", name="queues_org_open_limit_check"),
)

jobs = Table(
    "jobs",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True, server_default=text("jobsd.uuidv7()")),
    Column("org_id", Text, nullable=False),
    Column("type", Text, nullable=False),
    Column(
        "queue",
        Text,
        ForeignKey("jobsd.queues.name", name="jobs_queue_fkey"),
        nullable=False,
        server_default=text("'default'"),
    ),
    Column("status", Text, nullable=False, server_default=text("'queued'")),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("dedup_key", Text),
    Column("payload", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("progress", JSONB),
    Column("report", JSONB),
    Column("error", Text),
    Column("reason", Text),
    Column("run_after", _TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    Column("lease_id", UUID(as_uuid=True)),
    Column("worker_id", Text),
    Column("created_at", _TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    Column("started_at", _TIMESTAMPTZ),
    Column("finished_at", _TIMESTAMPTZ),
    Column("cancel_requested_at", _TIMESTAMPTZ),
    # 0008_flow_control
    Column("priority", Integer, nullable=False, server_default=text("0")),
    Column("concurrency_key", Text),
    Column("has_dependents", Boolean, nullable=False, server_default=text("false")),
    # the W3C trace context of the enqueue (migration 0014; null without OpenTelemetry)
    Column("trace_context", JSONB),
    # queued and reserved by a daemon ahead of its free slots until then (migration 0022)
    Column("reserved_until", _TIMESTAMPTZ),
    # the failed or cancelled job this one retries (migration 0025; at most one retry each)
    Column("retry_of", UUID(as_uuid=True)),
    # the error records of the last attempts that ended in one (migration 0028)
    Column("errors", JSONB),
    # the ids in the history of the events this row stands for (migration 0032): its
    # creation, its current run's start, and that run's end when it ended the job
    Column(
        "created_event_id",
        BigInteger,
        server_default=text("nextval('jobsd.job_events_id_seq'::regclass)"),
    ),
    Column("start_event_id", BigInteger),
    Column("end_event_id", BigInteger),
    CheckConstraint(f"status IN ({_STATUSES})", name="jobs_status_check"),
    CheckConstraint(
        "concurrency_key <> '' AND octet_length(concurrency_key) <= 255",
        name="jobs_concurrency_key_check",
    ),
    CheckConstraint("attempts >= 0", name="jobs_attempts_check"),
    CheckConstraint("octet_length(error) <= 2048", name="jobs_error_check"),
    # the size caps of migration 0011 (the same limits as the settings)
    CheckConstraint("octet_length(payload::text) <= 1048576", name="jobs_payload_size"),
    CheckConstraint("octet_length(report::text) <= 1048576", name="jobs_report_size"),
    CheckConstraint("octet_length(progress::text) <= 1048576", name="jobs_progress_size"),
    CheckConstraint("char_length(type) <= 200", name="jobs_type_size"),
    CheckConstraint("char_length(dedup_key) <= 512", name="jobs_dedup_key_size"),
    CheckConstraint("octet_length(org_id) <= 255", name="jobs_org_id_size"),
    CheckConstraint(
        "jsonb_typeof(errors) = 'array' AND octet_length(errors::text) <= 2097152",
        name="jobs_errors_size",
    ),
)

# one dedup key per org among the jobs that hold one (a unique index on those rows
# only since migration 0020: a job without a key, or ended, costs it nothing)
Index(
    "jobs_org_dedup_key_key",
    jobs.c.org_id,
    jobs.c.dedup_key,
    unique=True,
    postgresql_where=jobs.c.dedup_key.isnot(None),
)

# 0033: the running jobs, by the daemon that holds them
Index(
    "jobs_running_idx",
    jobs.c.worker_id,
    postgresql_where=jobs.c.status == "running",
)
# 0008_flow_control: the claim reads each queue in claim order
Index(
    "jobs_claim_v2_idx",
    jobs.c.queue,
    jobs.c.priority,
    jobs.c.created_at,
    jobs.c.id,
    postgresql_where=jobs.c.status == "queued",
)
# 0012_tenant: an org's open (and running) jobs in a queue, for its per-org limits and
# (since 0020, which dropped jobs_open_by_queue_idx) every count of open jobs by queue
Index(
    "jobs_open_by_queue_org_idx",
    jobs.c.queue,
    jobs.c.org_id,
    jobs.c.status,
    postgresql_where=jobs.c.status.not_in(["succeeded", "failed", "cancelled"]),
)
Index("jobs_scheduled_idx", jobs.c.run_after, postgresql_where=jobs.c.status == "scheduled")
# 0002_api_tokens: an org's jobs in creation order, for the API's paginated list
Index("jobs_org_created_idx", jobs.c.org_id, jobs.c.created_at, jobs.c.id)
# 0015_handlers: failed jobs by end time, for the on_fail claim
Index("jobs_failed_idx", jobs.c.finished_at, postgresql_where=jobs.c.status == "failed")
# the dashboard's newest-first list and its hour of throughput (migration 0017)
Index("jobs_created_idx", jobs.c.created_at, jobs.c.id)
Index("jobs_finished_idx", jobs.c.finished_at, postgresql_where=jobs.c.finished_at.isnot(None))
# 0025_retry_new_job: one retry per job, and a retried job's link to it
Index(
    "jobs_retry_of_key",
    jobs.c.retry_of,
    unique=True,
    postgresql_where=jobs.c.retry_of.isnot(None),
)

# the whole history of every job, open or archived, in `id` order: the rows of
# job_events and the events each job's row stands for (a view, migration 0032)
all_job_events = table(
    "all_job_events",
    column("id", BigInteger),
    column("job_id", UUID(as_uuid=True)),
    column("org_id", Text),
    column("from_status", Text),
    column("to_status", Text),
    column("attempt", Integer),
    column("worker_id", Text),
    column("reason", Text),
    column("at", _TIMESTAMPTZ),
    schema="jobsd",
)

# the transitions stored as rows (every one but those a job's row stands for: read the
# history through all_job_events)
job_events = Table(
    "job_events",
    metadata,
    # the primary key is (job_id, id) since migration 0020: a job's history in order
    Column("id", BigInteger, Identity(always=True), nullable=False),
    # 0010_hotpath: no foreign key (a statement trigger deletes a deleted job's events)
    Column("job_id", UUID(as_uuid=True), nullable=False),
    Column("org_id", Text, nullable=False),
    Column("from_status", Text),
    Column("to_status", Text, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("worker_id", Text),
    Column("reason", Text),
    Column("at", _TIMESTAMPTZ, nullable=False, server_default=text("clock_timestamp()")),
    PrimaryKeyConstraint("job_id", "id", name="job_events_pkey"),
)


def enqueue(
    session: Session,
    type: str,
    payload: dict[str, Any] | None = None,
    *,
    org_id: str,
    max_payload_bytes: int | None = DEFAULT_MAX_PAYLOAD_BYTES,
    **options: Unpack[EnqueueOptions],
) -> Job:
    """Create a job in the Session's transaction; return it, or the existing one on a hit.

    ``options`` are those of ``jobsd.client.EnqueueOptions``. Nothing is committed
    here: the job exists when the Session commits and is gone if it rolls back.
    Raises ConfigError when the Session's driver is not psycopg (v3), and otherwise
    what ``Client.enqueue`` raises.
    """
    spec = JobSpec.build(
        type, payload, org_id=org_id, max_payload_bytes=max_payload_bytes, **options
    )
    return enqueue_sync(_psycopg_connection(session), spec)


def _psycopg_connection(session: Session) -> psycopg.Connection[Any]:
    """Return the psycopg connection under the Session's current transaction."""
    connection = session.connection()
    raw = connection.connection.driver_connection
    if not isinstance(raw, psycopg.Connection):
        dialect = connection.dialect
        raise ConfigError(
            "jobsd.contrib.sqlalchemy.enqueue needs the psycopg (v3) driver, but this Session uses "
            f"{dialect.name}+{dialect.driver}: use an engine URL 'postgresql+psycopg://...'"
        )
    return raw
