"""``jobsd token create|revoke|list``: the HTTP API's bearer tokens."""

from __future__ import annotations

import json

import click

from jobsd.cli.common import load_settings, operator, require_url
from jobsd.cli.errors import fail, friendly_errors

__all__ = ["token"]


@click.group()
def token() -> None:
    """Manage the HTTP API's bearer tokens (one or more per org)."""


@token.command("create")
@click.option("--org", "org_id", default=None, help="The org the token acts for.")
@click.option(
    "--admin",
    is_flag=True,
    help="An operator's token, of no org: it administers queues (/queues, every org's) "
    "and acts for no org (leave --org out).",
)
@click.option("--name", default=None, help="A label, e.g. who or what uses the token.")
@friendly_errors
def token_create(org_id: str | None, admin: bool, name: str | None) -> None:
    """Make a token and print it alone on stdout, once: only its hash is stored."""
    from jobsd.cli.common import connect
    from jobsd.ops.tokens import create_token

    if admin and org_id is not None:
        fail("an admin token belongs to no org: leave --org out (operators only)")
    if not admin and (org_id is None or not org_id.strip()):
        fail("--org is required (and must not be empty), or --admin for an operator token")
    url = require_url(load_settings())
    with connect(url, application_name="jobsd-token", operation="token creation") as conn:
        secret, info = create_token(conn, operator(), org_id, name, admin=admin)
    click.echo(secret)
    whom = "for operators (no org)" if info.org_id is None else f"for org {info.org_id!r}"
    kind = "admin token" if info.admin else "token"
    click.echo(f"{kind} {info.id} {whom} created; it is shown only now", err=True)


@token.command("revoke")
@click.argument("token_or_id")
@friendly_errors
def token_revoke(token_or_id: str) -> None:
    """Revoke a token, given by its id (see `jobsd token list`) or by the token itself."""
    from jobsd.cli.common import connect
    from jobsd.ops.tokens import revoke_token

    url = require_url(load_settings())
    with connect(url, application_name="jobsd-token", operation="token revocation") as conn:
        info = revoke_token(conn, operator(), token_or_id.strip())
    if info is None:
        fail("no such token")
    whom = "of no org" if info.org_id is None else f"of org {info.org_id!r}"
    click.echo(f"token {info.id} {whom} revoked")


@token.command("list")
@click.option("--org", "org_id", default=None, help="Only this org's tokens.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per token.")
@friendly_errors
def token_list(org_id: str | None, as_json: bool) -> None:
    """List tokens (id, org, name, first characters, created, revoked, admin); never secrets."""
    from jobsd.cli.common import connect
    from jobsd.ops.tokens import list_tokens

    url = require_url(load_settings())
    with connect(url, application_name="jobsd-token", operation="token listing") as conn:
        infos = list_tokens(conn, operator(), org_id)
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
            f"{info.id}  {info.org_id or '-'}  {info.prefix}…  {info.name or '-'}  "
            f"{info.created_at:%Y-%m-%d %H:%M}  {state}  {'admin' if info.admin else '-'}"
        )
