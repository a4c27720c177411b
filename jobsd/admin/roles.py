"""Create the least-privilege roles and grant each exactly what it needs on schema jobsd.

Six login roles, named ``<prefix>_<kind>``:

- ``owner`` owns schema ``jobsd`` and everything in it: it runs ``jobsd migrate``,
  ``jobsd token``, ``jobsd notify``, ``jobsd queue drop``. Row-level security does not
  apply to it.
- ``enqueue`` (the application) inserts jobs, reads them back with their history and
  cancels them before they start, for the org set in ``jobsd.org_id``. It administers
  nothing.
- ``worker`` (``jobsd run``) claims, updates and sweeps the jobs of every org.
- ``read`` (dashboards, reporting) selects, for the org set in ``jobsd.org_id``.
- ``admin`` (operators) creates, limits, pauses and resumes queues; never drops one.
- ``api`` (the HTTP API, ``JOBSD_API_DATABASE_URL``): the enqueue role's rights, the
  token lookup, and membership in ``admin`` for operator tokens.

``enqueue``, ``read`` and ``api`` are trusted multi-tenant roles (``jobsd.role_orgs``
with no org): they act for the org they set in ``jobsd.org_id``. A tenant's own login
role is pinned to its org instead (``create_tenant_role``).

Roles are cluster-wide, grants and policies are per database: ``create_roles`` works
on the database of its URL, after ``jobsd migrate``, in one transaction, and may be
run again at any time (after an upgrade, to converge on the current list of grants).
It needs a superuser. SQL text lives in ``sql/roles/roles.sql``, its statements in
``jobsd.store.roles``; this module decides what to run, in which order, and refuses.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from jobsd.errors import ConfigError
from jobsd.store.roles import RoleStatements, roles_session

__all__ = [
    "ROLE_KINDS",
    "RoleNames",
    "RolesReport",
    "check_sees_all_orgs",
    "create_roles",
    "create_tenant_role",
    "drop_roles",
]

ROLE_KINDS = ("owner", "enqueue", "worker", "read", "admin", "api")
# the roles that act for the org they set in jobsd.org_id
TRUSTED_KINDS = ("enqueue", "read", "api")
_ROLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_PREFIX = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")
# attributes a jobsd role must not have (pg_roles column -> what to call it)
_FORBIDDEN = {
    "rolsuper": "SUPERUSER",
    "rolcreaterole": "CREATEROLE",
    "rolcreatedb": "CREATEDB",
    "rolreplication": "REPLICATION",
    "rolbypassrls": "BYPASSRLS",
}


@dataclass(frozen=True, slots=True)
class RoleNames:
    """The six role names for one prefix."""

    owner: str
    enqueue: str
    worker: str
    read: str
    admin: str
    api: str

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
    with roles_session(url, "roles create") as db:
        return _create(db, names, passwords)


def _create(db: RoleStatements, names: RoleNames, passwords: Mapping[str, str]) -> RolesReport:
    db.lock()
    report = RolesReport(names, _check_runner(db))
    state = db.schema_state()
    if not state["migrated"] or not state["rls"] or not state["has_role_orgs"]:
        raise ConfigError(
            f"schema jobsd in database {report.database!r} is not migrated: "
            "run `jobsd migrate` first"
        )
    _ensure_roles(db, names, report)
    for kind, password in passwords.items():
        role = getattr(names, kind)
        if not password:
            raise ConfigError(f"empty password for role {role!r}")
        db.set_password(role, password)
        report.passwords_set.append(role)
    by_kind = names.by_kind()
    db.grant_database(report.database, by_kind)
    for row in db.foreign_objects(names.owner):  # the owner runs later migrations
        db.set_owner(str(row["kind"]), row["target"], names.owner)
        report.adopted.append(f"{row['kind']} {row['target']}")
    db.grant_tables(by_kind)
    db.grant_functions(by_kind)
    if state["has_api_tokens"]:
        db.grant_api_tokens(by_kind)
    db.default_privileges(by_kind)
    db.policies(by_kind, f"{names.worker}_all_orgs")
    db.register_trusted([by_kind[kind] for kind in TRUSTED_KINDS])
    return report


def create_tenant_role(
    url: str, role: str, org_id: str, *, password: str | None = None
) -> RolesReport:
    """Create (or update) ``role``, a login role pinned to ``org_id``: a tenant's own role.

    It reads its org's jobs, history, dependencies and the queues, and nothing of any
    other org whatever it sets in ``jobsd.org_id`` (``jobsd.role_orgs``). Idempotent;
    needs a superuser, after ``jobsd migrate``. Raises ConfigError for a bad name or
    org, or an existing role with powers it must not have.
    """
    if not _ROLE_NAME.match(role):
        raise ConfigError(
            f"invalid role name {role!r}: use lowercase letters, digits and _ "
            "(at most 63 characters, not starting with a digit)"
        )
    if not org_id.strip():
        raise ConfigError("--org must not be empty")
    with roles_session(url, "roles create --tenant") as db:
        db.lock()
        report = RolesReport(RoleNames.for_prefix("jobsd"), _check_runner(db))
        state = db.schema_state()
        if not state["migrated"] or not state["has_role_orgs"]:
            raise ConfigError(
                f"schema jobsd in database {report.database!r} is not migrated: "
                "run `jobsd migrate` first"
            )
        _ensure_role(db, role, report)
        if password is not None:
            if not password:
                raise ConfigError(f"empty password for role {role!r}")
            db.set_password(role, password)
            report.passwords_set.append(role)
        db.pin_tenant(role, org_id)
        db.grant_tenant(role, report.database)
        return report


def _check_runner(db: RoleStatements) -> str:
    """Return the database name; refuse a runner that cannot grant everything."""
    runner = db.runner()
    if not runner["rolsuper"]:
        raise ConfigError(
            "jobsd roles create must run as a superuser (it creates roles, moves the "
            "ownership of schema jobsd and sets policies): e.g. "
            "`sudo -u postgres env JOBSD_DATABASE_URL=postgresql:///DBNAME jobsd roles create`"
        )
    return str(runner["database"])


def _ensure_roles(db: RoleStatements, names: RoleNames, report: RolesReport) -> None:
    for name in names.by_kind().values():
        _ensure_role(db, name, report)


def _ensure_role(db: RoleStatements, name: str, report: RolesReport) -> None:
    row = db.existing([name]).get(name)
    if row is None:
        db.create_role(name)
        report.created.append(name)
        return
    powers = [label for column, label in _FORBIDDEN.items() if row[column]]
    if powers:
        raise ConfigError(
            f"role {name!r} already exists with {', '.join(powers)}: a jobsd role must "
            "not have it; remove it (ALTER ROLE ... NO...) or choose another name"
        )
    if not row["rolcanlogin"]:
        db.allow_login(name)
    report.existing.append(name)


def drop_roles(url: str, *, prefix: str) -> None:
    """Drop the four roles; what the owner owned in this database passes to the caller.

    Grants in other databases must be dropped there first (``DROP OWNED BY``), else
    Postgres refuses and says where.
    """
    names = RoleNames.for_prefix(prefix)
    with roles_session(url, "roles drop") as db:
        _check_runner(db)
        present = list(db.existing(list(names.by_kind().values())))
        db.forget(present)
        for role in present:
            db.drop_owned(role)
        for role in present:
            db.drop_role(role)


def check_sees_all_orgs(url: str) -> None:
    """Raise ConfigError when the role of ``url`` would see only one org's jobs.

    For the daemon's start: a worker subject to row-level security without the
    all-orgs policy would find no job to claim and idle without a word.
    """
    with roles_session(url, "role check") as db:
        sees_all, user = db.sees_all_orgs(), db.user
    if not sees_all:
        raise ConfigError(
            f"database role {user!r} sees only the jobs of the org in jobsd.org_id "
            "(row-level security): run the daemon as the worker role made by "
            "`jobsd roles create`, or run that command again to restore its policy"
        )
