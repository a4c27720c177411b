"""The ``send_receipt`` handler, run as the daemon runs it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from jobsd.testing import JobsdWorker

from shop import mailer
from shop.jobs import Receipt, send_receipt


def test_send_receipt_mails_the_order_to_the_customer(
    jobsd_worker: JobsdWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[str, str, str]] = []

    def send(to: str, subject: str, body: str) -> str:
        sent.append((to, subject, body))
        return "msg-1"

    monkeypatch.setattr(mailer, "send", send)
    order_id = uuid.UUID("0193a5c0-0000-7000-8000-000000000017")
    send_receipt.enqueue_sync(
        Receipt(
            order_id=order_id,
            email="ada@example.com",
            items=["tea", "scones"],
            ordered_at=datetime(2026, 12, 7, 9, 30, tzinfo=UTC),
        ),
        org_id="shop",
    )

    [receipt] = jobsd_worker.drain()

    assert receipt.status == "succeeded"
    assert receipt.result == {"message_id": "msg-1"}
    [(to, subject, body)] = sent
    assert to == "ada@example.com"
    assert subject == f"Your receipt for order {order_id}"
    assert "of 07 December 2026:\n- tea\n- scones\n" in body
