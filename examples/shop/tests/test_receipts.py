"""The ``send_receipt`` handler, run as the daemon runs it."""

from __future__ import annotations

import jobsd
import pytest
from jobsd.testing import JobsdWorker

from shop import mailer


def test_send_receipt_mails_the_order_to_the_customer(
    jobsd_worker: JobsdWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[str, str, str]] = []

    def send(to: str, subject: str, body: str) -> str:
        sent.append((to, subject, body))
        return "msg-1"

    monkeypatch.setattr(mailer, "send", send)
    jobsd.enqueue_sync(
        "send_receipt",
        {"order_id": "A17", "email": "ada@example.com", "items": ["tea", "scones"]},
        org_id="shop",
    )

    [receipt] = jobsd_worker.drain()

    assert receipt.status == "succeeded"
    assert receipt.result == {"message_id": "msg-1"}
    [(to, subject, body)] = sent
    assert to == "ada@example.com"
    assert subject == "Your receipt for order A17"
    assert "- tea\n- scones\n" in body
