"""Create the least-privilege roles and grant each exactly what it needs on schema jobsd.

Four login roles, named ``<prefix>_<kind>``:

- ``owner`` owns schema ``jobsd`` and everything in it: it runs ``jobsd migrate``,
  ``jobsd token``, ``jobsd notify``. Row-level security does not apply to it.
- ``enqueue`` (the application, the HTTP API) inserts jobs, reads them back with their
  history and cancels them before they start, for the org set in ``jobsd.org_id``; it
  may also administer queues (the API lets admin tokens only).
- ``worker`` (``jobsd run``) claims, updates and sweeps the jobs of every org.
- ``read`` (dashboards, reporting) selects, for the org set in ``jobsd.org_id``.

Roles are cluster-wide, grants and policies are per database: ``create_roles`` works
on the database of its URL, after ``jobsd migrate``, in one transaction, and may be
run again at any time (after an upgrade, to converge on the current list of grants).
It needs a superuser. SQL text lives in ``sql/roles/roles.sql``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, LiteralString

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from jobsd.errors import ConfigError
from jobsd.store.db import db_errors
from jobsd.store.sqlfiles import load_named

__all__ = [
    "ROLE_KINDS",
    "RoleNames",
    "RolesReport",
    "check_sees_all_orgs",
    "create_roles",
    "drop_roles",
]

ROLE_KINDS = ("owner", "enqueue", "worker", "read")
_PREFIX = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")
# attributes a jobsd role must not have (pg_roles column -> what to call it)
_FORBIDDEN = {
    "rolsuper": "SUPERUSER",
    "rolcreaterole": "CREATEROLE",
    "rolcreatedb": "CREATEDB",
    "rolreplication": "REPLICATION",
    "rolbypassrls": "BYPASSRLS",
}
_OWNABLE = frozenset({"SCHEMA", "TABLE", "VIEW", "MATERIALIZED VIEW", "SEQUENCE", "ROUTINE"})


@dataclass(frozen=True, slots=True)
class RoleNames:
    """The four role names for one prefix."""

    owner: str
    enqueue: str
    worker: str
    read: str

    @classmethod
    def for_prefix(cls, prefix: str = "jobsd") -> RoleNames:
        """Name the roles ``<prefix>_owner`` and so on; the prefix is a plain lowercase name."""
        if not _PREFIX.match(prefix):
            raise ConfigError(
                f"invalid role prefix {prefix!r}: use lowercase letters, digits and _ "
                "(at most 41 characters, not starting with a digit)"
            )
        return cls(*(f"{prefix}_{kind}" for kind in ROLE_KINDS))

    def by_kind(self) -> dict[str, str]:
        """Return ``{"owner": name, ...}``."""
        return {kind: getattr(self, kind) for kind in ROLE_KINDS}


@dataclass(slots=True)
class RolesReport:
    """What ``create_roles`` did."""

    names: RoleNames
    database: str
    created: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    passwords_set: list[str] = field(default_factory=list)
    adopted: list[str] = field(default_factory=list)
    """objects whose ownership moved to the owner role, e.g. ``TABLE jobsd.jobs``"""


def _text(name: str) -> LiteralString:
    # The text comes from our own shipped files, never from input.
    return load_named("roles")[name]


def _block(name: str, **names: sql.Composable) -> sql.Composed:
    """Return a block with its ``{placeholders}`` filled in."""
    return sql.SQL(_text(name)).format(**names)


def _rows(conn: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(_text(name), params)
        return cur.fetchall() if cur.description else []


def _identifiers(names: RoleNames) -> dict[str, sql.Composable]:
    return {kind: sql.Identifier(name) for kind, name in names.by_kind().items()}


def create_roles(
    url: str, *, prefix: str = "jobsd", passwords: Mapping[str, str] | None = None
) -> RolesReport:
    """Create or update the four roles and their grants on the database of ``url``.

    ``passwords`` maps a kind (``worker``...) to a password; it is sent as a SCRAM
    verifier made on this side, never in clear. Roles without one keep theirs.
    Raises ConfigError when the schema is not migrated or a role exists with powers it
    must not have; DatabaseError (naming ``roles create``) when Postgres refuses.
    """
    names = RoleNames.for_prefix(prefix)
    passwords = dict(passwords or {})
    unknown = sorted(set(passwords) - set(ROLE_KINDS))
    if unknown:
        raise ConfigError(f"unknown role kind {unknown[0]!r} (use {', '.join(ROLE_KINDS)})")
    with (
        db_errors("roles create"),
        psycopg.connect(url, autocommit=True) as conn,
        conn.transaction(),
    ):
        return _create(conn, names, passwords)


def _create(
    conn: psycopg.Connection[Any], names: RoleNames, passwords: Mapping[str, str]
) -> RolesReport:
    _rows(conn, "roles_lock", {})
    report = RolesReport(names, _check_runner(conn))
    state = _rows(conn, "roles_schema_state", {})[0]
    if not state["migrated"] or not state["rls"]:
        raise ConfigError(
            f"schema jobsd in database {report.database!r} is not migrated: "
            "run `jobsd migrate` first"
        )
    _ensure_roles(conn, names, report)
    for kind, password in passwords.items():
        _set_password(conn, getattr(names, kind), password)
        report.passwords_set.append(getattr(names, kind))
    ids = _identifiers(names)
    conn.execute(_block("roles_grant_database", database=sql.Identifier(report.database), **ids))
    _adopt(conn, names.owner, report)
    conn.execute(_block("roles_grant_tables", **ids))
    conn.execute(_block("roles_grant_functions", **ids))
    if state["has_api_tokens"]:
        conn.execute(_block("roles_grant_api_tokens", **ids))
    conn.execute(_block("roles_default_privileges", **ids))
    policy = sql.Identifier(f"{names.worker}_all_orgs")
    conn.execute(_block("roles_policies", policy=policy, **ids))
    return report


def _check_runner(conn: psycopg.Connection[Any]) -> str:
    """Return the database name; refuse a runner that cannot grant everything."""
    runner = _rows(conn, "roles_runner", {})[0]
    if not runner["rolsuper"]:
        raise ConfigError(
            "jobsd roles create must run as a superuser (it creates roles, moves the "
            "ownership of schema jobsd and sets policies): e.g. "
            "`sudo -u postgres env JOBSD_DATABASE_URL=postgresql:///DBNAME jobsd roles create`"
        )
    return str(runner["database"])


def _ensure_roles(conn: psycopg.Connection[Any], names: RoleNames, report: RolesReport) -> None:
    existing = {
        row["rolname"]: row
        for row in _rows(conn, "roles_existing", {"names": list(names.by_kind().values())})
    }
    for name in names.by_kind().values():
        row = existing.get(name)
        if row is None:
            conn.execute(_block("roles_create", role=sql.Identifier(name)))
            report.created.append(name)
            continue
        powers = [label for column, label in _FORBIDDEN.items() if row[column]]
        if powers:
            raise ConfigError(
                f"role {name!r} already exists with {', '.join(powers)}: a jobsd role must "
                "not have it; remove it (ALTER ROLE ... NO...) or choose another --prefix"
            )
        if not row["rolcanlogin"]:
            conn.execute(_block("roles_login", role=sql.Identifier(name)))
        report.existing.append(name)


def _set_password(conn: psycopg.Connection[Any], role: str, password: str) -> None:
    if not password:
        raise ConfigError(f"empty password for role {role!r}")
    verifier = conn.pgconn.encrypt_password(
        password.encode("utf-8"), role.encode("utf-8"), b"scram-sha-256"
    )
    conn.execute(
        _block(
            "roles_set_password",
            role=sql.Identifier(role),
            password=sql.Literal(verifier.decode("ascii")),
        )
    )


def _adopt(conn: psycopg.Connection[Any], owner: str, report: RolesReport) -> None:
    """Make the owner role own schema jobsd and its objects (it runs later migrations)."""
    for row in _rows(conn, "roles_foreign_objects", {"owner": owner}):
        kind = str(row["kind"])
        if kind not in _OWNABLE:
            raise ConfigError(f"unexpected object kind {kind!r} in schema jobsd")
        # kind is one of ours; target was quoted by Postgres itself (regclass, regprocedure)
        conn.execute(
            sql.SQL("ALTER {} {} OWNER TO {}").format(
                sql.SQL(kind),
                sql.SQL(row["target"]),
                sql.Identifier(owner),
            )
        )
        report.adopted.append(f"{kind} {row['target']}")


def drop_roles(url: str, *, prefix: str) -> None:
    """Drop the four roles; what the owner owned in this database passes to the caller.

    Grants in other databases must be dropped there first (``DROP OWNED BY``), else
    Postgres refuses and says where.
    """
    names = RoleNames.for_prefix(prefix)
    with (
        db_errors("roles drop"),
        psycopg.connect(url, autocommit=True) as conn,
        conn.transaction(),
    ):
        _check_runner(conn)
        present = _rows(conn, "roles_existing", {"names": list(names.by_kind().values())})
        for row in present:
            conn.execute(_block("roles_drop_owned", role=sql.Identifier(row["rolname"])))
        for row in present:
            conn.execute(_block("roles_drop", role=sql.Identifier(row["rolname"])))


def check_sees_all_orgs(url: str) -> None:
    """Raise ConfigError when the role of ``url`` would see only one org's jobs.

    For the daemon's start: a worker subject to row-level security without the
    all-orgs policy would find no job to claim and idle without a word.
    """
    with db_errors("role check"), psycopg.connect(url, autocommit=True) as conn:
        row = _rows(conn, "roles_sees_all_orgs", {})[0]
        user = conn.info.user
    if not row["sees_all"]:
        raise ConfigError(
            f"database role {user!r} sees only the jobs of the org in jobsd.org_id "
            "(row-level security): run the daemon as the worker role made by "
            "`jobsd roles create`, or run that command again to restore its policy"
        )
