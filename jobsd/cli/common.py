"""What every ``jobsd`` command shares: settings with command-line overrides, the URL."""

from __future__ import annotations

from typing import Any

from jobsd.errors import ConfigError
from jobsd.settings import Settings

__all__ = ["load_settings", "require_url"]


def load_settings(**overrides: Any) -> Settings:
    """Read settings from the environment, with command-line overrides."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})


def require_url(settings: Settings) -> str:
    """Return the database URL, or raise ConfigError saying how to set one."""
    if not settings.database_url:
        raise ConfigError("no database configured: set JOBSD_DATABASE_URL (or use `jobsd dev`)")
    return settings.database_url
