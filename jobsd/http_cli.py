"""The HTTP API's commands: ``jobsd api`` and ``jobsd token create|revoke|list``.

``jobsd.cli`` attaches them with ``register(main)``. Errors are one line on stderr
(``jobsd: error: ...``) and exit status 1, like every jobsd command.
"""

from __future__ import annotations

import json

import click

from jobsd.cli_errors import fail, friendly_errors
from jobsd.errors import ConfigError

__all__ = ["register"]


def _database_url() -> str:
    from jobsd.settings import Settings

    url = Settings().database_url
    if not url:
        raise ConfigError("no database configured: set JOBSD_DATABASE_URL")
    return url


@click.command()
@click.option(
    "--addr",
    envvar="JOBSD_HTTP_ADDR",
    default="127.0.0.1:8080",
    show_default=True,
    help="host:port to listen on (JOBSD_HTTP_ADDR).",
)
@friendly_errors
def api(addr: str) -> None:
    """Serve the HTTP API alone (no workers) until SIGTERM or SIGINT."""
    from jobsd.http.server import run_api
    from jobsd.http.settings import HttpSettings
    from jobsd.logs import setup_logging
    from jobsd.security import require_secure_connection
    from jobsd.settings import Settings

    settings = Settings()
    url = _database_url()
    http = HttpSettings(http_addr=addr)
    setup_logging(settings.log_level, settings.log_format)
    require_secure_connection(url)
    run_api(settings, http)


@click.group()
def token() -> None:
    """Manage the HTTP API's bearer tokens (one or more per org)."""


@token.command("create")
@click.option("--org", "org_id", required=True, help="The org the token acts for.")
@click.option("--name", default=None, help="A label, e.g. who or what uses the token.")
@click.option(
    "--admin",
    is_flag=True,
    help="The token may also administer queues (/queues): every queue, whatever its org.",
)
@friendly_errors
def token_create(org_id: str, name: str | None, admin: bool) -> None:
    """Make a token and print it alone on stdout, once: only its hash is stored."""
    import psycopg

    from jobsd.http.tokens import create_token
    from jobsd.store.db import db_errors

    if not org_id.strip():
        fail("--org must not be empty")
    url = _database_url()
    with db_errors("token creation"), psycopg.connect(url, autocommit=True) as conn:
        secret, info = create_token(conn, org_id, name, admin=admin)
    click.echo(secret)
    kind = "admin token" if info.admin else "token"
    click.echo(f"{kind} {info.id} for org {info.org_id!r} created; it is shown only now", err=True)


@token.command("revoke")
@click.argument("token_or_id")
@friendly_errors
def token_revoke(token_or_id: str) -> None:
    """Revoke a token, given by its id (see `jobsd token list`) or by the token itself."""
    import psycopg

    from jobsd.http.tokens import revoke_token
    from jobsd.store.db import db_errors

    url = _database_url()
    with db_errors("token revocation"), psycopg.connect(url, autocommit=True) as conn:
        info = revoke_token(conn, token_or_id.strip())
    if info is None:
        fail("no such token")
    click.echo(f"token {info.id} of org {info.org_id!r} revoked")


@token.command("list")
@click.option("--org", "org_id", default=None, help="Only this org's tokens.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per token.")
@friendly_errors
def token_list(org_id: str | None, as_json: bool) -> None:
    """List tokens (id, org, name, first characters, created, revoked, admin); never secrets."""
    import psycopg

    from jobsd.http.tokens import list_tokens
    from jobsd.store.db import db_errors

    url = _database_url()
    with db_errors("token listing"), psycopg.connect(url, autocommit=True) as conn:
        infos = list_tokens(conn, org_id)
    for info in infos:
        if as_json:
            click.echo(
                json.dumps(
                    {
                        "id": str(info.id),
                        "org_id": info.org_id,
                        "name": info.name,
                        "prefix": info.prefix,
                        "created_at": info.created_at.isoformat(),
                        "revoked_at": info.revoked_at.isoformat() if info.revoked_at else None,
                        "admin": info.admin,
                    }
                )
            )
            continue
        state = f"revoked {info.revoked_at:%Y-%m-%d %H:%M}" if info.revoked_at else "active"
        click.echo(
            f"{info.id}  {info.org_id}  {info.prefix}…  {info.name or '-'}  "
            f"{info.created_at:%Y-%m-%d %H:%M}  {state}  {'admin' if info.admin else '-'}"
        )


def register(main: click.Group) -> None:
    """Attach ``api`` and ``token`` to the ``jobsd`` command group."""
    main.add_command(api)
    main.add_command(token)
