"""A property-based run of every operation against a real server finds no 500.

The committed schema itself is checked in tests/unit/test_openapi_contract.py.
"""

from __future__ import annotations

import os
import time
from functools import partial
from typing import Any

import pytest
import schemathesis
from anyio.from_thread import start_blocking_portal
from apikit import bearer, http_settings, settings_for
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from jobsd.http.openapi import openapi_schema
from jobsd.http.server import serve

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
# bounded for CI; raise it for a deeper local hunt
EXAMPLES_PER_OPERATION = int(os.environ.get("JOBSD_TEST_API_EXAMPLES", "25"))


@pytest.mark.slow
@pytest.mark.heavy
def test_property_based_run_finds_no_server_error(db_url: str, token_a: str) -> None:
    """Every operation, valid and invalid inputs, against a real server and database."""
    schema = schemathesis.openapi.from_dict(openapi_schema())
    http = http_settings(longpoll_max=0.2, ready_timeout=2.0)
    started = time.monotonic()
    calls = 0
    with start_blocking_portal(backend="asyncio") as portal:
        future, (host, port) = portal.start_task(partial(serve, settings_for(db_url), http))
        base_url = f"http://{host}:{port}"
        try:
            for result in schema.get_all_operations():
                assert isinstance(result, Ok), result
                operation = result.ok()
                for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

                    @given(case=operation.as_strategy(generation_mode=mode))
                    @settings(
                        max_examples=EXAMPLES_PER_OPERATION,
                        deadline=None,
                        database=None,
                        phases=[Phase.generate, Phase.shrink],
                        suppress_health_check=list(HealthCheck),
                    )
                    def run(case: Any) -> None:
                        nonlocal calls
                        calls += 1
                        response = case.call(base_url=base_url, headers=bearer(token_a))
                        case.validate_response(response, checks=CHECKS)

                    try:
                        run()
                    except Unsatisfiable:
                        # no invalid input exists for an operation without inputs
                        assert mode is GenerationMode.NEGATIVE
        finally:
            future.cancel()
    took = time.monotonic() - started
    print(f"schemathesis: {calls} calls in {took:.1f} s")
    if EXAMPLES_PER_OPERATION <= 25:
        assert took < 60
