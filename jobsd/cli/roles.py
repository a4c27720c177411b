"""The ``jobsd roles`` commands: create the least-privilege roles on a database.

Errors are one line on stderr
(``jobsd: error: ...``) and exit status 1, like every jobsd command.
"""

from __future__ import annotations

import os

import click

from jobsd.cli.common import operator_url
from jobsd.cli.errors import friendly_errors
from jobsd.errors import ConfigError

__all__ = ["roles"]


def _passwords(specs: tuple[str, ...], kinds: tuple[str, ...] | None = None) -> dict[str, str]:
    """Read ``KIND=VAR`` pairs: the password of role KIND is in environment variable VAR."""
    from jobsd.admin.roles import ROLE_KINDS

    kinds = kinds or ROLE_KINDS
    passwords: dict[str, str] = {}
    for spec in specs:
        kind, sep, var = spec.partition("=")
        kind, var = kind.strip(), var.strip()
        if not sep or not var or kind not in kinds:
            raise ConfigError(
                f"--password-env {spec!r}: use KIND=VARIABLE with KIND one of "
                f"{', '.join(kinds)}, e.g. --password-env {kinds[-1]}=JOBSD_PASSWORD"
            )
        value = os.environ.get(var, "")
        if not value:
            raise ConfigError(f"--password-env {spec!r}: environment variable {var} is empty")
        passwords[kind] = value
    return passwords


@click.group()
def roles() -> None:
    """Manage the least-privilege database roles (owner, enqueue, worker, read, admin, api)."""


@roles.command("create")
@click.option(
    "--prefix",
    default="jobsd",
    show_default=True,
    help="Roles are named PREFIX_owner, PREFIX_enqueue, PREFIX_worker, PREFIX_read, "
    "PREFIX_admin, PREFIX_api.",
)
@click.option(
    "--password-env",
    "password_env",
    multiple=True,
    metavar="KIND=VAR",
    help="Set the password of role KIND from environment variable VAR (repeatable); "
    "roles without one keep theirs.",
)
@click.option(
    "--database-url",
    envvar="JOBSD_DATABASE_URL",
    help="Superuser libpq URL of the database (JOBSD_DATABASE_URL).",
)
@click.option(
    "--tenant",
    "tenant",
    default=None,
    metavar="ROLE",
    help="Instead: create login role ROLE for one tenant, pinned to --org (it reads that "
    "org's jobs, whatever it sets in jobsd.org_id). Its password: --password-env tenant=VAR.",
)
@click.option("--org", "org_id", default=None, help="The org of --tenant.")
@friendly_errors
def roles_create(
    prefix: str,
    password_env: tuple[str, ...],
    database_url: str | None,
    tenant: str | None,
    org_id: str | None,
) -> None:
    """Create the roles (idempotent) and grant each exactly what it needs on schema jobsd.

    Run it as a superuser after `jobsd migrate`, and again after every upgrade. With
    --tenant ROLE --org ORG it creates (or updates) one tenant's own role instead.
    """
    from jobsd.admin.roles import create_roles, create_tenant_role

    tenant_case = tenant is not None or org_id is not None
    if tenant_case and (tenant is None or org_id is None):
        raise ConfigError("--tenant ROLE and --org ORG go together")
    passwords = _passwords(password_env, kinds=("tenant",) if tenant_case else None)
    url = operator_url(database_url)
    if tenant is not None and org_id is not None:
        report = create_tenant_role(url, tenant, org_id, password=passwords.get("tenant"))
    else:
        report = create_roles(url, prefix=prefix, passwords=passwords)
    for name in report.created:
        click.echo(f"created role {name}")
    for name in report.existing:
        click.echo(f"role {name} exists")
    for name in report.passwords_set:
        click.echo(f"password set for {name}")
    for target in report.adopted:
        click.echo(f"{target} now owned by {report.names.owner}")
    if tenant is not None:
        click.echo(f"role {tenant} acts for org {org_id!r} only, on database {report.database!r}")
    else:
        click.echo(f"grants and policies up to date on database {report.database!r}")
