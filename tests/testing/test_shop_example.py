"""The sample project examples/shop: its own tests, with the plugin as a user enables
it, pass, each in well under a second once the session's database exists."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .conftest import REPO_ROOT, TESTING_DIR, run_pytest

SHOP = REPO_ROOT / "examples" / "shop"
BOUND_S = 1.0

pytestmark = pytest.mark.timeout(120)


def test_the_shop_examples_tests_pass_each_under_a_second(admin_url: str, tmp_path: Path) -> None:
    report = tmp_path / "durations.json"
    run = run_pytest(
        ["-p", "durations_report", "tests"],
        cwd=SHOP,
        admin_url=admin_url,
        env={
            "JOBSD_DURATIONS_REPORT": str(report),
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(TESTING_DIR), os.environ.get("PYTHONPATH")])
            ),
        },
        report_dir=tmp_path,
    )

    assert run.returncode == 0, run.output
    assert {name: t.outcome for name, t in run.tests.items()} == {
        "test_send_receipt_mails_the_order_to_the_customer": "passed",
        "test_post_orders_enqueues_the_receipt": "passed",
    }, run.output
    durations = json.loads(report.read_text())
    assert len(durations) == 2
    for nodeid, phases in durations.items():
        # the set-up and the call, the session's database aside (the first test sets it up)
        took_s = phases["setup"] - phases["session_fixtures"] + phases["call"]
        assert took_s < BOUND_S, f"{nodeid} took {took_s:.3f} s: {phases}"


WRONG_CALLS = """
from jobsd import SyncClient

from shop.app import Order
from shop.jobs import Receipt, send_receipt


async def wrong(receipt: Receipt, client: SyncClient) -> None:
    await send_receipt.enqueue(Order(email="ada@example.com", items=["tea"]))  # line 9
    await send_receipt.enqueue(receipt, org_id="shop", priorty=3)  # line 10
    await send_receipt.enqueue(receipt, client=client)  # line 11
"""


def test_mypy_strict_passes_the_shop_and_flags_wrong_calls_of_its_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mypy import api

    monkeypatch.setenv("MYPYPATH", str(SHOP))  # where `import shop` is found
    wrong = tmp_path / "wrong_calls.py"
    wrong.write_text(WRONG_CALLS)
    out, err, status = api.run(
        [
            "--strict",
            "--no-error-summary",
            "--cache-dir",
            str(tmp_path / "mypy_cache"),
            str(SHOP / "shop"),
            str(SHOP / "tests"),
            str(wrong),
        ]
    )
    flagged = sorted({int(line.split(":")[1]) for line in out.splitlines() if ": error:" in line})
    elsewhere = [line for line in out.splitlines() if "wrong_calls.py" not in line]
    assert (status, elsewhere, err) == (1, [], ""), out
    assert flagged == [9, 10, 11], out
