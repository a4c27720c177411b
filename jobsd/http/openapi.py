"""Print the API's OpenAPI schema: ``python -m jobsd.http.openapi > docs/openapi.json``.

``docs/openapi.json`` is committed; a test fails when it drifts from the code.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from jobsd.http.app import create_app
from jobsd.http.settings import HttpSettings
from jobsd.settings import Settings

__all__ = ["openapi_schema", "render"]


def openapi_schema() -> dict[str, Any]:
    """Return the schema of the app built with default settings (no database needed)."""
    app = create_app(Settings(database_url=None), HttpSettings(http_addr=None))
    return app.openapi()


def render(schema: dict[str, Any]) -> str:
    """Return the schema as the committed file holds it."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def main() -> None:
    """Write the schema to stdout."""
    sys.stdout.write(render(openapi_schema()))


if __name__ == "__main__":
    main()
