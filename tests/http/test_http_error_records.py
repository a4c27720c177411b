"""One job whose handler raised three times under its retry policy, read through every
door: the client, GET /jobs/{id}, `jobsd status` and the dashboard's job page each show
its three error records, most recent first, the tracebacks as lines of text."""

from __future__ import annotations

import json
import re
import uuid
from datetime import datetime

import anyio
import pytest
from apikit import bearer, running_api, running_daemon, settings_for, ui_login, wait_until
from click.testing import CliRunner
from markupsafe import escape

import jobsd
from jobsd.cli.app import main as jobsd_main
from jobsd.models import Job
from jobsd.registry import Registry

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def failing_registry() -> Registry:
    registry = Registry()

    @jobsd.handler(
        "fetch",
        retry=jobsd.RetryPolicy(3, backoff=0.0, retry_on=(ConnectionError,)),
        registry=registry,
    )
    async def fetch(ctx: jobsd.JobContext) -> None:
        step(ctx.attempt)

    return registry


def step(attempt: int) -> None:
    """A frame of its own, so each traceback has several lines."""
    raise ConnectionResetError(f"reset at attempt {attempt}")


async def failed_three_times(db_url: str) -> Job:
    """Run the job to its end in a daemon; return it as the client reads it."""
    async with jobsd.Client(db_url) as client:
        async with running_daemon(settings_for(db_url, poll_interval=0.1), failing_registry()):
            made = await client.enqueue("fetch", {"url": "https://example.com"}, org_id="acme")

            async def ended() -> bool:
                return (await client.get(made.id)).status == "failed"

            await wait_until(ended, what="the job's third failure", timeout_s=20)
        return await client.get(made.id)


async def test_three_failed_attempts_through_every_door(
    db_url: str, token_a: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = await failed_three_times(db_url)
    # the client
    assert job.attempts == 3
    assert [(e.attempt, e.cause, e.type) for e in job.errors] == [
        (n, "handler error", "builtins.ConnectionResetError") for n in (3, 2, 1)
    ]
    tracebacks = [e.traceback for e in job.errors]
    assert all(t and "in step" in t and t.count("\n") >= 5 for t in tracebacks), tracebacks
    with jobsd.SyncClient(db_url) as sync:
        assert sync.get(job.id).errors == job.errors

    async with running_api(settings_for(db_url)) as api:
        # GET /jobs/{id}
        answer = await api.client.get(f"/jobs/{job.id}", headers=bearer(token_a))
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert [{**e, "at": datetime.fromisoformat(e["at"])} for e in body["errors"]] == [
            {**e.to_json(), "at": e.at} for e in job.errors
        ]
        assert [e["attempt"] for e in body["errors"]] == [3, 2, 1]
        assert [e["traceback"] for e in body["errors"]] == tracebacks
        assert {tuple(sorted(e)) for e in body["errors"]} == {
            ("at", "attempt", "cause", "message", "traceback", "type")
        }
        assert body["error"] == "ConnectionResetError: reset at attempt 3"

        # the dashboard's job page
        await ui_login(api.client, token_a)
        page = await api.client.get(f"/ui/jobs/{job.id}")
        assert page.status_code == 200, page.text
        shown = page.text
    blocks = re.findall(r'<li class="attempt-error" data-attempt="(\d+)">(.*?)</li>', shown, re.S)
    assert [int(n) for n, _ in blocks] == [3, 2, 1]
    for (_, block), record in zip(blocks, job.errors, strict=True):
        assert record.traceback is not None
        # the traceback as text: its newlines real, nothing escaped but HTML
        assert f'<pre class="traceback">{escape(record.traceback)}</pre>' in block
        assert "handler error" in block and "builtins.ConnectionResetError" in block
        assert escape(record.message) in block
    # the report's own traceback is text too, and out of the report's JSON
    assert f'id="report-traceback">{escape(tracebacks[0] or "")}</pre>' in shown
    report_json = re.search(r'<h2>Report</h2>\s*<pre class="json">(.*?)</pre>', shown, re.S)
    assert report_json and "traceback" not in report_json.group(1)
    assert "\\n" not in shown.split('<h2 id="errors">')[1].split("<h2>Payload</h2>")[0]

    # jobsd status, and --json
    monkeypatch.setenv("JOBSD_DATABASE_URL", db_url)
    monkeypatch.delenv("JOBSD_TOKEN", raising=False)
    text = await anyio.to_thread.run_sync(status, str(job.id))
    lines = [line.strip() for line in text.splitlines()]
    heads = [line for line in lines if line.startswith("attempt ")]
    assert [h.split()[1] for h in heads] == ["3", "2", "1"], text
    assert all("handler error" in h and "builtins.ConnectionResetError" in h for h in heads)
    position = 0
    for record in job.errors:
        assert record.traceback is not None
        for line in record.traceback.rstrip("\n").splitlines():
            # each line of each traceback is a line of the output, in order
            position = lines.index(line.strip(), position) + 1
    assert "\\n" not in text, "no escaped newline anywhere"
    shown_json = json.loads(await anyio.to_thread.run_sync(status, str(job.id), "--json"))
    assert shown_json["errors"] == [e.to_json() for e in job.errors]


def status(*args: str) -> str:
    result = CliRunner().invoke(jobsd_main, ["status", *args])
    assert result.exit_code == 0, result.output
    return result.stdout


async def test_a_job_without_errors_has_an_empty_list(db_url: str, token_a: str) -> None:
    async with jobsd.Client(db_url) as client:
        job = await client.enqueue("nothing", {}, org_id="acme")
    async with running_api(settings_for(db_url)) as api:
        answer = await api.client.get(f"/jobs/{job.id}", headers=bearer(token_a))
        assert answer.status_code == 200 and answer.json()["errors"] == []
        missing = await api.client.get(f"/jobs/{uuid.uuid4()}", headers=bearer(token_a))
        assert missing.status_code == 404
