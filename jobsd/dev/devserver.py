"""``jobsd dev``: jobsd for real on a throwaway Postgres, with the example handlers.

With ``JOBSD_DATABASE_URL`` unset, an embedded cluster is started in a temporary
directory (removed at exit), migrated, and a daemon runs against it with the handlers
of ``examples/``. Short rescue times make a kill-and-resume visible in seconds.
"""

from __future__ import annotations

import os

import click

from jobsd.settings import Settings

__all__ = ["EXAMPLES_MODULE", "run_dev"]

# the example handlers, shipped in the package so a wheel's `jobsd dev` has them too
EXAMPLES_MODULE = "jobsd.dev.examples"


def run_dev(*, slots: int | None = None, examples: bool = True) -> None:
    """Start (or reuse) a database, migrate it, and run a daemon until SIGTERM/SIGINT.

    The daemon serves the API and the dashboard (``JOBSD_HTTP_ADDR``, 127.0.0.1:8080 or
    a free port when unset); with ``examples`` a thread enqueues example jobs now and then.
    """
    from jobsd.dev.demo import (
        ExampleFeeder,
        dashboard_addr,
        dashboard_token,
        dashboard_url,
        revoke_dashboard_token,
    )
    from jobsd.dev.embedded import EmbeddedPostgres
    from jobsd.http.settings import HttpSettings
    from jobsd.logs import setup_logging
    from jobsd.store.connect import check_url, trust_local_cluster
    from jobsd.store.migrate import migrate_sync
    from jobsd.worker.supervisor import run_daemon

    defaults = {"JOBSD_STALE_AFTER": "30", "JOBSD_SWEEP_INTERVAL": "10"}
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    settings = Settings()
    handlers = settings.handlers or [EXAMPLES_MODULE]
    addr = dashboard_addr()
    ui = HttpSettings().ui
    feeder: ExampleFeeder | None = None
    token: str | None = None
    cluster: EmbeddedPostgres | None = None
    url = settings.database_url
    if not url:
        cluster = EmbeddedPostgres()
        cluster.start()
        url = cluster.url()
        trust_local_cluster(url)  # local (127.0.0.1) and throwaway: no TLS asked for
        # its only role is the superuser that initdb made: the API inside this daemon
        # may serve as it (a warning says so), which a real deployment refuses
        os.environ["JOBSD_ALLOW_INSECURE"] = "1"
    try:
        setup_logging(settings.log_level, settings.log_format)
        check_url(url)
        migrate_sync(url)
        settings = settings.model_copy(
            update={"database_url": url, "handlers": handlers, "slots": slots or settings.slots}
        )

        token = dashboard_token(url) if ui else None
        if examples:
            feeder = ExampleFeeder(url)

        def say_ready() -> None:
            click.echo(_banner(url, cluster is not None), err=True)
            if token is not None:
                click.echo(_dashboard(dashboard_url(addr), token), err=True)
            if feeder is not None:
                feeder.start()

        run_daemon(settings, on_ready=say_ready)
    finally:
        if feeder is not None:
            feeder.stop()
        if token is not None and cluster is None:  # your database: leave no live token
            revoke_dashboard_token(url, token)
        if cluster is not None:
            cluster.cleanup()


def _banner(url: str, embedded: bool) -> str:
    where = "a throwaway Postgres (deleted when this stops)" if embedded else "your database"
    return f"""
jobsd dev is running on {where}:
    {url}

In another terminal (prefix the commands with `uv run` in a checkout):
    export JOBSD_DATABASE_URL='{url}' JOBSD_ALLOW_INSECURE=1
    jobsd enqueue import_csv --org demo --payload '{{"rows": 3000}}' --wait
    jobsd enqueue always_fails --org demo --wait
    jobsd status <id printed by enqueue>

To see a crashed import resume from its checkpoint, run a second daemon on the same
database, kill -9 it mid-import, and watch this one rescue the job within
JOBSD_STALE_AFTER (30 s here) and finish it from where the dead one stopped:
    JOBSD_HANDLERS={EXAMPLES_MODULE} jobsd run

Stop with Ctrl-C.
"""


def _dashboard(url: str, token: str) -> str:
    return f"""Dashboard: {url}
    log in with this admin token (an operator's: every org; revoked when this stops):
    {token}
"""
