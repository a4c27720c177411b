"""``jobsd api``: serve the HTTP API alone (no workers)."""

from __future__ import annotations

import click

from jobsd.cli.common import check_url, require_url
from jobsd.cli.errors import friendly_errors

__all__ = ["api"]


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
    from jobsd.http.preflight import check_api
    from jobsd.http.server import run_api
    from jobsd.http.settings import HttpSettings
    from jobsd.logs import setup_logging
    from jobsd.settings import Settings

    settings = Settings()
    require_url(settings)
    http = HttpSettings(http_addr=addr)
    setup_logging(settings.log_level, settings.log_format)
    check_api(settings, http, check_url=check_url)  # a refusal is the first word
    run_api(settings, http)
