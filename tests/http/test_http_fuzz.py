"""A hypothesis fuzz of the HTTP API (issue 12): bodies, headers, content types, unicode
and nesting depth. No answer is a 5xx, and a refused submission creates no row.

The API runs in a portal thread (in-process, httpx ASGI); each example is one request,
and the jobs table is counted before and after it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from typing import Any

import anyio
import anyio.from_thread
import httpx
import psycopg
import pytest
from apikit import http_settings, make_token, running_api, settings_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.timeout(120)

ODD = ["\x00", "\ud800", "\u202e", "😀", "\ufeff", "é", "'; --", "%s", "\\u0000", " "]
text = st.one_of(st.sampled_from(ODD), st.text(max_size=30))
leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), text)
value = st.recursive(
    leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3)
)


def _deep(depth: int, kind: str) -> str:
    """A JSON text nested ``depth`` deep, as an object's payload."""
    opening, closing = ("[", "]") if kind == "list" else ('{"a":', "}")
    return '{"type": "t", "payload": {"x": ' + opening * depth + "1" + closing * depth + "}}"


body = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=300).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.fixed_dictionaries(
        {"type": text}, optional={"payload": value, "queue": text, "dedup_key": text}
    ).map(lambda d: json.dumps(d).encode()),
    st.builds(_deep, st.integers(1, 3000), st.sampled_from(["list", "dict"])).map(str.encode),
)
content_type = st.sampled_from(
    [
        "application/json",
        "application/json; charset=latin-1",
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "",
        "application/json; charset=\u00ff",
    ]
)
header_value = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
    max_size=60,
)
request = st.fixed_dictionaries(
    {
        "method": st.sampled_from(["POST /jobs", "GET /jobs", "GET /jobs/{id}", "POST cancel"]),
        "body": body,
        "content_type": content_type,
        "extra": st.dictionaries(
            st.sampled_from(["X-Request-Id", "Accept", "Accept-Charset", "Content-Encoding"]),
            header_value,
            max_size=2,
        ),
        "job": st.one_of(st.uuids().map(str), text),
        "wait": st.one_of(st.none(), st.sampled_from(["0", "-1", "nan", "1e309", "x", "0.01"])),
    }
)


@asynccontextmanager
async def _client(db_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with running_api(settings_for(db_url), http_settings(longpoll_max=0.05)) as api:
        yield api.client


@contextmanager
def _api(db_url: str) -> Iterator[tuple[anyio.from_thread.BlockingPortal, httpx.AsyncClient]]:
    with (
        anyio.from_thread.start_blocking_portal() as portal,
        portal.wrap_async_context_manager(_client(db_url)) as client,
    ):
        yield portal, client


def _count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM jobsd.jobs").fetchone()
    assert row is not None
    return int(row[0])


def test_fuzzed_requests_never_answer_5xx_nor_leave_a_row_when_refused(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    token = make_token(db_url, "acme")
    seen: dict[int, int] = {}
    with _api(db_url) as (portal, client):

        @settings(
            max_examples=150,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            derandomize=True,
        )
        @given(request)
        def one(req: dict[str, Any]) -> None:
            headers = {"Authorization": f"Bearer {token}", **req["extra"]}
            if req["content_type"]:
                headers["Content-Type"] = req["content_type"]
            job = req["job"]
            params = {"wait": req["wait"]} if req["wait"] is not None else {}
            method, _, path = req["method"].partition(" ")
            if path == "cancel":
                method, path = "POST", f"/jobs/{job}/cancel"
            path = path.replace("{id}", job)
            before = _count(conn)
            try:
                r = portal.call(
                    partial(
                        client.request,
                        method,
                        path,
                        content=req["body"],
                        headers=headers,
                        params=params,
                    )
                )
            except (httpx.InvalidURL, UnicodeEncodeError, httpx.LocalProtocolError):
                return  # the client refused to send it: nothing reached the server
            seen[r.status_code] = seen.get(r.status_code, 0) + 1
            assert r.status_code < 500, (r.status_code, r.text[:300])
            created = _count(conn) - before
            if r.status_code == 202:
                assert created <= 1
                uuid.UUID(r.json()["id"])
            else:
                assert created == 0, (r.status_code, r.text[:300])

        one()
    # the fuzz reached the handlers, not only the validators
    assert seen.get(422, 0) > 0 and (seen.get(202, 0) + seen.get(200, 0) + seen.get(404, 0)) > 0
