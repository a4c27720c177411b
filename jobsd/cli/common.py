"""What every ``jobsd`` command shares: settings, the URL, connections, and who asks.

Every command that connects goes through ``jobsd.store.connect`` (here, or inside the
client, the migrations, the snapshot or the roles it calls): plaintext TCP is refused
unless ``JOBSD_ALLOW_INSECURE`` is set, for every command alike. This module is the
command line's one door to connections (the only ``jobsd.cli`` module that imports
``jobsd.store``); the operations themselves are ``jobsd.ops``'s.

The caller of a job command is the operator (``cli:<user>``, every org), or, with
``--token`` (``JOBSD_TOKEN``), what that API token stands for: its org only, as
through the API and the dashboard.
"""

from __future__ import annotations

import getpass
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import click

from jobsd.cli.errors import fail, friendly_errors
from jobsd.errors import ConfigError
from jobsd.settings import Settings, credential_database_url

if TYPE_CHECKING:
    from jobsd.ops import AsyncConn, Caller
    from jobsd.store.replica import Lagged, ReplicaReader

__all__ = [
    "Moment",
    "check_url",
    "connect",
    "database_url_option",
    "given_url",
    "lagging_reader",
    "load_settings",
    "migrate",
    "migration_script",
    "on_job",
    "on_named",
    "open_connection_async",
    "operator",
    "operator_url",
    "pending_migrations",
    "replica_line",
    "require_url",
    "run_as",
    "run_async",
    "run_lagging",
    "token_option",
    "warn_if_insecure",
]

T = TypeVar("T")

database_url_option = click.option(
    "--database-url",
    envvar="JOBSD_DATABASE_URL",
    help="libpq URL of the database (JOBSD_DATABASE_URL).",
)
"""``--database-url`` of the operator commands that take no other role's URL"""


def load_settings(**overrides: Any) -> Settings:
    """Read settings from the environment, with command-line overrides."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})


def require_url(settings: Settings) -> str:
    """Return the database URL, or raise ConfigError saying how to set one."""
    if not settings.database_url:
        raise ConfigError("no database configured: set JOBSD_DATABASE_URL (or use `jobsd dev`)")
    return settings.database_url


def given_url(database_url: str | None) -> str:
    """Return ``--database-url`` (its default is JOBSD_DATABASE_URL, then the systemd
    credential ``database_url``), or raise ConfigError."""
    if not database_url:
        database_url = credential_database_url()
    if not database_url:
        raise ConfigError("no database configured: set JOBSD_DATABASE_URL or --database-url")
    return database_url


def check_url(url: str) -> str | None:
    """Apply the TLS policy to ``url`` (ConfigError); return the warning when it is
    plaintext allowed by ``JOBSD_ALLOW_INSECURE``, else None."""
    from jobsd.store.connect import check_url as store_check_url

    return store_check_url(url)


def migrate(url: str) -> list[str]:
    """Apply the pending migrations; return the versions applied."""
    from jobsd.store.migrate import migrate_sync

    return migrate_sync(url)


def migration_script(after: int | None) -> str:
    """Return the migrations after version ``after`` (all when None) as one SQL script;
    no database is needed."""
    from jobsd.store.migrate import migration_script as store_migration_script

    return store_migration_script(after)


def pending_migrations(url: str) -> list[str]:
    """Return the names of the migrations not applied yet."""
    from jobsd.store.migrate import migration_status_sync

    return [m.name for m in migration_status_sync(url) if not m.applied]


def connect(url: str, *, application_name: str, operation: str) -> Any:
    """Open one sync connection (a context manager) under the TLS policy."""
    from jobsd.store.connect import connect as store_connect

    return store_connect(url, application_name=application_name, operation=operation)


async def open_connection_async(url: str, *, application_name: str, operation: str) -> AsyncConn:
    """Open one async connection under the TLS policy; the caller closes it."""
    from jobsd.store.connect import open_connection_async as store_open

    return await store_open(url, application_name=application_name, operation=operation)


token_option = click.option(
    "--token",
    envvar="JOBSD_TOKEN",
    default=None,
    metavar="TOKEN",
    help="Act as this API token would: its org's jobs only (JOBSD_TOKEN). Without it "
    "the command acts as the operator, on every org's jobs.",
)
"""``--token`` of the job commands"""


def operator() -> Caller:
    """Return the operator the command line acts as, named ``cli:<user>`` in histories."""
    from jobsd.ops import Caller

    return Caller.as_operator(f"cli:{getpass.getuser()}")


async def caller_of(conn: AsyncConn, token: str | None) -> Caller:
    """Return who the command acts as: the operator, or what ``token`` stands for
    (ConfigError for an unknown or revoked token)."""
    if token is None:
        return operator()
    from jobsd.ops import Caller
    from jobsd.ops.tokens import find_token, hash_token, looks_like_token

    grant = None
    if looks_like_token(token.strip()):
        grant = await find_token(conn, hash_token(token.strip()))
    if grant is None:
        raise ConfigError("unknown or revoked token (--token, JOBSD_TOKEN)")
    return Caller.of_grant(grant, f"cli:{getpass.getuser()}")


def run_as(
    url: str,
    token: str | None,
    operation: str,
    work: Callable[[AsyncConn, Caller], Awaitable[T]],
    *,
    command: str,
) -> T:
    """``run_async`` for a job command: ``work(conn, caller)``, the caller being the
    operator or ``token``'s (see ``caller_of``)."""

    async def apply(conn: AsyncConn) -> T:
        return await work(conn, await caller_of(conn, token))

    return run_async(url, operation, apply, command=command)


def lagging_reader(
    url: str, read_url: str | None, *, command: str, operation: str
) -> ReplicaReader:
    """Return the reader of a command's reads that may lag: on ``read_url``
    (JOBSD_READ_DATABASE_URL, a streaming replica) while it answers, else on ``url``.
    A job or a token the replica does not know yet is looked up on the primary."""
    from jobsd.errors import JobNotFound
    from jobsd.store.replica import ReplicaReader

    return ReplicaReader(
        url,
        read_url,
        application_name=f"jobsd-{command}",
        operation=operation,
        retry_on=(JobNotFound, ConfigError),
    )


def run_lagging(
    settings: Settings,
    token: str | None,
    operation: str,
    work: Callable[[AsyncConn, Caller], Awaitable[T]],
    *,
    command: str,
) -> Lagged[T]:
    """``run_as`` for a read that may lag (``lagging_reader``): the answer says whether
    the replica gave it, and its delay."""
    import anyio

    reader = lagging_reader(
        require_url(settings), settings.read_database_url, command=command, operation=operation
    )

    async def apply(conn: AsyncConn) -> T:
        return await work(conn, await caller_of(conn, token))

    async def main() -> Lagged[T]:
        try:
            return await reader.read(apply)
        finally:
            await reader.aclose()

    return anyio.run(main)


def replica_line(replica: bool, lag_s: float | None) -> str | None:
    """Say where a read that may lag came from: ``read from a replica, 0.3 s behind``;
    None for the primary."""
    if not replica:
        return None
    if lag_s is None:
        return "read from a replica, delay unknown"
    return f"read from a replica, {lag_s:.1f} s behind"


def on_job(
    job_id: str,
    token: str | None,
    operation: str,
    work: Callable[[AsyncConn, Caller, uuid.UUID], Awaitable[T]],
    *,
    command: str,
) -> T:
    """Run a job command: ``job_id`` must be a UUID (one line otherwise), then
    ``work(conn, caller, id)`` as ``run_as`` runs it (``operation`` of job ID)."""
    try:
        parsed = uuid.UUID(job_id)
    except ValueError:
        fail(f"{job_id!r} is not a job id (a UUID)")
    url = require_url(load_settings())
    return run_as(
        url,
        token,
        f"{operation} of job {parsed}",
        lambda conn, caller: work(conn, caller, parsed),
        command=command,
    )


def warn_if_insecure(url: str) -> None:
    """Apply the TLS policy now: raise ConfigError, or print a warning line when allowed.

    For the operator commands (queue, roles, prune, export), which say so on stderr.
    """
    insecure = check_url(url)
    if insecure is not None:
        click.echo(f"jobsd: warning: {insecure} (allowed by JOBSD_ALLOW_INSECURE)", err=True)


def on_named(
    group: click.Group, verb: str, argument: str, *, metavar: str | None = None
) -> Callable[[Callable[[str, str | None], None]], click.Command]:
    """Declare ``jobsd <group> <verb> NAME [--database-url URL]``: the command calls
    ``func(name, database_url)``, its errors one line (``friendly_errors``)."""

    def declare(func: Callable[[str, str | None], None]) -> click.Command:
        command = friendly_errors(func)
        return group.command(verb)(
            click.argument(argument, metavar=metavar)(database_url_option(command))
        )

    return declare


def operator_url(database_url: str | None) -> str:
    """Return the URL an operator command was given (``given_url``), after
    ``warn_if_insecure``."""
    url = given_url(database_url)
    warn_if_insecure(url)
    return url


def run_async(
    url: str, operation: str, work: Callable[[AsyncConn], Awaitable[T]], *, command: str
) -> T:
    """Open one connection (``jobsd-<command>``), run ``work(conn)`` once, close it.

    ``conn`` is an autocommit async connection; ``work`` (store functions) opens its
    own transaction where it needs one. Failing to connect is BackendUnavailable
    naming ``operation``.
    """
    import anyio

    from jobsd.store.connect import connect_async

    async def apply() -> T:
        async with connect_async(
            url, application_name=f"jobsd-{command}", operation=operation
        ) as conn:
            return await work(conn)

    return anyio.run(apply)


class Moment(click.ParamType[datetime]):
    """A point in time: ISO 8601 (``2030-01-01``, ``2030-01-01T00:00:00Z``,
    ``2030-01-01T02:00:00+02:00``; without an offset: UTC), or a duration (``90s``,
    ``10m``, ``2h``, ``3d``) from now: ``ago`` for filters (``--since 1h``), ahead
    otherwise (``--run-after 10m``)."""

    name = "time"

    def __init__(self, *, ago: bool = False) -> None:
        self.ago = ago

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> datetime:
        if isinstance(value, datetime):
            return value if value.tzinfo else value.replace(tzinfo=UTC)
        text = str(value).strip()
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            pass
        else:
            return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
        try:
            seconds = _duration_s(text)
        except ValueError:
            when = "ago" if self.ago else "from now"
            self.fail(
                f"{text!r} is not a time: use ISO 8601 (2030-01-01T00:00:00Z, "
                f"2030-01-01T02:00:00+02:00) or a duration {when} (90s, 10m, 2h, 3d)",
                param,
                ctx,
            )
        delta = timedelta(seconds=seconds)
        return datetime.now(UTC) - delta if self.ago else datetime.now(UTC) + delta


def _duration_s(text: str) -> float:
    from jobsd.settings import parse_duration

    if text.endswith("d") and text[:-1].replace(".", "", 1).isdigit():
        return float(text[:-1]) * 86400
    return parse_duration(text)
