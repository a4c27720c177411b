"""One typed method per named block of ``sql/roles/roles.sql``: roles, grants and policies.

The blocks name roles, the database and policies through ``{placeholders}``, filled in
here with ``psycopg.sql`` identifiers and literals (never text from input). A session
is one connection and one transaction: whatever Postgres refuses rolls all of it
back, and is translated once, naming the operation. The order of the work (and the
checks between blocks) is ``jobsd.admin.roles``'s.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, LiteralString

from psycopg import sql
from psycopg.rows import dict_row

from jobsd.errors import ConfigError
from jobsd.store.connect import connect
from jobsd.store.db import SyncConn, db_errors
from jobsd.store.named import Row
from jobsd.store.sqlfiles import load_named

__all__ = ["RoleStatements", "roles_session"]

# what ALTER ... OWNER TO may name: the kinds of object roles_foreign_objects lists
_OWNABLE = frozenset({"SCHEMA", "TABLE", "VIEW", "MATERIALIZED VIEW", "SEQUENCE", "ROUTINE"})


def _text(name: str) -> LiteralString:
    # The text comes from our own shipped files, never from input.
    return load_named("roles")[name]


class RoleStatements:
    """The blocks of ``roles.sql`` on one connection, inside its transaction.

    ``names`` arguments map a kind (``owner``, ``enqueue``, ``worker``, ``read``,
    ``admin``, ``api``) to a role name.
    """

    def __init__(self, conn: SyncConn) -> None:
        self._conn = conn

    @property
    def user(self) -> str:
        """Return the role of the session."""
        return str(self._conn.info.user)

    def _rows(self, name: str, params: dict[str, Any]) -> list[Row]:
        with self._conn.cursor(row_factory=dict_row) as cur:
            cur.execute(_text(name), params)
            return cur.fetchall() if cur.description else []

    def _run(self, name: str, **names: sql.Composable) -> None:
        self._conn.execute(sql.SQL(_text(name)).format(**names))

    def _run_for(self, name: str, names: Mapping[str, str], **more: sql.Composable) -> None:
        self._run(name, **{kind: sql.Identifier(n) for kind, n in names.items()}, **more)

    def lock(self) -> None:
        """Serialize concurrent runs (``roles_lock``)."""
        self._rows("roles_lock", {})

    def runner(self) -> Row:
        """Return ``rolsuper`` of the session's role and the ``database`` name."""
        return self._rows("roles_runner", {})[0]

    def schema_state(self) -> Row:
        """Return ``migrated``, ``rls``, ``has_api_tokens``, ``has_role_orgs`` of schema jobsd."""
        return self._rows("roles_schema_state", {})[0]

    def existing(self, roles: list[str]) -> dict[str, Row]:
        """Return the ``pg_roles`` rows of those of ``roles`` that exist, by name."""
        return {row["rolname"]: row for row in self._rows("roles_existing", {"names": roles})}

    def create_role(self, role: str) -> None:
        """Create a login role."""
        self._run("roles_create", role=sql.Identifier(role))

    def allow_login(self, role: str) -> None:
        """Let an existing role log in."""
        self._run("roles_login", role=sql.Identifier(role))

    def set_password(self, role: str, password: str) -> None:
        """Set a password, sent as a SCRAM verifier made on this side, never in clear."""
        verifier = self._conn.pgconn.encrypt_password(
            password.encode("utf-8"), role.encode("utf-8"), b"scram-sha-256"
        )
        literal = sql.Literal(verifier.decode("ascii"))
        self._run("roles_set_password", role=sql.Identifier(role), password=literal)

    def grant_database(self, database: str, names: Mapping[str, str]) -> None:
        """Grant CONNECT on the database to the roles, CREATE to the owner."""
        self._run_for("roles_grant_database", names, database=sql.Identifier(database))

    def foreign_objects(self, owner: str) -> list[Row]:
        """List the objects of schema jobsd not owned by ``owner`` (``kind``, ``target``)."""
        return self._rows("roles_foreign_objects", {"owner": owner})

    def set_owner(self, kind: str, target: str, owner: str) -> None:
        """Make ``owner`` own an object listed by ``foreign_objects``."""
        if kind not in _OWNABLE:
            raise ConfigError(f"unexpected object kind {kind!r} in schema jobsd")
        # kind is one of ours; target was quoted by Postgres itself (regclass, regprocedure)
        statement = sql.SQL("ALTER {} {} OWNER TO {}").format(
            sql.SQL(kind),
            sql.SQL(target),
            sql.Identifier(owner),
        )
        self._conn.execute(statement)

    def grant_tables(self, names: Mapping[str, str]) -> None:
        """Grant each role what it needs on the tables (revoking the rest first)."""
        self._run_for("roles_grant_tables", names)

    def grant_functions(self, names: Mapping[str, str]) -> None:
        """Grant each role the functions it may execute (revoking the rest first)."""
        self._run_for("roles_grant_functions", names)

    def grant_api_tokens(self, names: Mapping[str, str]) -> None:
        """Let the API's role (and the enqueue role) look tokens up (migration 0012)."""
        self._run_for("roles_grant_api_tokens", names)

    def register_trusted(self, roles: list[str]) -> None:
        """Let ``roles`` act for the org they set in jobsd.org_id (``role_orgs``, org null)."""
        self._rows("roles_trusted", {"names": roles})

    def pin_tenant(self, role: str, org_id: str) -> None:
        """Pin ``role`` to ``org_id`` in ``role_orgs``."""
        self._rows("roles_tenant_pin", {"role": role, "org_id": org_id})

    def grant_tenant(self, role: str, database: str) -> None:
        """Grant a tenant's role what it may read of its org."""
        self._run(
            "roles_tenant_grants", role=sql.Identifier(role), database=sql.Identifier(database)
        )

    def forget(self, roles: list[str]) -> None:
        """Delete the ``role_orgs`` rows of ``roles`` (when the schema has the table)."""
        if self.schema_state()["has_role_orgs"]:
            self._rows("roles_forget", {"names": roles})

    def default_privileges(self, names: Mapping[str, str]) -> None:
        """Grant the read role what the owner creates later."""
        self._run_for("roles_default_privileges", names)

    def policies(self, names: Mapping[str, str], policy: str) -> None:
        """(Re)create the worker's all-orgs row-level security policies named ``policy``."""
        self._run_for("roles_policies", names, policy=sql.Identifier(policy))

    def sees_all_orgs(self) -> bool:
        """Say whether the session's role sees every org's jobs."""
        return bool(self._rows("roles_sees_all_orgs", {})[0]["sees_all"])

    def drop_owned(self, role: str) -> None:
        """Pass what ``role`` owns in this database to the session's role, drop its grants."""
        self._run("roles_drop_owned", role=sql.Identifier(role))

    def drop_role(self, role: str) -> None:
        """Drop a role (if it exists)."""
        self._run("roles_drop", role=sql.Identifier(role))


@contextmanager
def roles_session(url: str, operation: str) -> Iterator[RoleStatements]:
    """Open one connection and one transaction for ``operation`` (``roles create``...)."""
    with (
        connect(url, application_name="jobsd-roles", operation=operation) as conn,
        db_errors(operation),
        conn.transaction(),
    ):
        yield RoleStatements(conn)
