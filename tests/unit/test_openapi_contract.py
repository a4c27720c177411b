"""The OpenAPI schema: the committed file matches the code, every answer is declared.

Regenerate the file with ``uv run python -m jobsd.http.openapi > docs/openapi.json``.
A property-based run against a real server is in tests/http/test_http_openapi.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from jobsd.http.openapi import openapi_schema, render

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def _declared(prefix: str = "") -> dict[tuple[str, str], set[str]]:
    """Return the declared status codes of each (method, path) under ``prefix``."""
    paths = openapi_schema()["paths"]
    return {
        (method.upper(), path): set(op["responses"])
        for path, ops in paths.items()
        for method, op in ops.items()
        if path.startswith(prefix)
    }


def test_committed_openapi_matches_the_code() -> None:
    current = openapi_schema()
    committed = json.loads(COMMITTED.read_text(encoding="utf-8"))
    assert committed == current, (
        "docs/openapi.json is stale: run `uv run python -m jobsd.http.openapi > docs/openapi.json`"
    )
    assert COMMITTED.read_text(encoding="utf-8") == render(current)


def test_every_documented_answer_is_declared() -> None:
    declared = _declared()
    assert declared[("POST", "/jobs")] == {"202", "401", "409", "413", "422", "429", "503"}
    assert declared[("GET", "/jobs")] == {"200", "401", "422", "429", "503"}
    assert declared[("GET", "/jobs/{job_id}")] == {"200", "401", "404", "422", "429", "503"}
    assert declared[("POST", "/jobs/{job_id}/cancel")] == {
        "200",
        "202",
        "401",
        "404",
        "409",
        "422",
        "503",
    }
    for probe in ("/healthz", "/readyz", "/health"):
        assert declared[("GET", probe)] == {"200", "503"}
    assert declared[("GET", "/metrics")] == {"200"}


def test_every_queue_answer_is_declared() -> None:
    declared = _declared("/queues")
    assert declared == {
        ("GET", "/queues"): {"200", "401", "403", "503"},
        ("POST", "/queues"): {"201", "401", "403", "409", "422", "503"},
        ("GET", "/queues/{name}"): {"200", "401", "403", "404", "422", "503"},
        ("PATCH", "/queues/{name}"): {"200", "401", "403", "404", "422", "503"},
        ("POST", "/queues/{name}/pause"): {"200", "401", "403", "404", "422", "503"},
        ("POST", "/queues/{name}/resume"): {"200", "401", "403", "404", "422", "503"},
        # dropping is the owner's, on the command line: the API always answers 403
        ("DELETE", "/queues/{name}"): {"200", "401", "403", "422", "503"},
    }


def test_every_bulk_answer_is_declared() -> None:
    declared = _declared()
    # a bulk retry submits jobs: the submission rate may answer 429
    assert declared[("POST", "/jobs/retry")] == {"200", "401", "422", "429", "503"}
    assert declared[("POST", "/jobs/cancel")] == {"200", "401", "422", "503"}
    assert declared[("POST", "/jobs/resolve")] == {"200", "401", "422", "503"}
