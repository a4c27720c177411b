"""The libraries each optional extra of jobsd brings (pyproject.toml), by import name."""

from __future__ import annotations

from importlib.util import find_spec

__all__ = ["SERVER_LIBRARIES", "missing_server_libraries"]

# jobsd[server]: the daemon, the command line, the HTTP API and the dashboard
SERVER_LIBRARIES = (
    "anyio",
    "click",
    "cronsim",
    "fastapi",
    "jinja2",
    "prometheus_client",
    "rich",
    "tenacity",
    "uvicorn",
)


def missing_server_libraries() -> list[str]:
    """Return the libraries of the ``server`` extra that are not installed."""
    return [name for name in SERVER_LIBRARIES if find_spec(name) is None]
