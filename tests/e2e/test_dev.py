"""``jobsd dev``: a throwaway Postgres, the example handlers, and a clean exit."""

from __future__ import annotations

import re
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import psycopg
import pytest
from support.history import assert_history_complete

from .conftest import Proc, make_env, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_dev_runs_on_a_throwaway_postgres_and_removes_it_on_ctrl_c(
    spawn: Callable[..., Proc], shared_tmp: Path
) -> None:
    # no JOBSD_DATABASE_URL: dev starts its own cluster, under TMPDIR
    env = make_env(None, TMPDIR=str(shared_tmp))
    env.pop("JOBSD_HANDLERS")  # dev loads the example handlers by default
    env.pop("JOBSD_ALLOW_INSECURE", None)  # as a new user runs it: nothing but the command
    # no example feeder here: the history check below needs jobs that stand still
    dev = spawn("dev", "--no-examples", env=env)
    url = dev.wait_for(r"^\s+(postgresql://\S+)$", timeout_s=90).group(1)
    dev.wait_for(r"Stop with Ctrl-C")
    # the dashboard: its address and an admin token that logs in
    dashboard = dev.wait_for(r"^Dashboard: (http://\S+)/ui$").group(1)
    login_token = dev.wait_for(r"^\s+(jobsd_[A-Za-z0-9_-]{43})$").group(1)
    with httpx.Client(base_url=dashboard, trust_env=False) as browser:
        answer = browser.post("/ui/login", data={"token": login_token})
        assert answer.status_code == 303, answer.text
        overview = browser.get("/ui")
        assert overview.status_code == 200 and "Recent failures" in overview.text
    assert [p.name for p in shared_tmp.iterdir()], "the cluster lives under TMPDIR"

    client_env = make_env(url)
    done = run_cli("enqueue", "noop", "--org", "demo", "--wait", env=client_env)
    assert done.returncode == 0, done.stderr
    job_id = uuid.UUID(done.stdout.strip())
    imported = run_cli(
        "enqueue",
        "import_csv",
        "--org",
        "demo",
        "--payload",
        '{"rows": 300, "delay_s": 0.01}',
        "--wait",
        env=client_env,
    )
    assert imported.returncode == 0, imported.stderr
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT status, report FROM jobsd.jobs WHERE id = %s",
            (uuid.UUID(imported.stdout.strip()),),
        ).fetchone()
        assert row == (
            "succeeded",
            {
                "read": 300,
                "inserted": 300,
                "ignored": 0,
                "errors": 0,
                "resumed_from": 0,
                "attempt": 1,
            },
        )
        assert conn.execute(
            "SELECT status FROM jobsd.jobs WHERE id = %s", (job_id,)
        ).fetchone() == ("succeeded",)
        assert_history_complete(conn)

    dev.send(signal.SIGINT)
    assert dev.wait(30) == 0
    assert "Traceback" not in dev.text()
    assert list(shared_tmp.iterdir()) == [], "the throwaway cluster's directory is gone"
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=2).close()


@pytest.mark.heavy
def test_dev_overview_shows_the_example_jobs_flowing(
    spawn: Callable[..., Proc], shared_tmp: Path
) -> None:
    # as the README's first command runs it: the example feeder on, nothing configured
    env = make_env(None, TMPDIR=str(shared_tmp))
    env.pop("JOBSD_HANDLERS")
    env.pop("JOBSD_ALLOW_INSECURE", None)
    dev = spawn("dev", env=env)
    dashboard = dev.wait_for(r"^Dashboard: (http://\S+)/ui$", timeout_s=90).group(1)
    login_token = dev.wait_for(r"^\s+(jobsd_[A-Za-z0-9_-]{43})$").group(1)
    dev.wait_for(r"Stop with Ctrl-C")
    succeeded = re.compile(r'<tr data-queue="default">.*?<td class="num ok">(\d+)</td>', re.S)
    seen: list[int] = []
    with httpx.Client(base_url=dashboard, trust_env=False) as browser:
        assert browser.post("/ui/login", data={"token": login_token}).status_code == 303
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            page = browser.get("/ui")
            assert page.status_code == 200, page.text
            found = succeeded.search(page.text)
            assert found is not None, "the overview shows the default queue"
            seen.append(int(found.group(1)))
            if len(set(seen)) >= 3 and seen[-1] > seen[0]:
                break
            time.sleep(0.5)  # a person reloading the page, not a synchronization
    # the count of succeeded jobs in the last hour rose while we watched
    assert len(set(seen)) >= 3 and seen[-1] > seen[0], seen
    dev.send(signal.SIGINT)
    assert dev.wait(30) == 0
    assert "Traceback" not in dev.text()
