"""The dashboard's bulk actions: the jobs page filtered by a state offers "Retry all N
matching" (cancel, resolve), the form carries the filter and the CSRF token, and the
answer is the summary; an org's session acts on its own jobs only."""

from __future__ import annotations

import html
import re
from typing import Any

import psycopg
import pytest
from apikit import running_api, settings_for
from support.jobs import make_job, make_jobs
from test_ui import admin_token, csrf_of, login

pytestmark = pytest.mark.anyio

CLAIM = {"attempts": 1, "worker_id": "w1"}


def offer(page: str) -> dict[str, Any] | None:
    """Return the bulk form of a jobs page: its action, question, fields and buttons."""
    found = re.search(
        r'<form method="post" action="(/ui/bulk/\w+)" data-confirm="([^"]*)">(.*?)</form>',
        page,
        re.S,
    )
    if found is None:
        return None
    body = found.group(3)
    fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', body))
    buttons = [html.unescape(b) for b in re.findall(r"<button[^>]*>([^<]*)</button>", body)]
    return {
        "action": found.group(1),
        "question": html.unescape(found.group(2)),
        "fields": fields,
        "buttons": buttons,
    }


async def test_an_operator_retries_every_failed_job_of_the_list(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        failed = make_jobs(conn, 3, status="failed", type="mail", claim=CLAIM)
        make_job(conn, status="failed", type="other", claim=CLAIM)
        make_job(conn, status="succeeded", type="mail", claim=CLAIM)
        async with running_api(settings_for(db_url)) as api:
            csrf = await login(api.client, admin_token(db_url))
            # no state, or one no action applies to: nothing offered
            # nor for a filter no action can take (an unknown queue, an empty time range)
            empty = "?status=failed&since=2030-01-02T00:00&until=2030-01-01T00:00"
            for query in ("", "?status=succeeded&type=mail", "?status=failed&queue=nope", empty):
                page = await api.client.get(f"/ui/jobs{query}")
                assert page.status_code == 200 and offer(page.text) is None
            page = await api.client.get("/ui/jobs?status=failed&type=mail&queue=")
            form = offer(page.text)
            assert form is not None, page.text
            assert form["action"] == "/ui/bulk/retry"
            assert form["buttons"] == ["Retry all 3 matching"]
            assert form["question"].startswith("Retry 3 jobs?")
            assert form["fields"] == {"csrf": csrf, "status": "failed", "type": "mail"}

            done = await api.client.post("/ui/bulk/retry", data=form["fields"])
            assert done.status_code == 200, done.text
            assert "3 matched, 3 retried, 0 still match" in done.text
            assert 'href="/ui/jobs?status=failed&amp;type=mail"' in done.text
            made = conn.execute(
                "SELECT retry_of FROM jobsd.jobs WHERE retry_of IS NOT NULL"
            ).fetchall()
            assert {r[0] for r in made} == set(failed)
            actor = conn.execute(
                "SELECT worker_id "
                "FROM jobsd.all_job_events WHERE job_id = %s ORDER BY id DESC LIMIT 1",
                (failed[0],),
            ).fetchone()[0]
            assert re.fullmatch(r"ui:operator:[0-9a-f]{8} \(bulk \d+\)", actor), actor
            # done: the page offers nothing more
            again = await api.client.get("/ui/jobs?status=failed&type=mail")
            assert offer(again.text) is None

            # without the CSRF token nothing happens
            refused = await api.client.post("/ui/bulk/cancel", data={"status": "queued"})
            assert refused.status_code == 403
            assert conn.execute(
                "SELECT count(*) FROM jobsd.jobs WHERE status = 'queued'"
            ).fetchone() == (3,)


async def test_cancel_and_resolve_are_offered_for_their_states(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        make_jobs(conn, 2, status="running", claim=CLAIM)
        stuck = make_jobs(conn, 2, status="recovery_required", claim=CLAIM)
        async with running_api(settings_for(db_url)) as api:
            await login(api.client, admin_token(db_url))
            form = offer((await api.client.get("/ui/jobs?status=running")).text)
            assert form is not None and form["buttons"] == ["Cancel all 2 matching"]
            done = await api.client.post(form["action"], data=form["fields"])
            assert "2 matched, 2 cancelled (2 running: cancel requested)" in done.text

            form = offer((await api.client.get("/ui/jobs?status=recovery_required")).text)
            assert form is not None and form["action"] == "/ui/bulk/resolve"
            assert form["buttons"] == [
                f"Resolve all 2 matching as {how}" for how in ("succeeded", "failed", "requeue")
            ]
            done = await api.client.post(
                form["action"], data={**form["fields"], "outcome": "failed"}
            )
            assert "2 matched, 2 resolved, 0 still match" in done.text, done.text
            rows = conn.execute("SELECT status FROM jobsd.jobs WHERE id = ANY(%s)", (stuck,))
            assert {r[0] for r in rows} == {"failed"}

            # bad input: a page saying why, nothing done
            csrf = form["fields"]["csrf"]
            wrong = await api.client.post("/ui/bulk/retry", data={"csrf": csrf, "status": "queued"})
            assert wrong.status_code == 400 and "bulk retry takes jobs in a state of" in wrong.text
            how = await api.client.post(
                "/ui/bulk/resolve",
                data={"csrf": csrf, "status": "recovery_required", "outcome": "maybe"},
            )
            assert how.status_code == 400 and "resolve as succeeded, failed" in how.text
            queue = await api.client.post(
                "/ui/bulk/cancel", data={"csrf": csrf, "status": "running", "queue": "nope"}
            )
            assert queue.status_code == 400 and "unknown queue" in html.unescape(queue.text)
            unknown = await api.client.post("/ui/bulk/delete", data={"csrf": csrf})
            assert unknown.status_code == 404


async def test_an_orgs_session_acts_on_its_own_jobs_only(db_url: str, token_a: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        mine = make_jobs(conn, 2, status="failed", org_id="acme", claim=CLAIM)
        theirs = make_jobs(conn, 3, status="failed", org_id="globex", claim=CLAIM)
        async with running_api(settings_for(db_url)) as api:
            csrf = await login(api.client, token_a)
            page = await api.client.get("/ui/jobs?status=failed")
            form = offer(page.text)
            assert form is not None and form["buttons"] == ["Retry all 2 matching"]
            assert 'name="org"' not in page.text  # the org filter is an operator's
            # a forged org field changes nothing: another org matches nothing
            forged = await api.client.post(
                "/ui/bulk/retry", data={"csrf": csrf, "status": "failed", "org": "globex"}
            )
            assert forged.status_code == 200 and "0 matched, 0 retried" in forged.text
            done = await api.client.post("/ui/bulk/retry", data=form["fields"])
            assert "2 matched, 2 retried" in done.text
            rows = conn.execute("SELECT retry_of FROM jobsd.jobs WHERE retry_of IS NOT NULL")
            retried = {r[0] for r in rows}
            assert retried == set(mine) and retried.isdisjoint(theirs)
            assert csrf_of(done.text) == csrf
