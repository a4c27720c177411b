"""``POST /orders``: the order is taken and its receipt enqueued."""

from __future__ import annotations

from unittest import mock

from fastapi.testclient import TestClient
from jobsd.testing import JobsdDB

from shop.app import app


def test_post_orders_enqueues_the_receipt(jobsd_db: JobsdDB) -> None:
    with TestClient(app) as client:
        response = client.post("/orders", json={"email": "ada@example.com", "items": ["tea"]})

    assert response.status_code == 201
    order_id = response.json()["order_id"]
    jobsd_db.assert_enqueued(
        "send_receipt",
        {"order_id": order_id, "email": "ada@example.com", "ordered_at": mock.ANY},
        org_id="shop",
        dedup_key=f"receipt:{order_id}",
    )
