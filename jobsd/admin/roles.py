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
    if not state["migrated"] or not state["rls"]:
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
    existing = db.existing(list(names.by_kind().values()))
    for name in names.by_kind().values():
        row = existing.get(name)
        if row is None:
            db.create_role(name)
            report.created.append(name)
            continue
        powers = [label for column, label in _FORBIDDEN.items() if row[column]]
        if powers:
            raise ConfigError(
                f"role {name!r} already exists with {', '.join(powers)}: a jobsd role must "
                "not have it; remove it (ALTER ROLE ... NO...) or choose another --prefix"
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
